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

import concurrent.futures
from functools import partial
import gc
from unittest import mock
import weakref

from absl.testing import absltest
import numpy as np

import jax
from jax import export
from jax import lax
import jax.numpy as jnp
from jax._src import config
from jax._src import test_util as jtu

config.parse_flags_with_absl()


def _counts(run):
  with (jtu.count_jit_tracing_cache_miss() as traces,
        jtu.count_jit_compilation_cache_miss() as compiles):
    out = run()
  return out, (traces(), compiles())


def _stock(run):
  with config.closure_cache(False):
    return run()


@jtu.with_config(jax_closure_cache=True)
class ClosureKeyTest(jtu.JaxTestCase):

  def assertSharedFromThird(self, run, arrays):
    # as with the option off; from the third call nothing traced or compiled
    counts = []
    for w in arrays:
      out, c = _counts(lambda: run(w))
      counts.append(c)
      self.assertAllClose(out, _stock(lambda: run(w)), rtol=1e-6)
    self.assertEqual(counts[2:], [(0, 0)] * (len(arrays) - 2), counts)

  # -- patch 2: the closure key and the trace lookup

  def test_eager_loops_with_recreated_bodies(self):
    x = jnp.ones((4, 4))
    ws = [jnp.eye(4) * i for i in range(5)]
    body = lambda w: lambda c: (c[0] + 1, jnp.tanh(c[1] @ w))
    self.assertSharedFromThird(
        lambda w: lax.while_loop(lambda c: c[0] < 3, body(w), (0, x))[1], ws)
    self.assertSharedFromThird(
        lambda w: lax.scan(lambda c, _: (c @ w, None), x, length=2)[0], ws)
    self.assertSharedFromThird(
        lambda w: lax.fori_loop(0, 2, lambda i, c: c @ w, x), ws)
    self.assertSharedFromThird(lambda w: lax.map(lambda v: v @ w, x), ws)

  def test_caching2_in_the_form_a_closure_key_answers(self):
    # testCaching2 (lax_control_flow_test) re-created from one definition:
    # the flag the cond and body read is part of their key
    def loop(python_should_be_executing):
      def cond(x):
        assert python_should_be_executing
        return x < 5
      def body(x):
        assert python_should_be_executing
        return x + 2
      return lax.while_loop(cond, body, 0)

    loop(True)  # traced as with the option off, and stored by key
    with jtu.count_jit_tracing_cache_miss() as count:
      out = loop(True)
    self.assertEqual(count(), 0)
    self.assertEqual(out, 6)
    self.assertRaises(AssertionError, loop, False)  # the flag is read

  def test_functions_reached_twice_and_defaults_rebuilt_in_walk_order(self):
    def make(w):   # cells first, then defaults: b is not w
      inner = lambda y: y * w
      mid = lambda y: inner(y) * 2.0
      return lambda c, b=w + 100.0: (c[0] + 1, mid(c[1]) + inner(c[1]) + b)
    self.assertSharedFromThird(
        lambda w: lax.while_loop(lambda c: c[0] < 2, make(w), (0, jnp.ones(3))),
        [jnp.full(3, float(i)) for i in range(5)])

  def test_a_trace_that_needs_a_value_is_traced_as_usual_and_remembered(self):
    # the key's one failed lifted trace (second call) is the only extra one
    def run(w):
      body = lambda i, c: c + w if np.asarray(w)[0] > 0 else c - w
      return lax.fori_loop(0, 2, body, jnp.zeros(3))
    _stock(lambda: run(jnp.full(3, 9.0)))   # JAX's own helpers, traced once
    extra = []
    for s in (1.0, 2.0, -1.0, 4.0, 5.0):
      w = jnp.full(3, s)
      out, (traces, _) = _counts(lambda: run(w))
      want, (stock_traces, _) = _counts(lambda: _stock(lambda: run(w)))
      self.assertAllClose(out, want)
      extra.append(traces - stock_traces)
    self.assertLessEqual(max(extra[2:]), 0, extra)
    self.assertLessEqual(max(extra), 1, extra)

  def test_class_attribute_changed_between_calls(self):
    class Cfg:
      k = 3.0
    run = lambda w: lax.fori_loop(0, 1, lambda i, c: c * w + Cfg.k, jnp.ones(3))
    for s in range(4):
      with mock.patch.object(Cfg, "k", 10.0 if s >= 2 else 3.0):
        w = jnp.full(3, 1.0 + s)
        self.assertAllClose(run(w), _stock(lambda: run(w)))

  def test_numpy_draws_attributes_and_globals_by_name_at_trace_time(self):
    def attribute(w, s):
      f = lambda i, c: c * w + f.s
      f.s = s
      return f
    def by_name(w, s):
      globals()["_S"] = s
      return lambda i, c: c * w + eval("_S")
    for body in (lambda w, s: lambda i, c: c * w + np.random.normal(),
                 attribute, by_name):
      run = lambda s: lax.fori_loop(0, 1, body(jnp.ones(3), s), jnp.ones(3))
      outs = []
      for on in (True, False):
        np.random.seed(0)
        with config.closure_cache(on):
          outs.append([run(float(s)) for s in range(4)])
      self.assertAllClose(*outs)

  def test_a_committed_array_is_not_kept_alive(self):
    # kept by identity, not lifted: a stored answer holding it would keep it
    x = jnp.ones(3)
    make = lambda w: jax.jit(lambda v: v * w)
    refs = []
    for s in range(3):
      w = jax.device_put(jnp.full(3, float(s)), jax.devices()[0])
      self.assertAllClose(make(w)(x), w)
      refs.append(weakref.ref(w))
    del w
    gc.collect()
    self.assertEqual([r() for r in refs], [None] * 3)

  def test_clear_caches_empties_every_table(self):
    from jax._src import closure_cache
    make = lambda w: jax.jit(lambda v: v * w)
    for s in range(3):
      make(jnp.full(3, float(s)))(jnp.ones(3))
    self.assertNotEqual(len(closure_cache._first), 0)
    jax.clear_caches()
    self.assertEqual(closure_cache.traces.cache_keys(), [])
    self.assertEqual(len(closure_cache._last_key) + len(closure_cache._first),
                     0)

  # -- patch 3: pjit, the stages and the fast path

  def test_closures_partial_grad_and_defaults_trace_and_compile_once(self):
    x = jnp.ones((3, 3))
    ws = [jnp.eye(3) * i for i in range(5)]
    f = lambda w, v: v * w
    self.assertSharedFromThird(lambda w: jax.jit(lambda v: v @ w)(x), ws)
    self.assertSharedFromThird(lambda w: jax.jit(partial(f, w))(x), ws)
    self.assertSharedFromThird(
        lambda w: jax.jit(jax.grad(lambda v: jnp.sum(v * w)))(x), ws)
    self.assertSharedFromThird(lambda w: jax.jit(lambda v, w=w: v * w)(x), ws)

  def test_reused_jitted_closures_keep_their_own_arrays(self):
    x = jnp.ones(3)
    make = lambda w: jax.jit(lambda v: v * w)
    [make(jnp.full(3, float(i)))(x) for i in range(2)]
    wa, wb = jnp.full(3, 2.0), jnp.full(3, 3.0)
    fa, fb = make(wa), make(wb)
    for _ in range(3):  # the C++ fast path
      self.assertAllClose(fa(x), wa)
      self.assertAllClose(fb(x), wb)

  def test_lowering_takes_closed_over_arrays_as_parameters(self):
    x = jnp.ones((4, 4))
    make = lambda w: jax.jit(lambda v: v @ w)
    [make(jnp.eye(4) * i)(x) for i in range(2)]
    w = jnp.eye(4) * 3
    lowered = make(w).lower(x)
    self.assertNotIn("stablehlo.constant", lowered.as_text())
    self.assertEqual(lowered.in_avals, ((x.aval,), {}))
    self.assertAllClose(lowered.compile()(x), x @ w)

  def test_numpy_and_jax_constants_through_calls_lower_and_trace(self):
    # the NumPy array is a constant of the trace beside the lifted leaf:
    # both are the shared jaxpr's, passed first by every path
    x = jnp.ones(3)
    n = np.arange(3.0, dtype=np.float32)
    make = lambda w: jax.jit(lambda v: v * w + n * 2.0)
    for s in range(4):
      w = jnp.full(3, float(s))
      f = make(w)
      want = _stock(lambda: jax.jit(lambda v: v * w + n * 2.0)(x))
      for _ in range(2):  # the first call, then the C++ fast path
        self.assertAllClose(f(x), want)
      self.assertAllClose(f.lower(x).compile()(x), want)
      self.assertAllClose(f.trace(x).lower().compile()(x), want)
      # an exported module bakes them, as with the option off
      self.assertAllClose(export.export(f)(x).call(x), want)

  def test_eight_threads_with_recreated_closures(self):
    x = jnp.ones(3)
    make = lambda w: jax.jit(lambda v: v * w)
    work = lambda i: [make(jnp.full(3, float(10 * i + s)))(x) for s in range(6)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      results = list(pool.map(work, range(8)))  # re-raises a thread's error
    for i, outs in enumerate(results):
      for s, out in enumerate(outs):
        self.assertAllClose(out, jnp.full(3, float(10 * i + s)))

  def test_cond_and_switch_with_recreated_branches(self):
    x = jnp.ones((4, 4))
    ws = [jnp.eye(4) * i for i in range(5)]
    self.assertSharedFromThird(
        lambda w: lax.cond(True, lambda v: v @ w, lambda v: v - w, x), ws)
    self.assertSharedFromThird(
        lambda w: lax.switch(1, [lambda v: v @ w, lambda v: v - w], x), ws)

  # -- patch 4: explanations

  def test_explanation_names_the_closure_difference(self):
    def make(scale):
      return lambda c: c * scale
    with (config.explain_cache_misses(True),
          self.assertLogs(level="WARNING") as logs):
      for scale in (2, 3):  # one call site
        lax.while_loop(lambda c: c < 0, make(scale), 1)
    self.assertTrue(any("closure differs at cell 'scale': int 2 -> int 3" in m
                        for m in logs.output), logs.output)

  def test_explanation_of_a_shared_trace_names_the_users_function(self):
    make = lambda w: jax.jit(lambda v: v * w)
    with (config.explain_cache_misses(True),
          self.assertLogs(level="WARNING") as logs):
      for s in range(3):
        make(jnp.full(3, float(s)))(jnp.ones(3))
    text = "\n".join(logs.output)
    self.assertNotIn("no closure key", text)
    self.assertIn("a closure key seen before", text)
    self.assertIn("<lambda>", text)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
