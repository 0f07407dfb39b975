"""Functions as static arguments, eager custom solves and closure_convert.

Every fresh function below closes over a different array, and every result
is compared with stock on a fresh function object, so a key that ignored the
closed-over values would fail here."""

import ast
import functools
import os
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as spl
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import STOCK_JIT, counting, replay_in_both_modes, stock_off, warm

x = jnp.ones(3)


def _apply(f, v):
  return f(v)


def _matvec(w):
  return lambda v: jnp.tanh(w @ v)


def _stock_apply(f, v):
  return STOCK_JIT(_apply, static_argnums=0)(f, v)


def test_fresh_closure_as_a_static_argument_hits():
  apply = jcc.jit(_apply, static_argnums=0)
  ws = [jnp.eye(3) * (i + 1.0) for i in range(6)]
  warm(lambda: apply(_matvec(ws[0]), x))
  for w in ws[1:]:
    with counting() as c:
      out = apply(_matvec(w), x)
    assert c["compiles"] == 0 and c["traces"] == 0
    np.testing.assert_array_equal(out, _stock_apply(_matvec(w), x))


def test_a_fresh_static_closure_is_answered_by_the_binders_generated_front(
    monkeypatch):
  """With only static arguments as options, each call's binder (the jitted
  function with the fresh closure bound) is a wrapper of the binder code's
  generated front class, from its second stored key on; with other options
  too (``donate_argnums``) it is the binder class itself. Both answer as
  stock does."""
  from jax_closure_cache.front import inline, static_args
  made = []
  original = static_args._Bound.made.__func__

  def spy(cls, *args):
    w = original(cls, *args)
    made.append(type(w))
    return w
  monkeypatch.setattr(static_args._Bound, "made", classmethod(spy))
  for options in ({}, {"donate_argnums": 1}):
    apply = jcc.jit(_apply, static_argnums=0, **options)
    stock = STOCK_JIT(_apply, static_argnums=0, **options)
    for s in (1.0, 2.0, 3.0):   # the first object is stock's, then a miss
      apply(_matvec(jnp.eye(3) * s), jnp.ones(3))
    del made[:]
    for s in (4.0, 5.0, 6.0):
      w = jnp.eye(3) * s
      with counting() as c:
        out = apply(_matvec(w), jnp.ones(3))
      assert c["compiles"] == 0 and c["traces"] == 0
      np.testing.assert_array_equal(out, stock(_matvec(w), jnp.ones(3)))
    fronts = set(inline.client_fronts.values())
    assert len(made) == 3, made
    if options:
      assert all(cls is static_args._Bound for cls in made), made
    else:
      assert all(cls in fronts and cls.__base__ is static_args._Bound
                 for cls in made), made


_SCALE = 2.0


def _module_level_square(v):
  return v * v


def test_closure_free_fresh_functions_as_static_arguments_take_the_quick_path(
    monkeypatch):
  """A fresh lambda that closes over nothing (it reads a global) passed as
  the one static argument takes the quick path closures take (no search
  for functions among the static values, no identity lookup: nothing
  refers to it weakly, so no row can name it), with stock's results as
  the global it reads is rebound, beside a module-level function passed
  again (its row answers it) and fresh closures, in verify mode too."""
  from jax_closure_cache.front import static_args
  quick = []
  original = static_args.StaticArgsJitted._call_quick
  monkeypatch.setattr(static_args.StaticArgsJitted, "_call_quick",
                      lambda self, *a: quick.append(1) or original(self, *a))
  global _SCALE
  v = jnp.arange(3.0)

  def run():
    global _SCALE
    apply = jax.jit(_apply, static_argnums=0)
    out = []
    for i in range(6):
      _SCALE = 2.0 if i < 3 else 3.0
      out.append(apply(lambda u: u * _SCALE + 1.0, v))
      out.append(apply(_module_level_square, v + i))
      w = jnp.full(3, float(i))
      out.append(apply(lambda u: u - w, v))
    return [(np.asarray(o).tobytes(), str(o.dtype), o.weak_type)
            for o in out]

  try:
    replay_in_both_modes(run, clear=True)
  finally:
    _SCALE = 2.0
  assert quick   # (the closure-free lambda's calls among them)
  del quick[:]
  jcc.enable()
  apply = jax.jit(_apply, static_argnums=0)

  def halve():   # a fresh closure-free function of one code per call
    return lambda u: u * 0.5
  for i in range(4):
    apply(halve(), v)
  with counting() as c:
    apply(halve(), v)
  assert quick and c["traces"] == 0 and c["compiles"] == 0


class _EqualToAll:
  """A static value whose ``==`` says equal to every other and whose hash
  reads one field: stock's cache of one jitted function takes two such
  values as one, but a fresh function's trace reads its other field."""

  def __init__(self, a, b):
    self.a, self.b = a, b

  def __eq__(self, other):
    return True

  def __hash__(self):
    return hash(self.a)


def test_plain_static_values_beside_a_fresh_function_are_keyed_exactly():
  """Beside a function among the static arguments, the other static values
  are keyed as any closed-over value (atoms by exact type and bits, objects
  by their state), never by ``==``: ``0.0`` and ``-0.0``, ``(1, 2.0)`` and
  ``(1, 2)``, and two objects whose ``==`` says equal trace apart, as each
  fresh function's stock trace does."""
  def apply(f, x, s):
    return f(x) * (s.b if isinstance(s, _EqualToAll) else
                   s[1] if isinstance(s, tuple) else s)

  def run():
    out = []
    for s in (0.0, -0.0, 0.0, -0.0, (1, 2.0), (1, 2), (1, 2.0),
              _EqualToAll(1, 2.0), _EqualToAll(1, 3.0), _EqualToAll(1, 2.0)):
      w = jnp.float32(2.0)
      r = jax.jit(apply, static_argnums=(0, 2))(lambda v: v * w,
                                                jnp.float32(1.0), s)
      out.append((np.asarray(r).tobytes(), str(r.dtype), r.weak_type))
    return out
  jcc.enable()
  want = stock_off(run)
  assert run() == want
  assert run() == want   # hits of what the first run stored


def test_plain_static_values_of_a_fresh_function_are_keyed_exactly():
  """With no function among the static arguments, a re-created function's
  plain static values are keyed exactly too: ``0.0`` and ``-0.0``,
  ``float32(0.0)`` and ``float32(-0.0)``, ``(1, 2.0)`` and ``(1, 2)``,
  ``frozenset({1})`` and ``frozenset({True})``, and objects whose ``==`` says equal trace apart across function objects, as
  each fresh object's stock trace does; one object called again with a
  value its stock cache takes as equal gets that earlier answer, as stock's
  own cache of that object gives it."""
  def run():
    out = []
    seq = (0.0, -0.0, 0.0, -0.0, np.float32(0.0), np.float32(-0.0),
           np.float32(0.0), (1, 2.0), (1, 2), (1, 2.0), 1, 1.0, True, 1,
           frozenset({1}), frozenset({True}), frozenset({1}),
           _EqualToAll(1, 2.0), _EqualToAll(1, 3.0), _EqualToAll(1, 2.0))
    for s in seq:
      w = jnp.float32(2.0)

      def f(x, s):
        v = (s.b if isinstance(s, _EqualToAll) else
             s[1] if isinstance(s, tuple) else
             next(iter(s)) if isinstance(s, frozenset) else s)
        return x * w * v, jnp.asarray(v)
      g = jax.jit(f, static_argnums=1)
      got = [g(jnp.float32(1.0), s)]
      # the same object again, with every value: its own (stock's) cache
      got += [g(jnp.float32(1.0), t) for t in seq[:4] + seq[14:]]
      out.append([(np.asarray(r).tobytes(), str(r.dtype), r.weak_type)
                  for pair in got for r in pair])
    return out
  jcc.enable()
  want = stock_off(run)
  assert run() == want
  assert run() == want   # hits of what the first run stored


def test_static_partial_bound_method_and_jitted_function_hit():
  class Layer:
    def __init__(self, w):
      self.w = w

    def __call__(self, v):
      return self.w @ v

    def forward(self, v):
      return jnp.sin(self.w @ v)

  apply = jcc.jit(_apply, static_argnums=0)
  makers = {
      "partial": lambda w: functools.partial(jnp.dot, w),
      "bound method": lambda w: Layer(w).forward,
      "jitted": lambda w: jcc.jit(lambda v: w @ v + 1.0),
  }
  for name, make in makers.items():
    warm(lambda: apply(make(jnp.eye(3)), x))
    for i in (2.0, 3.0):
      f = make(jnp.eye(3) * i)
      with counting() as c:
        out = apply(f, x)
      assert c["compiles"] == 0, name
      want = STOCK_JIT(_apply, static_argnums=0)(make(jnp.eye(3) * i), x)
      np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=name)


def test_static_function_by_keyword_and_other_static_values():
  def scaled(v, f, n):
    return f(v) * n
  jitted = jcc.jit(scaled, static_argnames=("f", "n"))
  warm(lambda: jitted(x, f=_matvec(jnp.eye(3)), n=2))
  # a plain static value is keyed by value, as stock does: n=3, a new key,
  # is stock's when met once and compiles its entry when met again
  for n in (2, 3, 3):
    w = jnp.eye(3) * n
    out = jitted(x, f=_matvec(w), n=n)
    want = STOCK_JIT(scaled, static_argnames=("f", "n"))(x, f=_matvec(w), n=n)
    np.testing.assert_array_equal(out, want)
  w = jnp.eye(3) * 5
  with counting() as c:
    jitted(x, f=_matvec(w), n=3)
  assert c["compiles"] == 0
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 1}


def test_long_lived_static_function_is_stocks():
  """Identity first: the same function object passed again is answered as
  stock answers it, stale trace included, on a twin put through the same
  steps."""
  def make():
    box = [jnp.eye(3)]
    return box, (lambda v: box[0] @ v)
  box, f = make()
  twin_box, twin = make()
  apply = jcc.jit(_apply, static_argnums=0)
  stock = STOCK_JIT(_apply, static_argnums=0)
  for step in range(3):
    got, want = apply(f, x), stock(twin, x)
    np.testing.assert_array_equal(got, want)
    box[0] = twin_box[0] = jnp.eye(3) * (step + 2)


def test_a_held_closure_after_fresh_ones_keeps_its_first_answer():
  """After fresh closures have taught the wrapper the call's shape (its
  quick path), a closure the user keeps and passes again is still answered
  as its first call decided (stock's stale trace included), and a weakly
  referenced one as stock answers it; each against stock on twins put
  through the same steps."""
  def make(scale):
    box = [jnp.eye(3) * scale]
    return box, (lambda v: box[0] @ v)
  apply = jcc.jit(_apply, static_argnums=0)
  stock = STOCK_JIT(_apply, static_argnums=0)
  for i in range(4):   # fresh closures, each its first call
    _, f = make(i + 1.0)
    _, twin = make(i + 1.0)
    np.testing.assert_array_equal(apply(f, x), stock(twin, x))
  for weakly_referenced in (False, True):
    box, f = make(5.0)
    twin_box, twin = make(5.0)
    refs = [weakref.ref(f), weakref.ref(twin)] if weakly_referenced else []
    for step in range(3):
      np.testing.assert_array_equal(apply(f, x), stock(twin, x))
      box[0] = twin_box[0] = jnp.eye(3) * (step + 7)
    assert [r() for r in refs] == ([f, twin] if weakly_referenced else [])


_OFFSET = 2.0


def _offset_by(c):
  return lambda v: v * c + _OFFSET


def test_a_closure_held_however_it_is_passed_keeps_its_first_answer():
  """After fresh closures have taught the wrapper the call's shape, a
  closure held by the caller in a ``functools.partial`` of the jitted
  function, in a tuple passed as ``*t`` (the call's own arguments tuple),
  or in a local passed through ``__call__``, then passed again after a
  global it reads changed, is answered from its first call, as stock's
  cache of static functions by identity answers it."""
  global _OFFSET

  def run():
    global _OFFSET
    _OFFSET = 2.0
    apply = jax.jit(_apply, static_argnums=0)
    for _ in range(4):   # fresh closures: the shape is learnt, then hits
      apply(_offset_by(1.0), x)
    held = functools.partial(apply, _offset_by(1.0))
    t = (_offset_by(1.0), x)
    g = _offset_by(1.0)
    calls = (lambda: held(x), lambda: apply(*t),
             lambda: apply.__call__(g, x))
    out = [np.asarray(c()) for c in calls]
    _OFFSET = 5.0
    return out + [np.asarray(c()) for c in calls]

  try:
    want = stock_off(run)
    for verify in (False, True):
      jcc.enable(verify=verify)
      got = run()
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
  finally:
    _OFFSET = 2.0
    jcc.enable()


def test_a_held_closures_row_goes_with_every_clear():
  """A long-lived wrapper keeps its rows' table: every clear empties that
  very table, so a held closure passed again after ``jax.clear_caches()``,
  ``jcc.clear()`` or a release of the traces is answered from a new trace,
  as stock's cleared cache answers it."""
  from jax_closure_cache import cache
  global _OFFSET

  def run(clear):
    global _OFFSET
    _OFFSET = 2.0
    apply = jax.jit(_apply, static_argnums=0)
    for _ in range(4):   # fresh closures: the shape is learnt, then hits
      apply(_offset_by(1.0), x)
    g = _offset_by(1.0)
    out = [np.asarray(apply(g, x)), np.asarray(apply(g, x))]
    _OFFSET = 5.0
    clear()
    return out + [np.asarray(apply(g, x))]

  try:
    want = stock_off(lambda: run(jax.clear_caches))
    for clear in (jax.clear_caches, jcc.clear, cache.STORE.release_traces):
      jcc.enable()
      got = run(clear)
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
  finally:
    _OFFSET = 2.0


def _with_cache_off(call):
  """``call()`` with the cache off (stock JAX), then on again."""
  jcc.disable()
  try:
    return call()
  finally:
    jcc.enable()


def test_donate_argnums_still_name_the_users_arguments():
  def step(f, p, v):
    return f(v) + p
  jitted = jcc.jit(step, static_argnums=0, donate_argnums=(1,))
  stock = STOCK_JIT(step, static_argnums=0)
  for i in range(4):
    w = jnp.eye(3) * i
    out = jitted(_matvec(w), jnp.full(3, float(i)), x)
    want = stock(_matvec(w), jnp.full(3, float(i)), x)
    np.testing.assert_array_equal(out, want)


def test_eager_cg_gmres_and_custom_root_with_fresh_functions():
  jcc.enable()
  lin = lambda w: (lambda v: w @ v)
  b = jnp.arange(1.0, 4.0)
  for solver in (spl.cg, spl.gmres):
    warm(lambda: solver(lin(jnp.eye(3) * 2.0), b))
    for s in (3.0, 4.0):
      a = jnp.eye(3) * s + 0.1
      with counting() as c:
        got = solver(lin(a), b)[0]
      assert c["compiles"] == 0, solver.__name__
      want = _with_cache_off(lambda: solver(lin(a), b)[0])
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=solver.__name__)

  def root(w):
    return lambda y: w * y - 1.0
  newton = lambda f, y0: jax.lax.while_loop(
      lambda y: jnp.abs(f(y)).max() > 1e-6, lambda y: y - f(y) / 2.0, y0)
  tangent = lambda g, y: y / 2.0
  y0 = jnp.full(3, 0.1)
  warm(lambda: jax.lax.custom_root(root(2.0 * jnp.ones(3)), y0, newton,
                                   tangent))
  for s in (2.0, 2.5):
    w = s * jnp.ones(3)
    with counting() as c:
      got = jax.lax.custom_root(root(w), y0, newton, tangent)
    assert c["compiles"] == 0
    want = _with_cache_off(
        lambda: jax.lax.custom_root(root(w), y0, newton, tangent))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_eager_cg_with_fresh_functions_in_partials_hits_the_generated_matcher():
  """cg's default preconditioner is jax's ``Partial``, a pytree whose node
  data (the function) the key walks, and users pass functions as pytrees
  the same way: a fresh matvec, with the default preconditioner or a fresh
  one in a ``Partial`` (each closing over arrays), is answered by the
  generated matcher (no walk of the key per call) with no trace or
  compile, and gives stock's results."""
  from jax_closure_cache import cache
  jcc.enable()
  b = jnp.arange(1.0, 5.0)

  def solve(s, precondition):
    a = jnp.eye(4) * s + 0.1
    d = 1.0 / jnp.diag(a)
    m = jax.tree_util.Partial(lambda v: d * v) if precondition else None
    return spl.cg(lambda v: a @ v, b, M=m)[0]

  for precondition in (False, True):
    warm(lambda: solve(2.0, precondition))
    hits, matched = cache.stats()["hits"], cache.STORE.record_hits()
    for s in (3.0, 4.0, 5.0):
      with counting() as c:
        got = solve(s, precondition)
      assert c["traces"] == c["compiles"] == 0, s
      np.testing.assert_allclose(
          got, _with_cache_off(lambda: solve(s, precondition)), rtol=1e-6)
    assert cache.stats()["hits"] - hits == 3, precondition
    assert cache.STORE.record_hits() - matched == 3, precondition


def test_eager_custom_linear_solve_matches_stock():
  jcc.enable()
  solve = lambda mv, b: b / 4.0
  for s in (2.0, 3.0, 4.0):
    w = jnp.eye(3) * s
    got = jax.lax.custom_linear_solve(lambda v: w @ v, x, solve)
    want = _with_cache_off(
        lambda: jax.lax.custom_linear_solve(lambda v: w @ v, x, solve))
    np.testing.assert_array_equal(got, want)


def test_closure_convert_eagerly_shares_one_trace():
  jcc.enable()
  make = lambda w: (lambda v: jnp.sin(w * v))
  first = make(jnp.ones(3))
  converted, hoisted = jax.closure_convert(first, x)   # stock's
  assert hoisted == []
  again = jax.closure_convert(first, x)[0]   # stock's cache, by identity
  assert again is converted
  f2 = make(jnp.full(3, 2.0))
  c2, _ = jax.closure_convert(f2, x)
  assert jax.closure_convert(f2, x)[0] is c2   # identity first
  hits = jcc.stats()["hits"]
  for s in (3.0, 4.0):
    w = jnp.full(3, s)
    converted, hoisted = jax.closure_convert(make(w), x)
    assert hoisted == []
    stock_converted, stock_hoisted = _with_cache_off(
        lambda: jax.closure_convert(make(w), x))
    assert stock_hoisted == []
    np.testing.assert_array_equal(converted(x), stock_converted(x))
  assert jcc.stats()["hits"] == hits + 2


_CONVERT_LOG = []


def test_closure_convert_of_a_function_whose_trace_writes_is_not_shared():
  """``jax.closure_convert`` of fresh closures whose trace appends to a
  list their code reads: a lifted trace that changed what the key covers
  is not stored, so a later object's trace runs (its write made) as
  stock's does; it was stored, and the second pass skipped a write."""
  def run():
    _CONVERT_LOG.clear()
    vals = []
    for i in range(6):
      w = jnp.arange(3.0) + i
      n = i

      def f(v):
        _CONVERT_LOG.append(n)
        return jnp.sin(v * w) + n
      fc, consts = jax.closure_convert(f, jnp.ones(3))
      vals.append(np.asarray(fc(jnp.ones(3), *consts)).tolist())
    return list(_CONVERT_LOG), vals

  replay_in_both_modes(run, clear=True)


def test_static_function_and_converted_closure_keep_no_array_alive():
  import gc
  import weakref
  jcc.enable()
  apply = jcc.jit(_apply, static_argnums=0)
  make = lambda w: (lambda v: jnp.sin(w * v))
  for s in (1.0, 2.0):   # the first object is stock's; the second compiles
    apply(_matvec(jnp.eye(3) * s), x)
    jax.closure_convert(make(jnp.full(3, s)), x)
  w, u = jnp.eye(3) * 5, jnp.full(3, 5.0)
  apply(_matvec(w), x)
  jax.closure_convert(make(u), x)[0](x)
  refs = [weakref.ref(w), weakref.ref(u)]
  del w, u
  gc.collect()
  assert [r() for r in refs] == [None, None]


_ODEINT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import test_util as jtu
    from jax.experimental.ode import odeint
    import jax_closure_cache as jcc
    assert jcc.enabled()
    import importlib.util
    jcc.disable()   # a private copy of the module made by stock jax.jit
    spec = importlib.util.find_spec("jax.experimental.ode")
    copy = importlib.util.spec_from_file_location("stock_ode", spec.origin)
    stock_ode = importlib.util.module_from_spec(copy)
    copy.loader.exec_module(stock_ode)
    jcc.enable()
    # (no time 0.0: odeint adds ts[0], a part XLA folds from the constant)
    y0, ts = jnp.ones(2), jnp.linspace(0.5, 1.5, 4)
    field = lambda w: (lambda y, t: -w * y)
    # (two values: an array of one value is a scalar to XLA, which factors
    # the Runge-Kutta sums of its products)
    full = lambda n, s: jnp.asarray([s, s * 1.0625], jnp.float32)
    def eager(s):
      return odeint(field(full(2, s)), y0, ts)
    def under_jit(s):
      w = full(2, s)
      return jax.jit(lambda y: odeint(field(w), y, ts))(y0)
    def stock(s):
      jcc.disable()
      try:
        return stock_ode.odeint(field(full(2, s)), y0, ts)
      finally:
        jcc.enable()
    for name, run in (("eager", eager), ("jit", under_jit)):
      run(1.0); run(1.5)
      for s in (2.0, 3.0):
        with jtu.count_jit_compilation_cache_miss() as c:
          got = run(s)
        assert c() == 0, (name, s, c())
        np.testing.assert_allclose(got, stock(s), rtol=1e-6)
    print("ok", jcc.stats()["hits"])
""")


def test_odeint_with_a_fresh_vector_field_compiles_once():
  # A subprocess: odeint's jitted wrapper is made when jax.experimental.ode
  # is imported, so the cache must be on before that import (as it is with
  # JAX_CLOSURE_CACHE=1 for a whole process).
  env = dict(os.environ, JAX_CLOSURE_CACHE="1", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _ODEINT], capture_output=True,
                       text=True, timeout=300, env=env)
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.startswith("ok"), out.stdout


def test_long_lived_static_function_becomes_stocks_wrapper():
  """Called with one stock-owned function for PROMOTE_AFTER_CALLS calls, the
  wrapper runs no frame of ours; a fresh function afterwards gets stock's
  answer (a retrace), never a stale one."""
  from jax_closure_cache.front import identity
  limit = identity.PROMOTE_AFTER_CALLS
  apply = jcc.jit(_apply, static_argnums=0)
  f = _matvec(jnp.eye(3))
  for _ in range(limit + 3):   # its first call and the one that records it
    out = apply(f, x)
  assert getattr(type(apply), "_direct", False)
  np.testing.assert_array_equal(out, _stock_apply(_matvec(jnp.eye(3)), x))
  w = jnp.eye(3) * 7
  np.testing.assert_array_equal(apply(_matvec(w), x),
                                _stock_apply(_matvec(w), x))


@pytest.mark.parametrize("options", [
    {"static_argnames": "x", "donate_argnames": "x"},
    {"static_argnames": ("x", "not_an_argument")},
    {"static_argnums": (0, 3)}])
def test_invalid_static_options_raise_at_jit_time_like_stock(options):
  f = lambda x, y, z: x
  with pytest.raises(ValueError) as stock_error:
    STOCK_JIT(f, **options)
  with pytest.raises(ValueError) as ours:
    jcc.jit(f, **options)
  assert str(ours.value) == str(stock_error.value)


def _nan_with(payload: int, sign: int = 0) -> float:
  import struct
  bits = (sign << 63) | 0x7ff8000000000000 | payload
  return struct.unpack("<d", struct.pack("<Q", bits))[0]


def test_static_values_by_name_or_position_nans_and_unhashable_holders():
  """Static values however they are passed (a ``static_argnames``
  parameter by position, a ``static_argnums`` one by keyword, as stock
  resolves them from the signature), NaNs of other payloads and signs, and
  an unhashable static value that holds a function (stock's error, every
  call), on fresh functions: as stock, run twice."""
  nan = float("nan")

  def run():
    out = []
    for s in (0.0, -0.0, 0.0, nan, -nan, _nan_with(2 << 40), nan):
      w = jnp.float32(1.0)

      def f(x, s):
        return jnp.where(x > 0, x * w, s), jnp.float32(s) * w
      for call in (lambda: jax.jit(f, static_argnames="s")(
                       jnp.float32(0.0), s),
                   lambda: jax.jit(f, static_argnums=1)(
                       jnp.float32(0.0), s=s)):
        out.append([np.asarray(r).tobytes() for r in call()])
    g = jax.jit(lambda x, s: s[0](x), static_argnums=1)
    for holder in ([lambda v: v * w], (lambda v: v * w, [1.0])):
      try:
        out.append(float(g(jnp.float32(1.0), holder)))
      except Exception as e:
        out.append(type(e).__name__)
    return out
  jcc.enable()
  want = stock_off(run)
  assert want[-2:] == ["ValueError", "ValueError"]
  assert run() == want
  assert run() == want


def test_one_object_keeps_stocks_equal_static_trace_and_clear_cache_retraces():
  """One jitted object called with ``0.0`` and then, past the promotion
  count, with ``-0.0`` keeps the ``0.0`` trace, as stock's own cache does
  (with and without a function among the static arguments); and
  ``clear_cache()`` after a closed-over list changed traces afresh, as
  stock's does (plain and static-argument jitted functions)."""
  import math
  from jax_closure_cache.front import identity

  def run():
    out = []
    for i in range(3):
      w = jnp.float32(1.0)
      cfg = [1.0]

      def f(x, s):
        return x * w + math.copysign(1.0, s) + cfg[0]
      fn = lambda u: u * w
      g = jax.jit(f, static_argnums=1)
      h = jax.jit(lambda x, fn, s: fn(x) + math.copysign(1.0, s),
                  static_argnums=(1, 2))
      got = [float(g(jnp.float32(0.0), 0.0)), float(h(jnp.float32(0.0), fn, 0.0))]
      for _ in range(identity.PROMOTE_AFTER_CALLS + 2):
        a = float(g(jnp.float32(0.0), -0.0))
        b = float(h(jnp.float32(0.0), fn, -0.0))
      got += [a, b]
      cfg[0] = 2.0
      got.append(float(g(jnp.float32(0.0), 0.0)))
      g.clear_cache()
      got.append(float(g(jnp.float32(0.0), 0.0)))

      def p(x):
        return x * w + cfg[0]
      jp = jax.jit(p)
      got.append(float(jp(jnp.float32(0.0))))
      cfg[0] = 3.0
      got.append(float(jp(jnp.float32(0.0))))
      jp.clear_cache()
      got.append(float(jp(jnp.float32(0.0))))
      out.append(got)
    return out
  jcc.enable()
  want = stock_off(run)
  assert want[0] == [2.0, 1.0, 2.0, 1.0, 2.0, 3.0, 2.0, 2.0, 3.0]
  assert run() == want
  assert run() == want


class _Tagged(int):
  pass


class _Signed(float):
  pass


class _Model:
  def __init__(self, w):
    self.w = w

  def __call__(self, x, s):
    import math
    return x * self.w + math.copysign(1.0, s)


def test_subclassed_values_and_callable_objects_with_static_values():
  """A user subclass of ``float`` or ``int`` as a static value is keyed by
  its exact bits (``-0.0`` apart), one carrying attributes of its own is
  stock's, and a jitted callable object's static values are keyed exactly
  too: fresh objects, as stock, run twice."""
  import math

  def tagged(v, scale):
    t = _Tagged(v)
    t.scale = scale
    return t

  def run():
    out = []
    for s in (_Signed(0.0), _Signed(-0.0), _Signed(0.0), tagged(1, 10),
              tagged(1, 20), tagged(1, 10), -0.0, 0.0, -0.0):
      w = jnp.float32(1.0)

      def f(x, s):
        return x * w + math.copysign(1.0, s) + getattr(s, "scale", 0)
      out.append(float(jax.jit(f, static_argnums=1)(jnp.float32(0.0), s)))
      if type(s) is float:
        model = _Model(jnp.float32(1.0))
        out.append(np.asarray(jax.jit(model, static_argnums=1)(
            jnp.float32(0.0), s)).tobytes())
    return out
  jcc.enable()
  want = stock_off(run)
  assert run() == want
  assert run() == want


class _Scale:
  def __init__(self, w):
    self.w = w

  def __call__(self, x):
    return x * self.w


def test_static_options_given_as_none_name_no_static_argument():
  """``static_argnums=None, static_argnames=None`` (as Flax passes them)
  name no static argument, for a function and a callable object: results as
  stock's, and fresh closures share one executable."""
  def run():
    out = []
    for i in range(4):
      w = jnp.float32(i + 2)   # (not 0 or 1: stock folds x * 1)
      f = lambda x: x * w
      model = _Scale(w)
      out.append(float(jax.jit(f, static_argnums=None, static_argnames=None)(
          jnp.float32(2.0))))
      out.append(float(jax.jit(model, static_argnums=None,
                               static_argnames=None)(jnp.float32(2.0))))
    return out
  jcc.enable()
  want = stock_off(run)
  warm(run)
  with counting() as c:
    assert run() == want
  assert c["compiles"] == 0


class _Shown(str):
  def __str__(self):   # a display name: not the value
    return "shown"


class _Seven(int):
  def __int__(self):
    return 7


def test_a_value_subclass_is_keyed_by_its_value_not_its_overrides():
  """A user subclass of ``str`` or ``int`` whose ``__str__``/``__int__``
  says something else than its value is keyed by the value (as the base
  type's own methods read it): closed over and as a static argument."""
  x = jnp.arange(3.0)

  def run():
    out = []
    for a, n in (("relu", 2), ("tanh", 3), ("relu", 2), ("neg", 1)):
      act, k = _Shown(a), _Seven(n)

      def f(v):
        y = (jnp.maximum(v - 1, 0) if act == "relu" else
             jnp.tanh(v) if act == "tanh" else -v)
        return y[:k].sum() * k
      out.append(np.asarray(jax.jit(f)(x)).tolist())
      out.append(np.asarray(jax.jit(lambda v, s: v * (s == "relu"),
                                    static_argnums=1)(x, act)).tolist())
    return out
  jcc.enable()
  want = stock_off(run)
  assert run() == want
  assert run() == want


def test_one_object_with_equal_static_values_traces_once_and_counts_one():
  """The same jitted object called with two static objects its class says
  are equal traces once and counts one executable, as stock (JAX's own
  ``test_static_args_equality``)."""
  class A:
    def __hash__(self):
      return 1

    def __eq__(self, other):
      return isinstance(other, A)
  side = []

  def f(x, static_arg):
    side.append(None)
    return x * 100
  jcc.enable()
  f1 = jax.jit(f, static_argnums=(1,))
  assert f1(1, A()) == 100 and len(side) == 1
  assert f1(1, A()) == 100 and len(side) == 1
  assert f1._cache_size() == 1


def test_eval_shape_and_keyword_order_of_a_wrapper_with_static_arguments():
  """``jax.eval_shape`` of a jitted function with static arguments answers
  by its ``trace``, as stock's does for its own (it traced the wrapper
  with the static values as tracers); static keywords reach a function
  taking ``**kwargs`` in stock's order (sorted by name)."""
  def run():
    out = []
    for i in range(3):
      w = jnp.ones(2) * i
      seen = []

      def g(x, n):
        return x * w * n

      def h(x, **kw):
        seen.append(list(kw))
        return x * w * kw["c"]
      j = jax.jit(g, static_argnums=1)
      out.append(jax.eval_shape(j, jnp.ones(2), 2))
      out.append(j.eval_shape(jnp.ones(2), 3))
      out.append(jax.eval_shape(jax.jit(lambda x: x * w), jnp.ones(2)))
      out.append(jax.jit(h, static_argnames=("z", "c"))(
          jnp.ones(2), z=2, y=jnp.ones(1), c=3, a=jnp.ones(1)))
      out.append(seen)
    return out

  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    got = run()
    assert [g for g in got if type(g) is list] == [
        w for w in want if type(w) is list]
    for g, w in zip(got, want):
      assert type(g) is type(w)
      if type(w) is jax.ShapeDtypeStruct:
        assert g == w
      elif type(w) is not list:
        np.testing.assert_array_equal(g, w)


def test_a_function_jitted_anew_for_each_call_with_a_static_function(
    monkeypatch):
  """``jax.jit(g, static_argnums=1)(x, h)`` in a loop over long-lived ``g``
  and ``h``: stock makes a new jitted object each call; the cache makes no
  stock object per call and never promotes the row (no wrapper lives to
  keep stock's object), so nothing compiles past the first calls, and
  every answer is stock's. A wrapper kept and called keeps its promotion."""
  from jax_closure_cache.front import identity
  monkeypatch.setattr(identity, "PROMOTE_AFTER_CALLS", 5)
  w = jnp.arange(3.0)

  def make(w):
    def g(x, f):
      return f(x) * w
    return g

  def h(v):
    return v * v + 1.0

  x = jnp.ones(3)
  want = STOCK_JIT(make(w), static_argnums=1)(x, h)
  jcc.enable()
  for _ in range(2):
    jax.jit(make(w), static_argnums=1)(x, h)   # stock's, then the entry's
  g = make(w)
  jax.jit(g, static_argnums=1)(x, h)
  with counting() as c:
    for _ in range(20):
      out = jax.jit(g, static_argnums=1)(x, h)
  assert c["compiles"] == 0 and c["traces"] == 0, c
  np.testing.assert_array_equal(out, want)
  kept = jax.jit(g, static_argnums=1)
  with counting() as c:
    for _ in range(20):
      out = kept(x, h)
  assert c["compiles"] == 1, c   # promoted: stock's own executable, once
  np.testing.assert_array_equal(out, want)
  for _ in range(2):   # stock's validation, on every wrapper
    with pytest.raises(ValueError):
      jax.jit(g, static_argnums=1, donate_argnums=1)


def test_a_static_function_stock_must_answer_is_traced_once_per_object():
  """A fresh function passed as a static argument whose trace writes to a
  log and holds a callback (which only stock answers: a hit would run the
  first object's): each object's trace runs once, as stock's does. The
  second object's lifted trace, answered by stock after it, made the write
  twice; stock's own cached trace of the first object now tells the code
  goes to stock before any lifted trace."""
  def run():
    apply = jax.jit(_apply, static_argnums=0)
    counts = []
    for i in range(4):
      log = []
      w = jnp.full(3, float(i))

      def fn(v):
        log.append("traced")
        jax.debug.callback(lambda _: None, v)
        return v * w
      out = apply(fn, x)
      jax.effects_barrier()
      counts.append((len(log), np.asarray(out).tolist()))
    return counts

  want = stock_off(run)
  assert [n for n, _ in want] == [1, 1, 1, 1]
  for verify in (False, True):
    jcc.clear()
    jcc.enable(verify=verify)
    for _ in range(2):
      assert run() == want, verify


_EQ_RAISES = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_closure_cache as jcc

    class EqRaises:   # hashed alike: stock's caches compare them
      def __init__(self, n):
        self.n = n
      def __hash__(self):
        return 1
      def __eq__(self, other):
        raise RuntimeError("not comparable")

    def run():
      def scaled(c, x):
        return x * c.n
      out = []
      for i in range(3):
        w = jnp.float32(i + 1.0)
        calls = [(scaled, EqRaises(2)), (scaled, EqRaises(3)),
                 (lambda d, x: x * w, np.timedelta64(1, "s")),
                 (lambda d, x: x * w, np.timedelta64(1, "Y"))]
        for fun, static in calls:
          try:
            got = jax.jit(fun, static_argnums=0)(static, jnp.ones(2))
            out.append(np.asarray(got).tobytes().hex())
          except Exception as e:
            out.append(type(e).__name__ + ": "
                       + str(e).split("The error was")[0])
      return out

    if sys.argv[1] != "off":
      jcc.enable(verify=sys.argv[1] == "verify")
    for _ in range(2):
      print(run())
    print(jcc.stats().get("verify_mismatches", 0) if sys.argv[1] != "off"
          else 0)
    """)


def test_static_values_whose_comparison_raises_raise_as_stocks():
  """Static values stock's caches compare and whose ``==`` raises (a
  class's own ``__eq__``; ``np.timedelta64(1, 'Y')`` against ``(1, 's')``),
  a wrapper made anew for each round and a fresh function beside them, each
  mode in a process of its own: the first run gives stock's results and
  errors (stock's ``ValueError`` naming the comparison, never the user's
  own error) in the same calls. In the second, JAX's global caches compare
  the new function's values with the first run's, which the cache does
  not (a known limit): where the cache raises, stock raises the same."""
  def mode(name):
    out = subprocess.run([sys.executable, "-c", _EQ_RAISES, name],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, second, mismatches = out.stdout.splitlines()
    return ast.literal_eval(first), ast.literal_eval(second), mismatches

  want_first, want_second, _ = mode("off")
  incomparable = ("ValueError: static arguments should be comparable "
                  "using __eq__.The following error was raised when "
                  "comparing two objects of types <class '__main__.EqRaises'>"
                  " and <class '__main__.EqRaises'>. ")
  assert incomparable in want_first
  for name in ("on", "verify"):
    first, second, mismatches = mode(name)
    assert first == want_first, name
    assert mismatches == "0", name
    raised = [(got, want) for got, want in zip(second, want_second)
              if got.startswith(("ValueError", "RuntimeError"))]
    assert raised and all(got == want for got, want in raised), (name,
                                                                 raised)
