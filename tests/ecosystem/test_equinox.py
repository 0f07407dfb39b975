"""equinox as its users write it: ``eqx.filter_jit`` of a step function
re-made every step (its loss closes over the batch, its gradient from
``eqx.filter_value_and_grad``), and ``eqx.filter_jit(eqx.filter_value_and_grad(
loss))`` re-made every call, on a small ``eqx.nn.MLP``. Each sequence runs
with stock, then twice with the cache in verify mode.

Which tier answers (from ``jax_closure_cache.stats()``): tier A, in both.
- The fresh step: tier B sees the user's function through ``filter_jit``
  and refuses it (``fallback_reasons``: ``dynamic_read``: "TreeWLCustom.
  __call__ calls getattr", equinox's pretty-printer, reached from
  ``filter_value_and_grad``'s error message: the key walks library code
  transitively and refuses a ``getattr`` by computed name on any path).
- ``filter_jit(filter_value_and_grad(loss))``: the jitted callable is an
  equinox Module, not a function, so tier B never keys it (no hit, no
  fallback counted); tier A shares the executable.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")

from ecosystem_check import (STEPS, assert_tier_a_answers,  # noqa: E402
                             check_against_stock, compiles)


def _data():
  rng = np.random.default_rng(1)
  batches = [(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
              jnp.asarray(rng.standard_normal((8, 2)), jnp.float32))
             for _ in range(4)]
  return eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0)), batches


MODEL, BATCHES = _data()
LR = 0.1


def fresh_filter_jit_step():
  model = [MODEL]

  def step(i):
    x, y = BATCHES[i % len(BATCHES)]

    def loss(m):
      return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    @eqx.filter_jit
    def train_step(m):
      value, grads = eqx.filter_value_and_grad(loss)(m)
      updates = jax.tree_util.tree_map(lambda g: -LR * g, grads)
      return value, eqx.apply_updates(m, updates)

    value, model[0] = train_step(model[0])
    return value, eqx.filter(model[0], eqx.is_array)
  return step


def fresh_filter_value_and_grad():
  model = [MODEL]

  def step(i):
    x, y = BATCHES[i % len(BATCHES)]

    def loss(m):
      return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))(model[0])
    model[0] = eqx.apply_updates(
        model[0], jax.tree_util.tree_map(lambda g: -LR * g, grads))
    return value, eqx.filter(grads, eqx.is_array)
  return step


def test_filter_jit_step_remade_every_step():
  stock, runs, s = check_against_stock(fresh_filter_jit_step)
  assert_tier_a_answers(s)   # tier B: dynamic_read (see the module doc)
  assert compiles(runs[1]) == [0] * STEPS


def test_filter_jit_of_filter_value_and_grad_remade_every_call():
  stock, runs, s = check_against_stock(fresh_filter_value_and_grad)
  assert_tier_a_answers(s)
  assert s["fallbacks"] == 0, s   # a Module: tier B does not try it
  assert compiles(runs[1]) == [0] * STEPS
