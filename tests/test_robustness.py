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
from jax_closure_cache import _compat, cache
from conftest import (
    STOCK_JIT, counting, counts_side_effects, needs_trace_lookup,
    replay_in_both_modes, script_lines, stock_off)


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


def _store_then_clear(put, clear, timeout=20):
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
  return done.wait(timeout)


@needs_trace_lookup
def test_clearing_the_trace_store_frees_nothing_under_its_lock():
  """The shared traces are a bounded table of the store: an anchor it holds
  (``LRUStore.hold``) whose last reference a stored trace holds dies while
  the store is cleared, or evicts past its capacity, without a deadlock."""
  from jax_closure_cache.lookup import trace_lookup
  store = trace_lookup.closure_cache.traces
  _Shared = trace_lookup.closure_cache._Shared

  def put():
    a = _Anchor()
    shared = _Shared(consts=(a,))
    shared.anchors = store.hold(("anchor test",), shared, [a])
    store.put(("anchor test",), shared)

  assert _store_then_clear(put, store.clear), "clear deadlocked"
  # eviction past capacity frees outside the lock too
  saved = jcc.capacity()
  jcc.set_capacity(1)
  try:
    assert _store_then_clear(put, lambda: store.put(("other",), _Shared()))
  finally:
    jcc.set_capacity(saved)
    store.clear()


def test_clearing_an_entry_store_frees_nothing_under_its_lock():
  store = cache.LRUStore("robustness test")

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


def test_a_store_holds_a_keys_objects_weakly_or_refuses():
  """``LRUStore.hold``, every store's one weak hold: an anchor's death drops
  its entry (and only that entry); a globals dict and what ``keep`` allows
  are held as they are; anything else that cannot be weakly referenced is
  refused with the reason (storing would keep it alive)."""
  import gc
  store = cache.LRUStore("hold test")

  class _Held(cache.Entry):
    __slots__ = ("anchors",)

  a, b = _Anchor(), _Anchor()
  first, second = _Held(), _Held()
  first.anchors = store.hold("first", first, [a, globals()])
  second.anchors = store.hold("second", second, [b])
  assert first.anchors[1] is globals()
  store.put("first", first)
  store.put("second", second)
  del a
  gc.collect()
  assert store.get("first") is None and store.get("second") is second
  stored_again, c = _Held(), _Anchor()   # the key stored again: the old
  stored_again.anchors = store.hold("second", stored_again, [c])   # entry's
  store.put("second", stored_again)   # anchor's death spares the new one
  del b, second
  gc.collect()
  assert store.get("second") is stored_again
  del c
  gc.collect()
  assert store.get("second") is None
  number = 12345678901234567890   # an int: no weak reference
  refused = store.hold("k", _Held(), [number])
  assert isinstance(refused, str) and "int" in refused
  assert "keep it alive" in refused
  assert store.hold("k", _Held(), [number], keep=lambda x: True) == [number]


def _under_transfer_guard(x, steps, traced=None):
  """Fresh functions over a Python float, a NumPy table and an eager
  ``fori_loop``, each called under ``transfer_guard("disallow")``, and a
  function object called outside the guard, then again inside: each
  outcome, an exception by its type."""
  from jax import lax

  def attempt(fn):
    try:
      with jax.transfer_guard("disallow"):
        return np.asarray(fn()).tolist()
    except Exception as e:
      return type(e).__name__

  outs = []
  for c in steps:
    table = np.arange(3.0, dtype=np.float32) * c   # a fresh NumPy table
    outs.append(attempt(lambda: jax.jit(lambda v: v * c)(x)))
    outs.append(attempt(lambda: jax.jit(lambda v: v * table)(x)))
    outs.append(attempt(lambda: lax.fori_loop(0, 3, lambda j, v: v * c, x)))
    outs.append(attempt(lambda: lax.fori_loop(0, 3, lambda j, v: v + table,
                                              x)))
    def minus_table(v):
      if traced is not None:
        traced.append(c)   # a trace-time write
      return v - table
    again = jax.jit(minus_table)
    outs.append(np.asarray(again(x)).tolist())   # its first call: no guard
    outs.append(attempt(lambda: again(x)))
  return outs


@pytest.mark.parametrize("lift_numpy", [False, True])
def test_transfer_guards_see_the_transfers_stock_makes(lift_numpy):
  """Under a transfer guard, the cache makes no transfer stock's baked
  constants spare (tier A's literals and constants as arguments, a lifted
  NumPy array, put on the device by the package itself), and spares none
  stock makes (eager ``fori_loop``'s Python bounds): every call answers,
  or raises, as stock's."""
  x = jnp.ones(3)
  steps = (1.5, 2.5, 1.5, 1.5, 2.5)
  want = stock_off(_under_transfer_guard, x, steps)
  assert "JaxRuntimeError" in want and [1.5, 1.5, 1.5] in want
  jcc.enable(lift_numpy=lift_numpy)
  try:
    for _ in range(2):
      assert _under_transfer_guard(x, steps) == want
  finally:
    jcc.enable(lift_numpy=False)
  assert jcc.stats()["verify_mismatches"] == 0


@counts_side_effects
def test_a_lifted_numpy_array_is_put_on_the_device_under_a_transfer_guard():
  """A function object whose first call hit an entry over a lifted NumPy
  array, called again under a transfer guard, runs its entry with the
  array put on the device by the package: no error and no stock trace
  (stock traced that object once, at its first call)."""
  x = jnp.ones(3)
  steps = (1.5, 2.5, 1.5, 1.5, 2.5)
  stock_traces: list = []
  want = stock_off(_under_transfer_guard, x, steps, stock_traces)
  jcc.enable(lift_numpy=True)
  try:
    for _ in range(2):
      traces: list = []
      assert _under_transfer_guard(x, steps, traces) == want
      assert len(traces) <= len(stock_traces) == len(steps)
  finally:
    jcc.enable(lift_numpy=False)
  assert jcc.stats()["hits"] > 0


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


def _lr_schedule_steps(params, x, steps, start):
  """A training step whose closure reads a new Python float each step (a
  learning rate): a key that never repeats."""
  def step(p, lr):
    def update(p):
      g = jax.grad(lambda q: jnp.mean(jnp.tanh(x @ q["w"] + q["b"]) ** 2))(p)
      return jax.tree.map(lambda a, b: a - lr * b, p, g)
    return jax.jit(update)(p)
  for i in range(steps):
    params = step(params, 0.1 / (start + i))
  return params


def _live_executables_after(run, *args):
  import gc
  out = run(*args)
  jax.block_until_ready(out)
  gc.collect()
  return out, _compat.live_executables()


def test_never_repeating_keys_keep_no_more_alive_than_stock():
  """Keys that never repeat keep what stock keeps: no entry, no shared
  trace, and live executables within a small constant of stock's."""
  params = {"w": jnp.ones((16, 16)) * 0.1, "b": jnp.zeros(16)}
  x = jnp.ones((4, 16))
  jcc.disable()
  _lr_schedule_steps(params, x, 5, 1)   # JAX's own one-time executables
  want, stock_live = _live_executables_after(
      _lr_schedule_steps, params, x, 40, 10)
  jcc.enable()
  for start in (100, 200):   # run twice: a replay with fresh objects
    got, live = _live_executables_after(
        _lr_schedule_steps, params, x, 40, start)
    assert live <= 1.5 * stock_live + 4, (live, stock_live)
    # no entry at all, and no trace stored per step (a closure-free helper
    # of the step, the same every step, may be)
    assert jcc.stats()["entries"] == 0 and jcc.stats()["shared_traces"] <= 2
  np.testing.assert_allclose(got["w"], stock_off(
      _lr_schedule_steps, params, x, 40, 200)["w"], rtol=1e-6)


class _ElementwiseEq:
  """An array-like whose ``==`` is elementwise (its truth value raises)."""

  def __init__(self, v):
    self.v = np.asarray(v)

  def __eq__(self, other):
    return self.v == getattr(other, "v", other)

  def __hash__(self):
    return 0


def _closes_over_an_array_like(x, scale):
  a = _ElementwiseEq([1.0, 2.0, scale])
  return jax.jit(lambda v: v * 2.0 + float(a.v.sum()))(x)


def test_an_elementwise_eq_in_a_closure_is_never_called():
  """The key walks a Python object's state, never its ``__eq__``/``__hash__``
  (stock never compares closures): no crash, stock's values, and a changed
  attribute is a different key."""
  jcc.enable()
  x = jnp.ones(3)
  for _ in range(2):
    for scale in (3.0, 3.0, 4.0, 3.0):
      got = _closes_over_an_array_like(x, scale)
      want = stock_off(_closes_over_an_array_like, x, scale)
      np.testing.assert_array_equal(got, want)
      assert got.dtype == want.dtype and got.weak_type == want.weak_type


@needs_trace_lookup
def test_explaining_a_miss_of_a_recreated_partial():
  """``pe.explain``'s closure sentence (``jax_explain_cache_misses``) for a
  ``functools.partial``, which has no ``__code__`` of its own."""
  from jax_closure_cache.lookup import trace_lookup
  cc = trace_lookup.closure_cache

  def f(w, x):
    return jnp.sin(x) * w
  jcc.enable()
  first = functools.partial(f, jnp.ones(3))
  assert "first function" in cc.explain_miss(first)
  cc.find(first, ("sig",))   # remembered as its code's last key
  again = cc.explain_miss(functools.partial(f, jnp.zeros(3)))
  assert "seen before" in again, again


def _donating_calls(jit, options, n):
  """Fresh lambdas of one code, donating unusable buffers: the warnings
  each call gives."""
  import warnings
  x = jnp.array([1.0, 2.0], jnp.float32)
  y = jnp.array([1, 2], jnp.int32)
  warned = []
  for _ in range(n):
    f = jit(lambda a, b: a.sum() + jnp.float32(b.sum()), **options)
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter("always")
      f(x, y)
    warned.append(sum("donated buffers were not usable" in str(m.message)
                      for m in w))
  return warned


def test_every_fresh_function_warns_of_unusable_donations_as_stock():
  """XLA warns at each compile, which stock makes per function object:
  nothing that warned is shared, in the front or the trace lookup, and the
  options are validated at jit() time as stock's are."""
  jcc.enable()
  for _ in range(2):
    for options in ({"donate_argnames": ("a", "b")},
                    {"donate_argnums": (0, 1)}):
      want = stock_off(_donating_calls, STOCK_JIT, options, 4)
      assert want == [1, 1, 1, 1]
      assert _donating_calls(jax.jit, options, 4) == want
      assert _donating_calls(STOCK_JIT, options, 4) == want
  w = jnp.ones(2)
  for bad in ({"donate_argnums": (0, 3)}, {"donate_argnames": ("nope",)}):
    with pytest.raises(ValueError):
      STOCK_JIT(lambda a, b: a * w, **bad)
    with pytest.raises(ValueError):
      jax.jit(lambda a, b: a * w, **bad)


def _writes_at_trace_time(jit, w, x):
  log = []

  def f(v):
    log.append(v.shape)   # a trace-time write its caller reads after
    return v * w
  return jit(f)(x), len(log)


@needs_trace_lookup
@counts_side_effects
def test_the_trace_lookup_never_shares_a_trace_that_writes_state():
  """A function whose trace writes to what it reaches (JAX's own internal
  closures fill a cell their caller reads after the trace) is traced as
  stock traces it, every time: its write happens, as with stock."""
  jcc.enable()
  x = jnp.ones(3)
  for _ in range(2):
    for i in range(4):
      w = jnp.full((3,), float(i))
      got, writes = _writes_at_trace_time(STOCK_JIT, w, x)
      want, stock_writes = stock_off(_writes_at_trace_time, STOCK_JIT, w, x)
      np.testing.assert_array_equal(got, want)
      assert writes == stock_writes == 1


@needs_trace_lookup
def test_a_collection_under_a_store_lock_never_deadlocks():
  """The collector can run a dead anchor's weak-reference callback while
  this thread holds the trace store's lock (Python 3.12 collects at any
  bytecode): the callback defers its drop instead of blocking."""
  import gc
  from jax_closure_cache.lookup import trace_lookup
  cc = trace_lookup.closure_cache

  class _Cyclic:
    pass

  def attempt(k):
    gc.collect(0)
    gc.disable()
    a = _Cyclic()
    a.self = a   # dies only in a collection
    cc._put(("gc test", k), cc._Shared(), [a])
    del a
    # young collections only, often: cheap however large the heap is
    gc.set_threshold(k, 1 << 30, 1 << 30)
    gc.enable()
    cc.traces.put(("other", k), cc._Shared())

  def run():
    for k in range(1, 60):
      attempt(k)

  saved = gc.get_threshold()
  try:
    assert _store_then_clear(run, cc.traces.clear, timeout=120), \
        "deadlocked"
  finally:
    gc.set_threshold(*saved)
    gc.enable()
  gc.collect()   # every anchor dead: each drop done or deferred
  assert cc.traces.get(("no such key",)) is None   # drains what was deferred
  assert not [k for k in cc.traces.keys() if k[0] == "gc test"]


def _closes_over_library_values(x, i):
  import inspect
  sig = inspect.signature(lambda a, b=2: None)   # a standard-library value
  return jax.jit(lambda v: jax.nn.relu(v * (i + len(sig.parameters))))(x)


def test_library_value_types_are_keyed_by_value_and_hit():
  """Value types of the standard library and jax (a Signature, a jitted
  jax.nn function's options) are keyed by value: re-created closures over
  them hit, with stock's values."""
  jcc.enable()
  x = jnp.arange(3.0) - 1.0
  for _ in range(2):
    for i in (1, 1, 1):
      np.testing.assert_array_equal(_closes_over_library_values(x, i),
                                    stock_off(_closes_over_library_values,
                                              x, i))
  assert jcc.stats()["hits"] >= 3
  assert "unhashable" not in jcc.stats()["fallback_reasons"]


class _Tag(str):
  """A str whose ``==`` is elementwise."""

  def __eq__(self, other):
    return np.array([str.__eq__(self, other), True])

  __hash__ = str.__hash__


def _closes_over_a_tag(x):
  t = _Tag("a")
  return jax.jit(lambda v: v * 2.0 if t else v)(x)


def test_a_python_eq_over_a_c_value_type_is_never_called():
  jcc.enable()
  x = jnp.ones(3)
  for _ in range(4):
    np.testing.assert_array_equal(_closes_over_a_tag(x),
                                  stock_off(_closes_over_a_tag, x))


def _warns_at_trace_time(x, w):
  return jax.jit(lambda v: v * w + jnp.zeros(3, dtype=jnp.float64))(x)


def test_a_trace_time_warning_is_shown_as_stock_shows_it_and_still_shares():
  """A warning a trace issues (a float64 request without x64) is an effect
  stock makes at every trace: shown as often as stock shows it under the
  default filter and under ``always``, so such a code traces every call
  (tier B never skips it), while tier A still shares the executable."""
  import warnings
  jcc.enable()
  x = jnp.ones(3)

  def shown(run, action):
    with warnings.catch_warnings(record=True) as got:
      warnings.simplefilter(action)
      for i in range(6):
        run(_warns_at_trace_time, x, jnp.full(3, i + 2.0))
    return len(got)
  for action in ("default", "always"):
    want = shown(lambda f, *a: stock_off(f, *a), action)
    jcc.clear()
    with counting() as n:
      assert shown(lambda f, *a: f(*a), action) == want
    # tier A: the first structure met once (stock's), then shared compiles
    # for the rest
    assert n["compiles"] <= 3, n
  assert jcc.stats()["hits"] == 0


def _closes_over_a_big_numpy_constant(x, i):
  big = np.full((256, 256), float(i % 3), np.float32)   # 256 KiB, baked
  return jax.jit(lambda v: v.sum() + jnp.asarray(big).sum())(x)


def test_stores_are_bounded_by_the_bytes_their_entries_keep_alive():
  """An entry's captured constants count against the store's byte budget:
  past it the least recently used entries go (and what they baked)."""
  jcc.enable()
  x = jnp.ones(3)
  saved = jcc.max_bytes()
  jcc.set_max_bytes(600 * 1024)   # room for two 256 KiB constants
  try:
    for _ in range(2):
      for i in range(6):
        for _ in range(2):   # each key met twice: stored
          got = _closes_over_a_big_numpy_constant(x, i)
          np.testing.assert_array_equal(
              got, stock_off(_closes_over_a_big_numpy_constant, x, i))
      held = sum(e.nbytes for e in cache.STORE.entries_of("entries"))
      assert 0 < held <= 600 * 1024, held
  finally:
    jcc.set_max_bytes(saved)
  with pytest.raises(ValueError):
    jcc.set_max_bytes(0)


@needs_trace_lookup
def test_the_trace_store_is_bounded_by_the_bytes_of_its_constants():
  """The shared traces are a bounded table of the store, as the entries
  are: ``set_max_bytes`` bounds them too."""
  from jax_closure_cache.lookup import trace_lookup
  cc = trace_lookup.closure_cache
  from jax_closure_cache import _compat
  assert cache.STORE.owns(cc.traces) and cc.traces in cache.STORE.bounded_tables()
  cc.traces.clear()
  saved = jcc.max_bytes()
  jcc.set_max_bytes(3 * 4096)
  arr = np.zeros(1024, np.float32)   # 4 KiB, in a nested jit's jaxpr
  closed = jax.make_jaxpr(lambda x: jax.jit(lambda y: y + arr)(x))(
      jnp.zeros(1024))
  assert _compat.constants_nbytes(closed) == arr.nbytes
  try:
    for i in range(6):
      cc.traces.put(("bytes test", i), cc._Shared(
          answer=(closed, None), nbytes=_compat.constants_nbytes(closed)))
    kept = [k for k in cc.traces.keys() if k[0] == "bytes test"]
    assert kept == [("bytes test", i) for i in (3, 4, 5)]
    assert cc.traces.nbytes() == 3 * arr.nbytes
  finally:
    jcc.set_max_bytes(saved)
    cc.traces.clear()


_PARAMS = None   # rebound by the test below, as a training loop rebinds


def _predict(x):
  return jnp.tanh(x * _PARAMS)


def test_a_kept_function_whose_closed_over_array_was_donated_never_reads_state_anew():
  """A jitted function kept past its closed-over array's donation: stock's
  executable holds its own copy and answers the same signature with the
  old values; the cache passes the array itself, which is gone. That call
  raises JAX's deleted-buffer error (a documented limit), never answers
  from the state as it is now (the rebound global, which a retry as stock
  would read). (A new signature of the object is the documented limit of
  arrays reassigned before a new signature, not checked here.)"""
  global _PARAMS
  update = jax.jit(lambda p, g: p - 0.1 * g, donate_argnums=0)
  x = jnp.ones(4)

  def run():
    global _PARAMS
    _PARAMS = jnp.arange(4.0)
    outs = []
    for _ in range(4):
      eval_fn = jax.jit(lambda v: _predict(v))   # fresh each step
      before = np.asarray(eval_fn(x))
      _PARAMS = update(_PARAMS, jnp.ones(4))   # the old buffer donated
      try:
        after = np.asarray(eval_fn(x))
      except Exception as e:   # the cache's documented limit
        after = (type(e).__name__, "deleted" in str(e))
      outs.append((before, after))
    return outs

  want = stock_off(run)
  for b, a in want:   # stock: its own copy, the old values
    np.testing.assert_array_equal(a, b)
  jcc.enable()
  got = run()
  raised = 0
  for (b, a), (wb, wa) in zip(got, want):
    np.testing.assert_array_equal(b, wb)
    if isinstance(a, tuple):
      assert a[1] and a[0] in ("ValueError", "RuntimeError"), a
      raised += 1
    else:
      np.testing.assert_array_equal(a, wa)
  assert 0 < raised < len(got)   # the first object is stock's


_X64_SWITCHED = r"""
import functools, sys
import jax, jax.numpy as jnp, numpy as np
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
G = np.array([0.5, 3.25])        # a module global read by a fresh lambda
I = np.array([3, 2 ** 40])

def runs(a):
  yield "global", lambda: jax.jit(lambda x: x + G)(1)
  yield "jit", lambda: jax.jit(lambda x: x * 2 + a)(1)
  yield "partial", lambda: jax.jit(functools.partial(lambda a, x: x + a, a))(1)
  yield "scan", lambda: jax.lax.scan(
      lambda s, x: (s + a, x), jnp.zeros(a.shape, a.dtype), jnp.arange(2.0))[0]
  yield "fori", lambda: jax.lax.fori_loop(
      0, 3, lambda i, s: s + a, jnp.zeros(a.shape, a.dtype))

for a in (G, I):
  for name, run in runs(a):
    for x64 in (False, False, True, True, False, True):
      try:
        with jax.enable_x64(x64):
          r = run()
        print(name, x64, jax.typeof(r), np.asarray(r).tobytes().hex())
      except Exception as e:
        print(name, x64, type(e).__name__)
"""


def test_a_64_bit_numpy_constant_traced_again_under_x64_lowers_as_stocks():
  """A float64 or int64 NumPy array read by re-created functions, called
  with ``jax_enable_x64`` off twice and then on: JAX memoizes its
  conversion of the array (to float32) by the array alone, so a trace
  under x64 reads that copy while anything holds a trace of it, and its
  lowering raises ``ValueError``. Stock holds no such trace of a fresh
  function; the cache's shared stock object of a closure-free function
  held one, and the third call raised where stock's answered. One
  process per mode (the memoized copies are process-wide)."""
  want = script_lines(_X64_SWITCHED, "stock")
  assert not any("Error" in line for line in want), want
  for mode in ("on", "verify"):
    assert script_lines(_X64_SWITCHED, mode) == want, mode


_LOWERING_ERROR = r"""
import sys
import jax, numpy as np
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
npa = np.array([1.5, 2.5])
apply = jax.jit(lambda f, x: f(x), static_argnums=0)
for x64 in (False, True, True):
  try:
    with jax.enable_x64(x64):
      r = apply(lambda x: x * 1.5 + npa, 2)
    print(jax.typeof(r), np.asarray(r))
  except Exception as e:
    print(type(e).__name__, str(e))
"""


def test_an_error_while_lowering_quotes_the_locations_stock_quotes():
  """An error JAX raises while lowering quotes each failing equation's
  location: the chain of user frames that made it. Stock's long-lived
  jitted function holds its trace of a float64 array made without x64,
  so its trace under x64 reads JAX's float32 copy and fails to lower (the
  error ``test_a_64_bit_numpy_constant_...`` keeps the cache from causing
  where stock has none). The cache's message named its own frames in that
  chain; JAX records no frame of the package (as none of its own)."""
  want = script_lines(_LOWERING_ERROR, "stock")
  assert any(line.startswith("ValueError") for line in want), want
  for mode in ("on", "verify"):
    assert script_lines(_LOWERING_ERROR, mode) == want, mode


_PRNG_SWITCHED = r"""
import contextlib, sys, warnings
import jax, jax.numpy as jnp, numpy as np
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
K = jax.random.PRNGKey(3)      # a raw key, read as a module global
apply = jax.jit(lambda f, x: f(x), static_argnums=0)

def runs(s):
  yield "closure-free", lambda: jax.jit(lambda x: jax.random.PRNGKey(1) + x)(
      np.uint32(0))
  yield "global key", lambda: jax.jit(
      lambda x: jax.random.uniform(K, (2,)) + x)(1.0)
  yield "closure", lambda: jax.jit(
      lambda x: jax.random.normal(jax.random.PRNGKey(7), (2,)) * s + x)(1.0)
  yield "static", lambda: apply(
      lambda x: jax.random.bits(jax.random.PRNGKey(2), (2,)) + x, np.uint32(1))
  yield "fori", lambda: jax.lax.fori_loop(
      0, 2, lambda i, c: c + s * jax.random.uniform(
          jax.random.fold_in(jax.random.PRNGKey(5), i), (2,)), jnp.zeros(2))
  # (a trace reading the options with no equation of jax.random's left)
  w = jnp.float32(s)
  yield "eval_shape", lambda: jax.jit(lambda x: x * w + jax.eval_shape(
      lambda k: jax.random.PRNGKey(k), 0).shape[-1])(1.0)

settings = [("jax_default_prng_impl", v) for v in
            ("threefry2x32", "threefry2x32", "rbg", "rbg", "threefry2x32")]
settings += [("jax_legacy_prng_key", v) for v in ("allow", "warn", "warn",
                                                  "error", "allow")]
for option, value in settings + [("context rbg", "rbg")] * 2:
  if option.startswith("context"):   # a thread's own value
    context = jax.default_prng_impl(value)
  else:
    context = contextlib.nullcontext()
    jax.config.update(option, value)
  for i in range(2):
    for name, run in runs(0.5 + i):
      with warnings.catch_warnings(record=True) as w, context:
        warnings.simplefilter("always")
        try:
          r = run()
          got = (str(jax.typeof(r)), np.asarray(r).tobytes().hex())
        except Exception as e:
          got = type(e).__name__
      print(option, value, name, got, len(w))
"""


def test_prng_options_changed_between_calls_are_read_as_stock_reads_them():
  """``jax_default_prng_impl`` and ``jax_legacy_prng_key`` changed between
  calls of re-created functions that use ``jax.random``: JAX's trace
  context leaves them out, so stock's jitted object called again answers
  from its earlier trace, but each new object traces under the options in
  force (another key shape and values; a warning or an error for a raw
  key). The cache's canonical stock object, its shared entries and its
  shared traces answered new objects from a trace made under the first
  options. One process per mode."""
  want = script_lines(_PRNG_SWITCHED, "stock")
  assert len({line.split(" ", 3)[3] for line in want
              if "closure-free" in line}) > 1, want
  assert any(line.endswith(" 1") for line in want), want   # warned
  assert any("ValueError" in line for line in want), want   # refused
  for mode in ("on", "verify"):
    got = script_lines(_PRNG_SWITCHED, mode)
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w][:4]


class _NoP(Exception):
  """A user's own exception class."""


def test_an_error_of_the_users_trace_carries_stocks_context():
  """A re-created closure whose trace raises for a call's arguments (a new
  signature of a stored entry, a key's second meeting) and a fresh lambda
  as a static argument whose trace raises: the error raised is stock's,
  with stock's chain of causes and contexts. The lifted trace's own error
  (which stock's retry raises again), or the key's refusal of the static
  argument, was the context of stock's error."""
  x = jnp.ones((4,))
  apply = jax.jit(lambda f, v: f(v), static_argnums=0)

  def make(i):
    w = jnp.full((4,), float(i))

    def g(a, b):
      if "p" not in a:
        raise _NoP("no p")
      return a["p"] * w + b
    return g

  def chain(e):
    out = []
    while e is not None:
      out.append((type(e).__name__, str(e)))
      e = e.__cause__ or e.__context__
    return out

  def run():
    got = []
    calls = [lambda i=i, arg=arg: jax.jit(make(i))(arg, x)
             for i, arg in enumerate([{"p": x}] * 3 + [{"q": x}, {"p": x},
                                                       {"q": x}])]
    calls += [lambda: apply(lambda v: v * x[:3], x)] * 3
    # (a stored entry's own lowering, whose lifted trace fails: stock's)
    calls += [lambda i=i: jax.jit(make(i)).lower({"q": x}, x)
              for i in range(2)]
    for call in calls:
      try:
        got.append(np.asarray(call()).tobytes())
      except Exception as e:
        got.append(chain(e))
    return got

  want = stock_off(run)
  assert any(type(g) is list for g in want)
  replay_in_both_modes(run, clear=True)


class _Answers:
  """Answers every attribute read, ``__class__`` and ``__dict__`` too."""

  def __getattribute__(self, name):
    return 2.0


_answers = _Answers()


def test_an_object_answering_every_attribute_is_read_as_stock_reads_it():
  """A closed-over object whose ``__getattribute__`` answers every name
  with a float (its ``__class__`` and ``__dict__`` included), reached as a
  global and as a cell, by a fresh jitted closure, an eager ``scan`` body
  and a ``jit(grad)``: stock's values. The walk asked ``isinstance`` of
  it against an ABC, which asks ``__class__``, and raised ``TypeError``
  from every call (found by a differential pass)."""
  x = jnp.arange(1.0, 4.0)

  def run():
    out = []
    held = _Answers()
    for c in (1.0, 2.0, 1.0, 2.0):
      out.append(jax.jit(lambda y: y * _answers.zz)(x).tolist())
      out.append(jax.jit(lambda y: y * _answers.zz + c)(x).tolist())
      out.append(jax.jit(lambda y: y * held.zz + c)(x).tolist())
      out.append(float(jax.lax.scan(
          lambda s, v: (s + v * held.w * c, s), 0.0, x)[0]))
      out.append(jax.jit(jax.grad(lambda y: (y * held.w * c).sum()))(x)
                 .tolist())
    return out

  replay_in_both_modes(run, clear=True)
