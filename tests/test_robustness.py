"""No crash, hang or growth that stock does not have: each case here made
the cache crash, deadlock or keep memory alive before its fix, and each is
compared with stock on fresh function objects, run twice so hits happen."""

import functools
import os
import subprocess
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import cache
from conftest import PATCHED, STOCK_JIT, needs_trace_lookup, stock_off


def _jvp_of_recreated_stock_jits(stock_jit, x, rounds):
  def make(w):
    def f(v):
      return jnp.sin(jnp.dot(v, w))
    return f
  outs = []
  for i in range(rounds):
    w = jnp.full((5, 5), 0.1 * (i + 1))
    # twice per key: the second call of the jvp'd jaxpr takes the C++ path
    outs.append(jax.jvp(stock_jit(make(w)), (x,), (x,)))
    outs.append(jax.jvp(stock_jit(make(w)), (x,), (x,)))
  return outs


@needs_trace_lookup
def test_jvp_of_a_shared_jaxpr_keeps_its_arguments():
  """A stock jitted object whose trace is a shared jaxpr, called under
  ``jvp``: pjit binds the jaxpr as a primitive, whose eager call must not
  take the outer call's constants as its own fast path's (that ran the
  executable with its leaves twice: RuntimeProgramInputMismatch, or a
  segfault in JAX's api_test)."""
  jcc.enable()
  x = jnp.ones(5)
  for _ in range(2):
    got = _jvp_of_recreated_stock_jits(STOCK_JIT, x, 4)
    want = stock_off(_jvp_of_recreated_stock_jits, STOCK_JIT, x, 4)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert g.dtype == w.dtype and g.weak_type == w.weak_type
      np.testing.assert_allclose(g, w, rtol=1e-6)


class _Anchor:
  """An object kept by identity whose last reference a stored entry holds."""


def _store_then_clear(put, clear):
  """Stores an entry that holds the last reference to an object with a
  weak reference whose callback takes the store's lock, then clears the
  store in a thread: whether ``clear`` returned within the timeout."""
  done = threading.Event()

  def run():
    put()
    clear()
    done.set()

  t = threading.Thread(target=run, daemon=True)
  t.start()
  return done.wait(20)


@needs_trace_lookup
def test_clearing_the_trace_store_frees_nothing_under_its_lock():
  from jax_closure_cache.lookup import trace_lookup
  store = trace_lookup.closure_cache.traces
  _Shared = trace_lookup.closure_cache._Shared

  def put():
    a = _Anchor()
    shared = _Shared(consts=(a,))
    ref = weakref.ref(shared)
    shared.anchors = [weakref.ref(
        a, lambda _, k=("anchor test",): store.discard(k, ref()))]
    store.put(("anchor test",), shared)

  assert _store_then_clear(put, store.cache_clear), "cache_clear deadlocked"
  # eviction past capacity frees outside the lock too
  saved = store.capacity
  store.capacity = 1
  try:
    assert _store_then_clear(put, lambda: store.put(("other",), _Shared()))
  finally:
    store.capacity = saved
    store.cache_clear()


def test_clearing_an_entry_store_frees_nothing_under_its_lock():
  store = cache.new_store("robustness test")

  class _Held(cache.Entry):
    __slots__ = ("anchor",)

  def put():
    entry = _Held()
    entry.anchor = a = _Anchor()
    eref = weakref.ref(entry)
    a.ref = weakref.ref(a, lambda _: store.discard_entry("k", eref()))
    store.put("k", entry)

  assert _store_then_clear(put, store.clear), "clear deadlocked"
  assert _store_then_clear(put, lambda: store.discard("k"))


_CLEAR_AND_EXIT = """
import jax, jax.numpy as jnp, numpy as np
import jax_closure_cache as jcc
jcc.enable()
def make(w, c):
  return lambda x: jnp.tanh(x @ w) * c
x = jnp.ones((3, 3))
for step in range(12):
  w = np.full((3, 3), 0.5)            # NumPy: lifted or kept by the key
  jax.jit(make(w, float(step)))(x)    # a new Python float per step
  jax.lax.fori_loop(0, 2, lambda i, v: v + w.sum(), x)
jax.clear_caches()
jcc.clear()
jax.clear_caches()
print("cleared")
"""


def test_clear_caches_and_exit_return():
  """``jax.clear_caches()`` and interpreter exit (JAX's atexit clears every
  cache again) return, in a fresh process under a timeout."""
  env = dict(os.environ)
  out = subprocess.run([sys.executable, "-c", _CLEAR_AND_EXIT], env=env,
                       capture_output=True, text=True, timeout=240)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().endswith("cleared")


def _attributes(jitted):
  return {a: getattr(jitted, f"__{a}__")
          for a in ("doc", "name", "module", "qualname", "annotations")}


@pytest.mark.parametrize("options", [{}, {"static_argnames": "n"},
                                     {"donate_argnums": 0}])
def test_wrapper_attributes_are_the_users_as_on_stocks(options):
  """``functools.wraps(fun)(jax.jit(fun, ...))`` (what numerical libraries
  do for every public function at import) works, and a wrapper reports
  the user's attributes as stock's jitted object does, set or not."""
  def make():
    def f(x, n=2):
      """docstring of f."""
      return x * n
    f.some_value = 4
    return f

  jcc.enable()
  for _ in range(2):
    f = make()
    got = functools.wraps(f)(jax.jit(f, **options))
    want = functools.wraps(f)(STOCK_JIT(make(), **options))
    assert _attributes(got) == _attributes(want)
    assert got.__wrapped__ is f and got.some_value == 4
    assert _attributes(jax.jit(f, **options)) == _attributes(
        STOCK_JIT(f, **options))
    np.testing.assert_array_equal(got(jnp.ones(2), n=3),
                                  want(jnp.ones(2), n=3))
  assert type(got).__module__.startswith("jax_closure_cache")
  assert type(got).__doc__ and "jitted" in type(got).__doc__
  with pytest.raises(AttributeError):
    jax.jit(make()).no_such_attribute


def test_repr_of_a_function_whose_repr_raises():
  class Callable:
    def __call__(self):
      pass

    def __repr__(self):
      raise ValueError("invalid repr")

  jcc.enable()
  for jit in (jax.jit, STOCK_JIT):
    jitted = jit(Callable())
    assert repr(jitted) == "<PjitFunction>"
    del jitted.__wrapped__
    assert repr(jitted) == "<PjitFunction>"
    with pytest.raises(AttributeError):
      jitted.__wrapped__
