"""dm-haiku as its users write it: ``hk.transform`` of a forward function
(made once, or made again every call) and ``apply`` inside a loss that
closes over the batch, under ``jax.jit`` of a step function re-made every
step. Each sequence runs with stock, then twice with the cache in verify
mode.

Which tier answers (from ``jax_closure_cache.stats()``): tier A, in both.
Tier B refuses the closure (``fallback_reasons``: ``attributes``:
"without_state.<locals>.init_fn has attributes": haiku's transformed
functions carry attributes, set by ``functools.wraps``), so every call
traces as stock does; the executable is shared: 0 compiles from the third
call.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

hk = pytest.importorskip("haiku")

from ecosystem_check import (STEPS, assert_tier_a_answers,  # noqa: E402
                             check_against_stock, compiles)

LR = 0.1


def forward(x):
  return hk.nets.MLP([16, 2])(x)


def _data():
  rng = np.random.default_rng(3)
  batches = [(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
              jnp.asarray(rng.standard_normal((8, 2)), jnp.float32))
             for _ in range(4)]
  transformed = hk.transform(forward)
  return transformed, transformed.init(jax.random.key(0), batches[0][0]), \
      batches


FORWARD, PARAMS, BATCHES = _data()


def training(transform_each_call: bool):
  def make_sequence():
    params = [PARAMS]

    def step(i):
      x, y = BATCHES[i % len(BATCHES)]
      f = (hk.transform(lambda inp: hk.nets.MLP([16, 2])(inp))
           if transform_each_call else FORWARD)

      def loss(p):
        return jnp.mean((f.apply(p, None, x) - y) ** 2)

      def sgd_step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, g: a - LR * g, p, grads), value

      params[0], value = jax.jit(sgd_step)(params[0])
      return params[0], value
    return step
  return make_sequence


def test_transform_once_apply_in_fresh_jit_closure():
  stock, runs, s = check_against_stock(training(transform_each_call=False))
  assert_tier_a_answers(s)   # tier B: attributes (haiku's wrapped functions)
  assert compiles(runs[1]) == [0] * STEPS


def test_transform_every_call_apply_in_fresh_jit_closure():
  stock, runs, s = check_against_stock(training(transform_each_call=True))
  assert_tier_a_answers(s)
  assert compiles(runs[1]) == [0] * STEPS
