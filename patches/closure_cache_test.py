# Copyright 2026 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Tests for the jax_closure_cache option: re-created closures reuse one
compiled executable, with results equal to the option being off."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import jax
from jax import lax
import jax.numpy as jnp
from jax._src import config
from jax._src import test_util as jtu

config.parse_flags_with_absl()


def _make_inner(w):
  def inner(x):
    return jnp.tanh(x @ w)
  return inner


def _trace_and_compile_counts(fn):
  with jtu.count_jit_tracing_cache_miss() as traces, \
       jtu.count_jit_compilation_cache_miss() as compiles:
    out = fn()
  return out, traces(), compiles()


class ClosureCacheTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(config.closure_cache(True))

  def _stock(self, fn):
    with config.closure_cache(False):
      return fn()

  @parameterized.named_parameters(
      ("matrix", lambda i: jnp.eye(4) * i),
      ("pytree", lambda i: {"w": jnp.eye(4) * i, "b": jnp.full(4, 1.0 * i)}),
  )
  def test_recreated_closure_compiles_once(self, make_value):
    def call(v):
      return jax.jit(lambda x: x @ (v["w"] if isinstance(v, dict) else v))(
          jnp.ones((4, 4)))
    v1, v2 = make_value(1), make_value(2)
    call(v1)   # the first function object of this code is stock's
    call(v1)   # the second compiles the shared entry
    out, traces, compiles = _trace_and_compile_counts(lambda: call(v2))
    self.assertEqual((traces, compiles), (0, 0))
    self.assertArraysEqual(out, self._stock(lambda: call(v2)))

  @parameterized.parameters(2.0, -0.0, 3)
  def test_static_cell_values_are_keyed(self, scale):
    make = lambda s: jax.jit(lambda x: x * s)
    x = jnp.arange(3.0)
    make(1.0)(x)
    self.assertArraysEqual(make(scale)(x), self._stock(lambda: make(scale)(x)))

  def test_tracer_in_closure_falls_back_to_stock(self):
    def outer(y):
      return jax.jit(lambda x: x * y)(2.0)
    self.assertAllClose(jax.grad(outer)(3.0), 2.0)

  @parameterized.named_parameters(
      ("while_loop", lambda w, x: lax.while_loop(
          lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x))[1]),
      ("fori_loop", lambda w, x: lax.fori_loop(0, 3, lambda i, v: v @ w, x)),
      ("scan", lambda w, x: lax.scan(lambda c, _: (c @ w, c), x, None,
                                     length=3)[0]),
      ("cond", lambda w, x: lax.cond(True, lambda a: a @ w, lambda a: a, x)),
  )
  def test_eager_control_flow_with_fresh_closures(self, prog):
    x = jnp.ones(4)
    w1, w2 = jnp.eye(4), 2 * jnp.eye(4)
    prog(w1, x)   # the first body object is stock's
    prog(w1, x)   # the second compiles the shared entry
    out, traces, compiles = _trace_and_compile_counts(lambda: prog(w2, x))
    self.assertEqual((traces, compiles), (0, 0))
    self.assertArraysEqual(out, self._stock(lambda: prog(w2, x)))

  def test_option_off_is_stock(self):
    with config.closure_cache(False):
      make = lambda w: jax.jit(lambda x: x @ w)
      make(jnp.eye(2))(jnp.ones(2))
      _, traces, _ = _trace_and_compile_counts(
          lambda: make(2 * jnp.eye(2))(jnp.ones(2)))
    self.assertGreater(traces, 0)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
