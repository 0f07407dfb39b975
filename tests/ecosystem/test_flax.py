"""flax as its users write it. NNX: an ``nnx.jit`` train step re-made every
step (its loss closes over the batch), updating an ``nnx.Module`` and an
``nnx.Optimizer`` in place. Linen: a ``TrainState`` whose ``apply_fn`` is
re-made every step (a fresh ``functools.partial``/lambda around
``model.apply``), stepped by a fresh ``jax.jit`` closure or by one
module-level ``jax.jit`` step. Each sequence runs with stock, then twice
with the cache in verify mode.

Which tier answers (from ``jax_closure_cache.stats()``):
- ``nnx.jit``: tier A. Tier B refuses the function nnx hands to ``jax.jit``
  (``fallback_reasons``: ``attributes``: "dataclass has attributes", nnx's
  ``JitFn``, which holds its ``JitWrapped`` context).
- Linen, fresh ``jax.jit`` closure: tier B keys the closure and hits, but
  the ``TrainState``'s static part (its pytree aux data) holds the new
  ``apply_fn`` object, so every hit retraces (``retraces``); tier A shares
  the executable. Traces do not reach 0.
- Linen, one module-level jitted step: stock's own jit object, retraced by
  JAX for the new static ``apply_fn``; tier A shares the executable.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")
train_state = pytest.importorskip("flax.training.train_state")

from ecosystem_check import (STEPS, assert_tier_a_answers,  # noqa: E402
                             check_against_stock, compiles, traces)


def _batches():
  rng = np.random.default_rng(2)
  return [(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
           jnp.asarray(rng.standard_normal((8, 2)), jnp.float32))
          for _ in range(4)]


BATCHES = _batches()


def arrays(tree):
  """The leaves by path, copied out now (nnx updates its Variables in
  place)."""
  return {jax.tree_util.keystr(p): v
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


# -- NNX ---------------------------------------------------------------------

class MLP(nnx.Module):

  def __init__(self, rngs):
    self.l1 = nnx.Linear(4, 16, rngs=rngs)
    self.l2 = nnx.Linear(16, 2, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.l1(x)))


def nnx_training():
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  def step(i):
    x, y = BATCHES[i % len(BATCHES)]

    @nnx.jit
    def train_step(model, optimizer):
      def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)
      loss, grads = nnx.value_and_grad(loss_fn)(model)
      optimizer.update(model, grads)
      return loss

    loss = train_step(model, optimizer)
    return loss, arrays(nnx.state(model)), arrays(nnx.state(optimizer))
  return step


def test_nnx_jit_train_step_remade_every_step():
  stock, runs, s = check_against_stock(nnx_training)
  assert_tier_a_answers(s)   # tier B: attributes (nnx's JitFn)
  assert compiles(runs[1]) == [0] * STEPS


# -- Linen -------------------------------------------------------------------

class LinenMLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(16)(x)))


LINEN = LinenMLP()
LINEN_PARAMS = LINEN.init(jax.random.key(0), BATCHES[0][0])["params"]


def new_state():
  return train_state.TrainState.create(
      apply_fn=LINEN.apply, params=LINEN_PARAMS, tx=optax.adam(1e-2))


def linen_fresh_closure():
  state = [new_state()]

  def step(i):
    x, y = BATCHES[i % len(BATCHES)]
    st = state[0].replace(apply_fn=functools.partial(LINEN.apply))

    def train_step(st):
      def loss_fn(params):
        return jnp.mean((st.apply_fn({"params": params}, x) - y) ** 2)
      loss, grads = jax.value_and_grad(loss_fn)(st.params)
      return st.apply_gradients(grads=grads), loss

    st, loss = jax.jit(train_step)(st)
    state[0] = st
    return loss, st.step, st.params, st.opt_state
  return step


@jax.jit
def linen_train_step(st, x, y):
  def loss_fn(params):
    return jnp.mean((st.apply_fn({"params": params}, x) - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(st.params)
  return st.apply_gradients(grads=grads), loss


def linen_global_step():
  state = [new_state()]

  def step(i):
    x, y = BATCHES[i % len(BATCHES)]
    st = state[0].replace(apply_fn=lambda v, inp: LINEN.apply(v, inp))
    st, loss = linen_train_step(st, x, y)
    state[0] = st
    return loss, st.step, st.params, st.opt_state
  return step


def test_linen_train_state_fresh_apply_fn_fresh_jit_closure():
  # The TrainState's static part holds a fresh apply_fn each call, which
  # JAX's caches compare by ``==``: the closure key leaves such a call to
  # stock (``argument_node_data``; its entry's cache would answer a call
  # whose static part reads otherwise from an earlier one's trace), and
  # tier A shares the executable after stock's trace. From call 3: no
  # compile.
  stock, runs, s = check_against_stock(linen_fresh_closure)
  assert set(s["fallback_reasons"]) == {"argument_node_data"}, s
  assert all(t >= 1 for t in traces(runs[0]) + traces(runs[1]))
  assert_tier_a_answers(s)
  assert compiles(runs[1]) == [0] * STEPS


def test_linen_train_state_fresh_apply_fn_one_jitted_step():
  stock, runs, s = check_against_stock(linen_global_step)
  # stock's own jit object: no tier B; tier A shares the executable
  assert_tier_a_answers(s)
  assert compiles(runs[1]) == [0] * STEPS
