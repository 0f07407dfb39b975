"""optax as its users write it: the loss closes over the batch and the step
function is re-made (and re-jitted) every step; the optimizer is built once
with a schedule, or re-built every step with a new Python-float learning
rate. Each sequence runs with stock, then twice with the cache in verify
mode (``ecosystem_check.check_against_stock``).

Which tier answers (from ``jax_closure_cache.stats()``):
- ``optax.adam``: tier A. Tier B refuses the closure (``fallback_reasons``:
  ``opaque_object``, "a _tuplegetter keeps state the key cannot read"):
  ``scale_by_adam``'s functions read the NamedTuple class
  ``ScaleByAdamState`` as a global, and the key cannot read a NamedTuple
  class (its field descriptors are ``collections._tuplegetter``, a C type).
  So every call traces as stock does; the lowering and executable are
  shared: 0 compiles from the third call.
- ``optax.sgd`` with a constant learning rate: tier B: from the third call
  no trace and no compile.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

optax = pytest.importorskip("optax")

from ecosystem_check import (STEPS, assert_tier_a_answers,  # noqa: E402
                             check_against_stock, compiles, traces)

SIZES = [8, 16, 4]


def _data():
  rng = np.random.default_rng(0)
  params = [(jnp.asarray(rng.standard_normal((m, n)) * 0.3, jnp.float32),
             jnp.zeros(n, jnp.float32))
            for m, n in zip(SIZES[:-1], SIZES[1:])]
  batches = [(jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
              jnp.asarray(rng.standard_normal((8, 4)), jnp.float32))
             for _ in range(4)]
  return params, batches


PARAMS, BATCHES = _data()


def mlp(params, x):
  for w, b in params[:-1]:
    x = jnp.tanh(x @ w + b)
  w, b = params[-1]
  return x @ w + b


def training(optimizer_for_step):
  """A sequence: ``optimizer_for_step(i)`` is the optimizer step ``i`` uses
  (the same object every step, or a new one)."""
  def make_sequence():
    state = {"params": PARAMS,
             "opt_state": optimizer_for_step(0).init(PARAMS)}

    def step(i):
      x, y = BATCHES[i % len(BATCHES)]
      opt = optimizer_for_step(i)

      def loss(p):   # closes over this step's batch
        return jnp.mean((mlp(p, x) - y) ** 2)

      def update(params, opt_state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

      params, opt_state, value = jax.jit(update)(state["params"],
                                                 state["opt_state"])
      state.update(params=params, opt_state=opt_state)
      return params, opt_state, value
    return step
  return make_sequence


def test_adam_with_exponential_decay_schedule():
  opt = optax.adam(optax.exponential_decay(1e-2, transition_steps=1,
                                           decay_rate=0.9))
  stock, runs, s = check_against_stock(training(lambda i: opt))
  # tier B: the schedule reads the step count from the optimizer state (an
  # argument), and the update's own locals captured by its lambdas are
  # fresh cells, so the closure is keyed: the second run is all hits
  assert traces(runs[1]) == [0] * STEPS, runs[1]
  assert compiles(runs[1]) == [0] * STEPS   # the second run compiles nothing
  assert s["hits"] >= STEPS and s["fallbacks"] == 0, s


def test_adam_rebuilt_with_python_float_learning_rate():
  # A new optimizer every step, its learning rate a new Python float: in
  # the shared executable that float is an argument (stock bakes it), hence
  # rtol (docs/contract.md, rule 2).
  stock, runs, s = check_against_stock(
      training(lambda i: optax.adam(1e-2 / (1 + i))), rtol=1e-6)
  # Run 1: every step's closure key is new (the float is keyed by its
  # bits), so tier A answers: one stock compile, one shared, then hits.
  assert compiles(runs[0]) == [1, 1] + [0] * (STEPS - 2)
  assert s["hits"] == 0, s
  # Run 2 meets each key a second time: tier B stores its own lifted trace
  # (its arrays are inputs, not constants: a second structure for tier A,
  # compiled as any structure is, once met and once shared), and never
  # more; a third run would skip those traces.
  assert sum(compiles(runs[1])) <= 2, runs[1]
  assert s["tier_a"]["compiles"] <= 2 and s["tier_a"]["entries"] <= 2, s


def test_sgd_constant_learning_rate_skips_the_trace():
  opt = optax.sgd(0.05)
  stock, runs, s = check_against_stock(training(lambda i: opt))
  # tier B: the closure is keyed (batch arrays lifted): from the third call
  # neither a trace nor a compile; the second run is all hits
  assert traces(runs[0])[2:] == [0] * (STEPS - 2), runs[0]
  assert traces(runs[1]) == [0] * STEPS, runs[1]
  assert s["hits"] >= 2 * STEPS - 2 and s["fallbacks"] == 0, s


def test_sgd_rebuilt_with_python_float_learning_rate():
  # Tier B keys the closure, the float by value ("static float": each
  # learning rate is its own key), so in the first run each key is met once (``key_met_once``) and tier A shares
  # the executable; in the second run each key is met again and tier B's
  # lifted entries are compiled: a new structure for tier A, which compiles
  # it twice (calls 1 and 2), then shares it. Traces never reach 0.
  stock, runs, s = check_against_stock(
      training(lambda i: optax.sgd(0.05 / (1 + i))), rtol=1e-6)
  assert s["fallback_reasons"].get("key_met_once", 0) >= STEPS - 1, s
  assert s["tier_a"]["hits"] >= 2 * STEPS - 4, s
