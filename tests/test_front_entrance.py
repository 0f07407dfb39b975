"""The fast front's entrance in C (``_front.Entrance``) answers ``jit(fun)``
exactly as the Python ``jit`` does: the same wrapper on its one path, the
Python ``jit`` itself on every other, and ``jit``'s name, signature and
pickling as a drop-in. Skipped where the extension is not built (it is
optional); ``.ci/run`` checks that it is built there.
"""

import gc
import inspect
import pickle
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache.front import entrance, inline, wrapper
from jax_closure_cache.front import generated
from conftest import STOCK_JIT, counting, assert_like_stock, replay_in_both_modes

_front = pytest.importorskip("jax_closure_cache.front._entrance")

CJ = wrapper.ClosureJitted


def make_inner(w):
  def inner(x):
    return jnp.tanh(x @ w)
  return inner


def _warm_front():
  """Two re-created closures of ``make_inner``'s code: the second stores the
  entry, whose matcher gives the code a front class."""
  x = jnp.ones((4, 4))
  for i in range(2):
    jcc.jit(make_inner(jnp.eye(4) * i))(x)
  assert make_inner(x).__code__ in inline.fronts
  return x


def test_jit_is_the_entrance_and_reads_as_jit():
  assert type(jcc.jit) is _front.Entrance
  assert jcc.jit.slow is entrance._python_jit
  assert jcc.jit.__name__ == "jit"
  assert jcc.jit.__doc__ == entrance._python_jit.__doc__
  assert (inspect.signature(jcc.jit)
          == inspect.signature(entrance._python_jit))
  assert repr(jcc.jit) == repr(entrance._python_jit)
  assert pickle.loads(pickle.dumps(jcc.jit)) is jcc.jit


def test_entrance_makes_the_wrapper_python_jit_makes():
  x = _warm_front()
  w = jnp.eye(4) * 5
  f, g = make_inner(w), make_inner(w)
  by_c, by_py = jcc.jit(f), entrance._python_jit(g)
  assert type(by_c) is type(by_py)
  assert type(by_c) is not CJ and type(by_c).__base__ is CJ
  assert by_c._fun is f and by_c.__wrapped__ is f
  assert by_c._row is None and by_c._stock is None
  # the one Python routine that sets a wrapper's slots makes the same
  from jax_closure_cache.front import wrapper
  by_fill = wrapper.fill(object.__new__(type(by_c)), f)
  assert [getattr(by_fill, s) for s in ("_fun", "_code", "_spec", "_stock",
                                         "_row")] == \
      [getattr(by_c, s) for s in ("_fun", "_code", "_spec", "_stock", "_row")]
  with counting() as c:
    out = by_c(x)
  assert c == {"traces": 0, "compiles": 0}
  assert_like_stock(out, make_inner(w), x)
  # another array: the same entry, called with this closure's own leaves
  # (stale leaves would fail the comparison with stock)
  h = make_inner(jnp.eye(4) * 2.5)
  assert_like_stock(jcc.jit(h)(x), make_inner(jnp.eye(4) * 2.5), x)


def test_every_other_call_goes_to_python_jit():
  x = _warm_front()
  calls = []

  def slow(*args, **kwargs):
    calls.append((args, kwargs))
    return "slow"

  e = _front.Entrance(slow, inline.fronts, CJ, CJ._fun, CJ._stock,
                      CJ._row)
  f = make_inner(jnp.eye(4))
  assert type(e(f)) is inline.fronts[f.__code__]   # the one path
  assert calls == []

  def closure_free(x):
    return x

  def other(x):   # a closure whose code has no front
    return x * f(x)

  part = jax.tree_util.Partial(f)
  cases = [((f,), {"static_argnums": 0}), ((), {"donate_argnums": 0}),
           ((), {"fun": f}), ((closure_free,), {}), ((other,), {}),
           ((part,), {}), ((f, f), {}), ((), {}), ((1,), {})]
  for args, kwargs in cases:
    calls.clear()
    assert e(*args, **kwargs) == "slow"
    assert calls == [(args, kwargs)], (args, kwargs)

  # a class filed for the code that is not the base's direct subclass
  class Unrelated:
    pass
  e2 = _front.Entrance(slow, {f.__code__: Unrelated}, CJ, CJ._fun, CJ._stock,
                       CJ._row)
  calls.clear()
  assert e2(f) == "slow" and calls == [((f,), {})]
  del x


def test_constructor_checks_its_slots():
  with pytest.raises(TypeError, match="member descriptor"):
    _front.Entrance(print, {}, CJ, "fun", CJ._stock, CJ._row)
  with pytest.raises(TypeError):
    _front.Entrance(print, [], CJ, CJ._fun, CJ._stock, CJ._row)
  with pytest.raises(TypeError, match="callable"):
    _front.Entrance(1, {}, CJ, CJ._fun, CJ._stock, CJ._row)


def test_entrance_holds_nothing_of_the_call():
  x = _warm_front()
  f = make_inner(jnp.eye(4) * 3)
  ref = weakref.ref(f)
  wrapper = jcc.jit(f)
  np.testing.assert_allclose(wrapper(x), jnp.tanh(x @ (jnp.eye(4) * 3)))
  del f, wrapper
  gc.collect()
  assert ref() is None


def test_entrance_helper_without_the_extension(monkeypatch):
  import sys
  import jax_closure_cache.front as front
  monkeypatch.setitem(sys.modules, "jax_closure_cache.front._entrance", None)
  monkeypatch.delattr(front, "_entrance")
  made = generated.entrance(entrance._python_jit, {}, CJ,
                            wrapper.FILLED_SLOTS)
  assert made is entrance._python_jit


def test_the_hit_and_the_slow_paths_call_share_one_text():
  """The hit (generated per code) and the wrapper's ``_call_entry`` (slow
  path, later calls of a pinned object, static arguments) run one text,
  ``generated.CALL``, so they cannot drift apart: an error at trace time
  through either is answered by stock (``RETRY_STOCK``)."""
  assert generated.HIT.endswith(generated.CALL)
  assert wrapper.ClosureJitted._call_entry.__code__.co_filename == (
      generated.FILENAME)

  def make(s):
    return lambda v: v.reshape(3) * s   # raises at trace time for (3, 2)

  x, bad = jnp.ones(3), jnp.ones((3, 2))
  with jcc.enabled(verify=True):
    for s in (1.0, 2.0, 1.0, 2.0, 1.0):
      jcc.jit(make(s))(x)   # stored, then hit through a front
    hits = jcc.stats()["hits"]
    w = jcc.jit(make(1.0))
    w(x)                     # the front's hit
    assert jcc.stats()["hits"] == hits + 1
    with pytest.raises(TypeError) as got:
      w(bad)                 # a later call: _call_entry, a new signature
    with pytest.raises(TypeError) as want:
      STOCK_JIT(make(1.0))(bad)
    assert str(got.value) == str(want.value)
    with pytest.raises(TypeError):
      jcc.jit(make(2.0))(bad)   # a first call's hit, a new signature


def test_launchers_and_binders_get_the_wrapper_of_front_makes():
  """Eager control flow's launchers and static arguments' binders get their
  front wrapper from the entrance in C: the wrapper Python's ``of_front``
  makes, slot for slot, and theirs set after as before."""
  from jax_closure_cache.control_flow import launchers
  from jax_closure_cache.front import static_args
  jcc.enable()   # eager control flow through the launchers
  init = jnp.ones(3)
  apply = jcc.jit(lambda f, v: f(v), static_argnums=0)
  for i in range(3):   # their codes get front classes
    w = jnp.eye(3) * (i + 1.0)
    jax.lax.fori_loop(0, 4, lambda k, v: v @ w + k, init)
    apply(lambda v: v @ w, init)
  w = jnp.eye(3)
  body = lambda k, v: v @ w + k   # noqa: E731
  made = [(launchers._front_of,
           launchers._fori_launcher(0, 4, body, None)),
          (static_args._front_of,
           static_args._binder_at(apply._fun, lambda v: v @ w, 0))]
  for front_of, fun in made:
    assert type(front_of) is _front.Entrance   # the C path, built here
    assert fun.__code__ in inline.client_fronts
    by_c = front_of(fun)
    by_py = wrapper.of_front(inline.client_fronts, fun)
    assert type(by_c) is type(by_py) and type(by_c).__base__ is not CJ
    assert [by_c._fun, by_c._stock, by_c._row] == [fun, None, None]
    assert [by_py._fun, by_py._stock, by_py._row] == [fun, None, None]
  w_launch = launchers._Launcher.made(made[0][1], body)
  assert w_launch._user_fun is body and w_launch._fun is made[0][1]


def _layer(w, x):
  return jnp.tanh(x @ w)


def test_a_partial_gets_its_functions_front_in_c_and_in_python():
  """``jax.jit(functools.partial(f, w))`` made per call: where ``f``'s code
  has a front class, the C entrance and the Python hot case both make that
  class's wrapper (the class's matchers tell a partial's key from a
  closure's); a partial subclass, a partial of a builtin, one with
  keywords given to ``jit`` and one of a code without a front go the
  Python ``jit``'s general way. Every call gives stock's result, hits
  with no trace, and a closure of the same code as a partial's function
  (the front checks partials first) is answered as stock answers it."""
  import functools
  x = jnp.ones((4, 4))
  with jcc.enabled(verify=True):
    for i in range(3):
      jcc.jit(functools.partial(_layer, jnp.eye(4) * i))(x)
    assert _layer.__code__ in inline.fronts
    front = inline.fronts[_layer.__code__]
    w = jnp.eye(4) * 7
    p, q = functools.partial(_layer, w), functools.partial(_layer, w)
    by_c, by_py = jcc.jit(p), entrance._python_jit(q)
    assert type(by_c) is front and type(by_py) is front
    assert by_c._fun is p and by_py._fun is q
    assert by_c._row is None and by_c._stock is None
    with counting() as c:
      out = by_c(x)
    assert c == {"traces": 0, "compiles": 0}
    assert_like_stock(out, functools.partial(_layer, w), x)
    assert_like_stock(by_py(x), functools.partial(_layer, w), x)

    class Sub(functools.partial):
      pass
    others = [Sub(_layer, w), functools.partial(jnp.tanh),
              functools.partial(make_inner(w))]
    for other in others:
      made = jcc.jit(other)
      assert type(made) is not front, other
    assert_like_stock(jcc.jit(Sub(_layer, w))(x), Sub(_layer, w), x)
    assert type(jcc.jit(p, inline=True)) is not front
    # keywords bound by the partial: the front's matcher refuses the key
    for v in (w, w * 2):
      assert_like_stock(jcc.jit(functools.partial(_layer, x=x))(v),
                        functools.partial(_layer, x=x), v)


def test_a_front_dropped_by_a_mode_change_comes_back_on_the_next_hit():
  """Fronts are made for one spec and verify mode, so turning verify mode
  on and off drops them; the next hit through the generic path makes its
  code's front again from the matchers it has (it stayed on the generic
  path, about a microsecond more a hit, until a new key was stored).
  Leaving ``enabled()``, which sets the defaults it found, drops nothing.
  The same for eager control flow's launchers (their own table)."""
  from jax_closure_cache import _compat, cache
  x = _warm_front()
  code = make_inner(x).__code__
  init = jnp.ones(4)

  def body_of(w):
    return lambda k, v: v @ w + k

  jcc.enable()
  try:
    for i in range(3):
      jax.lax.fori_loop(0, 2, body_of(jnp.eye(4) * (i + 1.0)), init)
    launcher_codes = set(inline.client_fronts)
    assert launcher_codes
    with jcc.enabled():
      pass
    assert code in inline.fronts and set(inline.client_fronts) == launcher_codes
    on = cache.verifying()
    cache.set_verify(not on)
    cache.set_verify(on)
    assert code not in inline.fronts and not inline.client_fronts
    w = jnp.eye(4) * 6
    with counting() as c:
      out = jcc.jit(make_inner(w))(x)   # the generic path's hit
      got = jax.lax.fori_loop(0, 2, body_of(w), init)
    assert c == {"traces": 0, "compiles": 0}
    assert_like_stock(out, make_inner(w), x)
    stock_fori = _compat.STOCK_CONTROL_FLOW["fori_loop"]
    np.testing.assert_array_equal(got, stock_fori(0, 2, body_of(w), init))
    assert type(jcc.jit(make_inner(w))) is inline.fronts[code]
    assert set(inline.client_fronts) == launcher_codes
  finally:
    jcc.disable()


def test_a_full_table_of_fronts_is_not_remade_hit_by_hit(monkeypatch):
  """With more codes in turn than the table of fronts holds, a generic
  path's hit does not clear the table to make its code's front (that made
  a class on nearly every hit, ten times the hit's cost): fronts are
  remade while the table has room."""
  made = []
  front_class = generated.front_class

  def counted(*args, **kwargs):
    made.append(1)
    return front_class(*args, **kwargs)
  monkeypatch.setattr(inline, "FRONTS_MAX", 2)
  monkeypatch.setattr(generated, "front_class", counted)
  ns = {}
  makers = []
  for k in range(4):   # four codes (code objects with equal text are equal)
    exec(f"def make(w):\n  def inner(x):\n    return x * w + {k}\n"
         "  return inner\n", ns)
    makers.append(ns["make"])
  x = jnp.ones(3)
  jcc.enable()
  for i in range(3):   # each code stores its entry
    for make in makers:
      jcc.jit(make(jnp.full(3, float(i))))(x)
  made.clear()
  for i in range(10):
    for k, make in enumerate(makers):
      w = jnp.full(3, float(i))
      np.testing.assert_array_equal(jcc.jit(make(w))(x), x * w + k)
  assert len(inline.fronts) <= 2
  assert len(made) <= 2, len(made)


def test_a_partial_given_another_function_after_jit_is_answered_as_stock():
  """A partial is looked up by its function's code when jitted; one given
  another function since (``partial.__setstate__``), of the same globals
  and closure shape, must not be answered by the first function's entry:
  the matcher checks a partial's function's type and code."""
  import functools

  def make_add(w):
    def f(x, y):
      return x + w * y
    return f

  def make_mul(w):
    def f2(x, y):
      return x * w * y
    return f2

  def run():
    out = []
    for i in range(6):
      w = jnp.float32(i + 1)
      p = functools.partial(make_add(w), jnp.float32(10.0))
      jf = jax.jit(p)
      if i >= 3:
        p.__setstate__((make_mul(w), (jnp.float32(10.0),), {}, None))
      out.append(float(jf(jnp.float32(2.0))))
    return out

  replay_in_both_modes(run, clear=True)


def test_leaves_known_in_c_answers_as_the_python_loop():
  """The hit's value check (``structure.leaves_known``) gives the same
  answer in C and in Python: a leaf kept and alive whose bits its mask
  allows; a leaf not kept, kept for another object of the same id, or
  refused by its mask; lengths that differ; and a malformed table entry
  (C: False)."""
  from jax_closure_cache.lowering import structure
  a, b = jnp.ones(3) * 2, jnp.zeros(2) - 0.0
  other = np.ones(2)
  table = {id(a): (weakref.ref(a), (0, None)),
           id(b): (weakref.ref(b), (structure.ALL_ZERO, None))}
  cases = [([a], (structure.REFUSED,), True),
           ([a, b], (1, 1), True),
           ([a, b], (1, structure.ALL_ZERO), False),
           ([a, other], (1, 1), False),
           ([a], (1, 1), False),
           ((a, b), [1, 1], True),
           ([], (), True)]
  for leaves, masks, want in cases:
    assert _front.leaves_known(leaves, masks, table) is want
    assert structure.leaves_known(leaves, masks, table) is want
  stale = {id(other): (weakref.ref(a), (0, None))}   # another object's id
  assert _front.leaves_known([other], (1,), stale) is False
  assert structure.leaves_known([other], (1,), stale) is False
  assert _front.leaves_known([a], (1,), {id(a): "not an answer"}) is False
  with pytest.raises(TypeError):
    _front.leaves_known([a], (1,), [])
  assert generated.leaves_known_check() is _front.leaves_known
