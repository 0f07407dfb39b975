"""Identity first: a function object already called is answered as stock
answers it. Each test puts a twin object through the same steps with stock
``jax.jit`` and compares; a cache keyed only on closure contents would
retrace after the closure changes and give the twin's fresh answer instead
of its stale one."""

import gc
import inspect
import os
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import (STOCK_JIT, counting, replay_in_both_modes,
                      replay_like_stock, stock_off)

from jax_closure_cache.front import identity  # noqa: E402


def make(s):
  def f(x):
    return x * s

  def set_s(v):
    nonlocal s
    s = v
  return f, set_s


def test_first_object_of_a_code_is_stocks_own():
  """The seed's long-lived pattern: one object, called many times."""
  x = jnp.arange(3.0)
  f, _ = make(2.0)
  with counting() as c:
    out = jcc.jit(f)(x)
  assert c["compiles"] == 1
  np.testing.assert_array_equal(out, STOCK_JIT(make(2.0)[0])(x))
  assert jcc.stats()["misses"] == 1 and jcc.stats()["entries"] == 0


@pytest.mark.parametrize("objects_before", [0, 2],
                         ids=["first-object", "after-shared-entry"])
def test_cell_change_keeps_the_stale_trace_like_stock(objects_before):
  """JAX's test_jit_global_cache, for the first object of a code (stock's
  own) and for an object whose first call hit the shared entry."""
  x = jnp.arange(3.0)
  for _ in range(objects_before):
    jcc.jit(make(2.0)[0])(x)
  f, set_f = make(2.0)
  twin, set_twin = make(2.0)
  mine, theirs = jcc.jit(f), STOCK_JIT(twin)
  np.testing.assert_array_equal(mine(x), theirs(x))
  set_f(5.0)
  set_twin(5.0)
  with counting() as c:
    got = mine(x)
  assert c["traces"] == 0 and c["compiles"] == 0
  np.testing.assert_array_equal(got, theirs(x))
  np.testing.assert_array_equal(got, 2.0 * x)   # the stale trace, as stock
  # a new jit() of the same object: stock's trace cache is on the object
  np.testing.assert_array_equal(jcc.jit(f)(x), STOCK_JIT(twin)(x))


def test_new_signature_after_cell_change_retraces_with_current_values():
  x2, x3 = jnp.arange(2.0), jnp.arange(3.0)
  for _ in range(2):
    jcc.jit(make(2.0)[0])(x2)
  f, set_f = make(2.0)
  twin, set_twin = make(2.0)
  mine, theirs = jcc.jit(f), STOCK_JIT(twin)
  mine(x2)
  theirs(x2)
  set_f(5.0)
  set_twin(5.0)
  np.testing.assert_array_equal(mine(x3), theirs(x3))   # 5.0: a new trace
  np.testing.assert_array_equal(mine(x2), theirs(x2))   # 2.0: the old one


def test_a_changed_pinned_object_leaves_its_entry_the_first_states():
  """A pinned object whose closure changed, called with a signature its
  entry never traced, is traced by stock over its state now; the entry it
  was pinned to keeps its own key's state, for fresh objects of that
  state and for the pinned object's earlier signatures. Through ``jit``
  and an eager loop (a held body), fresh objects, both modes; each run
  meets the new signature for the first time (a size of its own)."""
  sizes = iter(range(5, 500))

  def run():
    x4, x8 = jnp.ones(4), jnp.ones(next(sizes))
    out = []
    for _ in range(3):   # stock's object, the shared entry's, a hit
      out.append(jax.jit(make(1.0)[0])(x4))
    f, set_f = make(1.0)
    jf = jax.jit(f)
    out.append(jf(x4))   # pinned to the entry
    set_f(2.0)
    out += [jf(x4), jf(x8), jf(x8), jf(x4)]   # 1.0, 2.0, 2.0, 1.0
    out += [jax.jit(make(1.0)[0])(x8) for _ in range(2)]   # 1.0
    for _ in range(3):
      body = make(3.0)[0]
      out.append(jax.lax.fori_loop(0, 2, lambda i, c: body(c), x4))
    body, set_body = make(3.0)
    loop = lambda i, c: body(c)
    out.append(jax.lax.fori_loop(0, 2, loop, x4))
    set_body(0.5)
    out += [jax.lax.fori_loop(0, 2, loop, x8),
            jax.lax.fori_loop(0, 2, loop, x4)]
    for _ in range(2):
      body = make(3.0)[0]
      out.append(jax.lax.fori_loop(0, 2, lambda i, c: body(c), x8))
    return [(o.dtype, o.weak_type, float(o[0])) for o in out]

  want = replay_in_both_modes(run, clear=True)
  assert [w[2] for w in want[3:10]] == [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0]


def _an_entry_met_twice(monkeypatch):
  """Promotion after 5 calls; a closure's code whose key has an entry:
  its first object stock's, its second the shared entry's."""
  monkeypatch.setattr(identity, "PROMOTE_AFTER_CALLS", 5)
  x = jnp.arange(3.0)
  w = jnp.full(3, 2.0)
  mk = lambda w: (lambda v: v * w + 1.0)
  for _ in range(2):
    jcc.jit(mk(w))(x)
  return mk, w, x


def test_long_lived_object_is_promoted_to_stocks_own_executable(monkeypatch):
  mk, w, x = _an_entry_met_twice(monkeypatch)
  f = jcc.jit(mk(w))
  with counting() as c:
    for _ in range(4):
      f(x)
  assert c["compiles"] == 0   # still on the shared entry
  with counting() as c:
    for _ in range(20):
      out = f(x)
  assert c["compiles"] == 1   # stock's own executable, once
  np.testing.assert_array_equal(out, STOCK_JIT(mk(w))(x))


def test_a_function_wrapped_anew_for_each_call_stays_on_its_entry(
    monkeypatch):
  """``jax.jit(f)(x)`` in a loop over one long-lived ``f``: no wrapper lives
  to keep stock's object, whose path for a new wrapper costs several times
  the entry's, so ``f`` is never promoted (no compile however many calls),
  and every answer is stock's."""
  mk, w, x = _an_entry_met_twice(monkeypatch)
  f = mk(w)
  jcc.jit(f)(x)
  with counting() as c:
    for _ in range(20):
      out = jcc.jit(f)(x)
  assert c["compiles"] == 0 and c["traces"] == 0
  np.testing.assert_array_equal(out, STOCK_JIT(mk(w))(x))


def test_long_lived_wrapper_calls_stocks_object_directly():
  """After its first call a stock-owned wrapper calls stock's jitted object
  itself (``__call__`` is stock's object), so no Python frame of the cache
  runs per call; every such wrapper of one class shares one direct class,
  which holds nothing of the user's."""
  import sys
  x = jnp.arange(3.0)
  made = []
  # two codes, so both are their code's first object: stock-owned
  for k, mk in ((2.0, lambda w: lambda v: v * w),
                (3.0, lambda w: lambda v: w * v)):
    f = jcc.jit(mk(jnp.full(3, k)))
    f(x)
    f(x)
    assert type(f.__call__) is type(STOCK_JIT(lambda v: v))
    assert f.__call__ is f.stock()
    assert isinstance(f, jcc.ClosureJitted)
    made.append(f)
  assert type(made[0]) is type(made[1])
  assert "__call__" in type(made[0]).__dict__
  package = os.path.dirname(jcc.__file__)
  frames = []

  def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(package):
      frames.append(frame.f_code.co_name)
  sys.setprofile(profile)
  try:
    out = made[1](x)
  finally:
    sys.setprofile(None)
  assert frames == []
  np.testing.assert_array_equal(out, 3.0 * x)


def test_rows_keep_nothing_alive():
  x = jnp.ones(4)
  refs = []
  for i in range(4):   # stock's, shared entry, hits
    w = jnp.full(1 << 16, float(i))
    refs.append(weakref.ref(w))
    f = jcc.jit((lambda w: (lambda v: v * w[0]))(w))
    f(x)
    f(x)   # a second call: the direct class for a stock-owned wrapper
    del w, f
  gc.collect()
  assert all(r() is None for r in refs)
  assert all(not t for t in identity.tables.values())


def test_bare_functions_of_one_code_share_what_jit_parsed_and_nothing_else():
  """Fresh functions of one code that fall back to stock's jitted object
  (their closure holds a random generator, which the key refuses) share
  the options ``jit()`` parsed for the first: a bare function's signature
  and source are its code's. One renamed, or with annotations or
  defaults, is parsed afresh: names, results and errors are stock's."""
  from jax_closure_cache import _compat
  rng = np.random.default_rng(0)
  w = jnp.arange(3.0)

  def make(kind):
    if kind == "annotated":
      def f(x: jax.Array):
        _ = rng   # a closure the key refuses
        return x * w
    elif kind == "default":
      def f(x, s=3.0):
        _ = rng   # a closure the key refuses
        return x * w * s
    else:
      def f(x):
        _ = rng   # a closure the key refuses
        return x * w
      if kind == "renamed":
        f.__name__ = "renamed"
    return f

  kinds = ["bare", "bare", "renamed", "bare", "annotated", "default", "bare"]

  def run():
    arrays, names = [], []
    for kind in kinds:
      f = make(kind)
      arrays.append(jax.jit(f)(jnp.ones(3)))
      names.append(jax.jit(make(kind)).trace(jnp.ones(3)).jaxpr.jaxpr
                   .debug_info.func_name)
      names.append(str(inspect.signature(jax.jit(make(kind)))))
      with pytest.raises(TypeError) as e:
        jax.jit(make(kind))(jnp.ones(3), 1.0, 2.0)
      names.append(str(e.value))
    return arrays, names

  replay_like_stock(run)
  infos = {kind: [_compat.jit_info(jax.jit(make(kind)).stock())
                  for _ in range(2)] for kind in set(kinds)}
  assert infos["bare"][0] is infos["bare"][1]
  for kind in ("renamed", "annotated", "default"):
    assert infos[kind][0] is not infos["bare"][0], kind


def test_a_stock_owned_function_wrapped_anew_reads_what_jit_parsed_again():
  """A long-lived function stock traced (its code's first object), wrapped
  anew for each call: stock's jitted objects are made from the options
  ``jit()`` parsed the first time, until what parsing read changes (its
  defaults, its name): every answer, debug name and error is stock's."""
  w = jnp.arange(3.0)

  def make(w):
    def f(x, scale=2.0):
      return x * w * scale
    return f

  def run():
    f = make(w)
    outs = [jax.jit(f)(jnp.ones(3)) for _ in range(3)]
    f.__defaults__ = (5.0,)
    outs += [jax.jit(f)(jnp.ones(3)) for _ in range(2)]
    f.__name__ = "renamed"
    traced = jax.jit(f).trace(jnp.ones(3))
    outs.append(traced.jaxpr.jaxpr.debug_info.func_name)
    with pytest.raises(TypeError) as e:
      jax.jit(f)(jnp.ones(3), 1.0, 2.0)
    outs.append(str(e.value))
    return outs

  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    got = run()
    assert got[-2:] == want[-2:]
    for g, w_ in zip(got[:-2], want[:-2]):
      np.testing.assert_array_equal(g, w_)


def test_a_function_holding_itself_in_an_attribute_is_not_kept_alive():
  """What the parse cache keeps beside a function (``wrapper.Face.parsed``)
  holds none of its other attributes: a function that refers to itself
  through one (a registry's back reference) dies with its last user."""
  import gc
  import weakref
  jcc.enable()

  def make():
    def f(x):
      return x + 1.0
    f.me = f
    return f
  f = make()
  jax.jit(f)(jnp.ones(2))
  jax.jit(f)(jnp.ones(2))   # a second object: the parse kept is read
  dead = weakref.ref(f)
  del f
  gc.collect()
  assert dead() is None


_RAISES_BELOW = [2]


def test_a_closure_free_function_whose_first_trace_raised_shares_no_object():
  """A closure-free function whose stock trace raised (a global it reads
  not yet set) is never answered through a shared stock object of its
  code: that object, called again after the global changed, holds a trace
  of the new state, and a later fresh object of the first state got that
  trace's result where stock raises. Fresh objects per round, each
  called under the failing state and then the good one, in both modes."""
  x = jnp.float32(0.0)

  def run():
    out = []
    for _ in range(4):
      _RAISES_BELOW[0] = 2

      def f(v):
        if _RAISES_BELOW[0] < 3:
          raise ValueError("not ready")
        return v + _RAISES_BELOW[0]
      try:
        out.append(float(jax.jit(f)(x)))
      except ValueError as e:
        out.append(str(e))
      _RAISES_BELOW[0] = 5
      out.append(float(jax.jit(f)(x)))   # the same object, traced anew
    return out

  try:
    want = replay_in_both_modes(run, clear=True)
  finally:
    _RAISES_BELOW[0] = 2
  assert want[0] == "not ready" and want[1] == 5.0


_SCALE_NOW = 1.0   # rebound by the test below, through the module's globals
_CFG = {"s": 1.0}


def _reads_globals(w):
  def f(x):
    return x * _SCALE_NOW * _CFG["s"] + w
  return f


def test_a_pinned_object_reading_changed_globals_leaves_its_entry_alone():
  """The same through a rebound global and a dict's item: a new signature
  of the pinned object reads them now, as stock's trace does; fresh
  objects of the first state get the first state's answer."""
  sizes = iter(range(5, 500, 2))
  g = globals()

  def run():
    w = jnp.zeros(())
    x4, x8, x9 = jnp.ones(4), jnp.ones(next(sizes)), jnp.ones(next(sizes))
    g["_SCALE_NOW"] = 1.0
    out = [jax.jit(_reads_globals(w))(x4) for _ in range(3)]
    jf = jax.jit(_reads_globals(w))
    out.append(jf(x4))
    g["_SCALE_NOW"] = 2.0
    out += [jf(x4), jf(x8), jf(x4), jf(x8)]
    g["_SCALE_NOW"] = 1.0
    _CFG["s"] = 3.0
    out += [jf(x9), jf(x4), jf(x8), jf(x9)]
    _CFG["s"] = 1.0
    out += [jax.jit(_reads_globals(w))(x) for x in (x8, x9, x8, x9)]
    return [(o.dtype, o.weak_type, float(o[0])) for o in out]

  want = replay_in_both_modes(run, clear=True)
  assert [w[2] for w in want[4:]] == [1.0, 2.0, 1.0, 2.0, 3.0, 1.0, 2.0,
                                      3.0, 1.0, 1.0, 1.0, 1.0]
