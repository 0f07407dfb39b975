"""Shared fixtures: every test starts with an empty cache and stock jax.jit."""

import contextlib
import warnings

import jax
import numpy as np
import pytest
from jax._src import test_util as jtu

import jax_closure_cache as jcc

# JAX's own functions, whatever is patched when this file is imported (the
# plugin's --closure-cache enables the cache before it is).
from jax_closure_cache import _compat  # noqa: E402
STOCK_JIT = _compat.STOCK_JIT
STOCK_WHILE_LOOP = _compat.STOCK_CONTROL_FLOW["while_loop"]
from jax_closure_cache.lookup.closure_cache import WARNING_REPLACEMENTS  # noqa: E402
# Layer two (the closure key inside JAX's trace lookup) runs only where the
# installed jax has the seams it is written against (0.10.2); elsewhere the
# front runs alone and layer two's tests are skipped, each saying why.
needs_trace_lookup = pytest.mark.skipif(
    not _compat.trace.TRACE_LOOKUP,
    reason="layer two is not ported to this jax: "
    + "; ".join(_compat.trace.TRACE_LOOKUP_MISSING))

# Prints whether `jit` caches on closure contents: three fresh closures (the
# first is stock's, the second compiles the shared entry), one hit.
ROUTING_PROBE = (
    "import jax.numpy as jnp\n"
    "import jax_closure_cache as jcc\n"
    "mk = lambda w: jit(lambda x: x * w)\n"
    "mk(jnp.full(2, 2.0))(jnp.ones(2)); mk(jnp.full(2, 2.0))(jnp.ones(2))\n"
    "mk(jnp.full(2, 3.0))(jnp.ones(2))\n"
    "print(jcc.stats()['hits'] == 1)\n")


@pytest.fixture(autouse=True)
def helper_module_globals():
  """Tests re-bind helper_module's globals; each test starts with its own
  (``W`` is not weakly typed, so a test that left a weakly typed one made a
  later test's new, non-weak value a legitimate retrace)."""
  import helper_module
  saved = dict(vars(helper_module))
  yield
  for name in ("W", "SCALE"):
    setattr(helper_module, name, saved[name])


#: A test that counts trace-time side effects (writes, log records,
#: warnings, prints) of a hit: verify mode traces every hit as stock would,
#: making those effects itself, so the test runs with it off (a hit that
#: skipped an effect could not fail it otherwise).
counts_side_effects = pytest.mark.counts_side_effects


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "counts_side_effects: runs with verify mode off (verify "
      "would make a skipped trace-time effect itself)")


@pytest.fixture(autouse=True)
def fresh_cache(request):
  from jax_closure_cache import cache
  verify = cache.verifying()
  jcc.disable()
  jcc.clear()
  if request.node.get_closest_marker("counts_side_effects"):
    cache.set_verify(False)
  yield
  jcc.disable()
  jcc.clear()
  cache.set_verify(verify)
  assert jax.jit is STOCK_JIT
  assert jax.lax.while_loop is STOCK_WHILE_LOOP
  assert warnings.warn is not WARNING_REPLACEMENTS["warn"]


@contextlib.contextmanager
def counting():
  """Yields a dict filled on exit with JAX's own trace and compile counts."""
  counts = {}
  with jtu.count_jit_tracing_cache_miss() as traces, \
       jtu.count_jit_compilation_cache_miss() as compiles:
    yield counts
  counts["traces"] = traces()
  counts["compiles"] = compiles()


def assert_like_stock(got, fun, *args, rtol=0.0, **kwargs):
  """``got`` equals stock ``jax.jit`` (the original, whatever is patched) of a
  fresh copy of ``fun``, as for a re-created function: values, dtype and weak
  type, leaf by leaf. The copy matters: stock caches on the function object,
  so reusing ``fun`` could return stock's own stale trace. ``rtol`` > 0 allows
  the last-ulp differences XLA's constant folding of baked arrays can cause
  (docs/contract.md, rule 2); NaN still equals only NaN."""
  import types
  import numpy as np
  if type(fun) is types.FunctionType:
    copy = types.FunctionType(fun.__code__, fun.__globals__, fun.__name__,
                              fun.__defaults__, fun.__closure__)
    copy.__kwdefaults__ = fun.__kwdefaults__
    fun = copy
  # With the cache off: enable() also keys JAX's own trace lookup on
  # closures, which stock jit objects go through too.
  was_enabled = jcc.is_enabled()
  jcc.disable()
  try:
    want = STOCK_JIT(fun)(*args, **kwargs)
  finally:
    if was_enabled:
      jcc.enable()
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree
  for g, w in zip(got_leaves, want_leaves):
    assert g.dtype == w.dtype and g.weak_type == w.weak_type, (g, w)
    if rtol:
      np.testing.assert_allclose(g, w, rtol=rtol, atol=0, equal_nan=True)
    else:
      np.testing.assert_array_equal(g, w)


def same_as_stock(got, want, rtol: float = 0.0, where: str = ""):
  """``got`` is ``want`` (stock's): pytree structure, dtype, weak type,
  shape, sharding, and values (exact, or within ``rtol``)."""
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree, where
  for g, w in zip(got_leaves, want_leaves):
    assert g.dtype == w.dtype, (where, g.dtype, w.dtype)
    assert g.weak_type == w.weak_type, (where, g, w)
    assert g.shape == w.shape, (where, g.shape, w.shape)
    assert g.sharding == w.sharding, where
    if rtol:
      np.testing.assert_allclose(g, w, rtol=rtol, atol=0, equal_nan=True,
                                 err_msg=where)
    else:
      np.testing.assert_array_equal(g, w, err_msg=where)


def replay_like_stock(run):
  """``run()`` (arrays, effects) with the cache off, then twice on: each
  cached run's effects are stock's and its arrays stock's, value for value
  (the second finds the first's entries). Returns stock's effects."""
  want, want_effects = stock_off(run)
  jcc.enable()
  for _ in range(2):
    got, effects = run()
    assert effects == want_effects
    assert len(got) == len(want)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  return want_effects


def replay_in_both_modes(run, clear: bool = False):
  """``run()`` (comparable results) with the cache off, then twice with it
  on, verify mode off and on: each cached run's results are stock's. With
  ``clear``, each mode starts from an empty cache (its first meetings and
  stores are its own) and the cache is left off."""
  jcc.disable()
  want = run()
  for verify in (False, True):
    if clear:
      jcc.clear()
    jcc.enable(verify=verify)
    for _ in range(2):
      assert run() == want, verify
    if clear:
      jcc.disable()
  return want


def script_lines(script: str, *argv: str) -> list:
  """``python -c script *argv`` in a process of its own (one mode of a
  test whose stock answer depends on JAX's process-wide caches): its
  output's lines, after checking it exited cleanly."""
  import subprocess
  import sys
  done = subprocess.run([sys.executable, "-c", script, *argv],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  return done.stdout.splitlines()


def varied(shape, v: float):
  """A float32 array of ``shape`` near ``v`` whose elements differ (``v``,
  ``v * 1.0625``, ``v * 1.125``, ...): not all one value, which XLA makes
  a scalar's broadcast in stock's module and folds with a scalar it is
  chained with (such a closure is stock's, so a test of hits closes over
  one of these)."""
  n = int(np.prod(shape))
  return jax.numpy.asarray(v * (1.0 + np.arange(n) / 16.0), np.float32).reshape(
      shape)


def stock_off(run, *args):
  """``run(*args)`` with the cache off (stock jit on fresh objects)."""
  was = jcc.is_enabled()
  jcc.disable()
  try:
    return run(*args)
  finally:
    if was:
      jcc.enable()


class Unkeyable(bytearray):   # a mutable C base: no hash, state unread
  """Unhashable, not a pytree, and state the walk cannot read."""
  __slots__ = ("n",)

  def __init__(self, n):
    self.n = n

  def __eq__(self, other):
    return self.n == other.n


class Ticker:
  """A value that changes every time a trace reads it, hidden from the key
  by a wrapper rule that leaves it out (a library rule's mistake): what the
  post-trace check must still catch, now that the walk refuses every clock
  and generator a test could read instead."""

  def __init__(self):
    self.n = 0

  def tick(self) -> float:
    self.n += 1
    return float(self.n)


@contextlib.contextmanager
def ticker():
  """A :class:`Ticker` whose wrapper rule keys it by its type alone."""
  from jax_closure_cache.key import values
  values.register_wrapper(Ticker, lambda t: ((), None), lambda s, inner: t)
  t = Ticker()
  try:
    yield t
  finally:
    values.unregister_wrapper(Ticker)


def warm(call):
  """Two first calls of fresh function objects: the first object of a code
  is stock's own (identity first), the second compiles the shared lifted
  entry; from the third on, a fresh object hits. Returns the second result."""
  call()
  return call()


def pytest_addoption(parser):
  parser.addoption(
      "--fuzz-examples", type=int, default=200,
      help="programs the differential fuzzer (test_fuzz.py) generates")
  parser.addoption(
      "--fuzz-seed", type=int, default=0,
      help="the fuzzer's seed (CI runs the default, fixed seed)")
  parser.addoption(
      "--grammar-examples", type=int, default=30,
      help="programs the value-grammar fuzzer (test_value_grammar.py) runs "
           "from its seed (default 30; CI runs 60; 0 skips it)")
  parser.addoption(
      "--grammar-seed", type=int, default=0,
      help="the value-grammar fuzzer's seed (CI runs the default, fixed seed)")
