"""jit's drop-in surface: options, decorator forms, AOT methods, transforms."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import (
    STOCK_JIT, counting, replay_in_both_modes, stock_off, varied)


def make(w):
  def f(x, n, *, mode="add"):
    for _ in range(n):
      x = x + w if mode == "add" else x * w
    return x
  return f


def test_static_argnums_and_argnames_shift_past_leaves():
  x = jnp.ones(2)
  w2, w3 = jnp.full(2, 2.0), jnp.full(2, 3.0)
  # (one product: two by closed-over arrays, (x * w) * w, XLA would
  # reassociate in stock's module, and such a jaxpr is never shared)
  out = jcc.jit(make(w2), static_argnums=1, static_argnames="mode")(x, 1, mode="mul")
  np.testing.assert_array_equal(out, STOCK_JIT(make(w2), static_argnums=1,
                                               static_argnames="mode")(x, 1, mode="mul"))
  out = jcc.jit(make(w2), static_argnums=1, static_argnames="mode")(x, 1, mode="mul")
  np.testing.assert_array_equal(out, jnp.full(2, 2.0))   # the shared entry
  with counting() as c:
    out = jcc.jit(make(w3), static_argnums=(1,), static_argnames=("mode",))(x, 1, mode="mul")
  assert c["compiles"] == 0
  np.testing.assert_array_equal(out, jnp.full(2, 3.0))
  # static_argnames alone resolves positions from the user's signature
  out = jcc.jit(make(w3), static_argnames=("n",))(x, 1)
  np.testing.assert_array_equal(out, jnp.full(2, 4.0))


def test_donate_argnums_donates_the_argument_only():
  w = jnp.full(2, 2.0)
  for _ in range(3):   # stock's object, then the shared entry, then a hit
    f = jcc.jit(lambda x: x * w, donate_argnums=0)
    x = jnp.ones(2)
    np.testing.assert_array_equal(f(x), jnp.full(2, 2.0))
    assert not w.is_deleted()


_DONATES_A_CLOSED_OVER_ARRAY = """
import sys
if sys.argv[1] != "stock":
  import jax_closure_cache as jcc
  jcc.enable(verify=sys.argv[1] == "verify")
import jax, jax.numpy as jnp
apply = jax.jit(lambda f, x: f(x) + 1, static_argnums=0, donate_argnums=1)
for _ in range(2):
  # (first: no spec of donated position 0 made before, by any route)
  for i in range(4):   # jit's own donation, of position 0 given as 0
    w = jnp.arange(3.0) + i
    print(jax.jit(lambda v: v + w, donate_argnums=0)(w).tolist(),
          w.is_deleted())
  for i in range(4):   # the same by name
    w = jnp.arange(3.0) + i
    print(jax.jit(lambda v: v - w, donate_argnames="v")(w).tolist(),
          w.is_deleted())
  for i in range(4):   # a fresh lambda over the array it is given
    w = jnp.arange(4.0) + i
    print(apply(lambda v: v * w, w).tolist(), w.is_deleted())
  for i in range(4):   # another argument donated: shared as before
    w, y = jnp.arange(3.0) + i, jnp.ones(3)
    print(jax.jit(lambda v: v + w, donate_argnums=0)(y).tolist(),
          y.is_deleted(), w.is_deleted())
if sys.argv[1] != "stock":
  assert jcc.stats()["hits"] > 0
"""


def _deleted_outcome(call):
  """What a caller sees of ``call()``: its values, or the exception's type
  and whether its text speaks of a deleted or donated buffer."""
  try:
    return ("ok", np.asarray(call()).tolist())
  except Exception as e:   # what a user's except clause would see
    return type(e).__name__, "deleted" in str(e) or "donated" in str(e)


def test_a_donated_argument_passed_again_raises_stocks_error():
  """An argument donated at a call and passed again: to the same fresh
  jitted closure (on jax 0.10.2 stock's object runs its executable on the
  deleted buffer and XLA raises ``ValueError``; 0.11 checks first) and to
  another one (stock's trace raises JAX's ``RuntimeError`` of a deleted
  array), at first meetings and at hits alike."""

  def run():
    out = []
    for i in (0, 1, 0, 1):
      c = float(i) + 0.5
      f = jax.jit(lambda x: x * c, donate_argnums=0)
      x = jnp.arange(3.0) + i
      out.append(_deleted_outcome(lambda: f(x)))
      out.append(_deleted_outcome(lambda: f(x)))   # the same object again
      g = jax.jit(lambda x: x - c, donate_argnums=0)
      out.append(_deleted_outcome(lambda: g(x)))   # another object
      out.append(_deleted_outcome(lambda: f(jnp.arange(3.0))))   # a live one
    return out

  want = replay_in_both_modes(run, clear=True)
  assert {w[0] for w in want} >= {"ok", "RuntimeError"}


def test_a_deleted_argument_beside_a_tracer_raises_stocks_error():
  """A fresh jitted closure called a second time under ``grad`` (a tracer
  among its arguments) with a deleted array beside it, and again through
  a second wrapper of the same object: stock's errors, not one of the
  package's own asking a tracer whether it was deleted."""

  def run():
    out = []
    for i in (0, 1, 0, 1):
      w = jnp.arange(3.0) + i

      def f(x, d):
        return x * w + d
      g = jax.jit(f)
      a = jnp.ones(3)
      out.append(_deleted_outcome(lambda: g(a, a)))
      dead = jnp.ones(3)
      dead.delete()
      out.append(_deleted_outcome(
          lambda: jax.grad(lambda x: g(x, dead).sum())(a)))
      out.append(_deleted_outcome(lambda: jax.jit(f)(a, dead)))   # re-wrapped
    return out

  want = replay_in_both_modes(run, clear=True)
  assert {w[0] for w in want} > {"ok"}


def test_donating_closures_keep_pythons_record_of_warnings_shown_once():
  """Python shows a warning of one text and place once under the
  ``default`` filter: fresh donating jitted closures (one whose donated
  buffer XLA cannot use, which warns at each compile) leave that record
  as stock leaves it, so neither their own warning nor an unrelated one
  of the user's is shown again."""
  import warnings

  def users_code(i):
    warnings.warn("the user's own warning, unrelated to jax")

  def run():
    shown = []
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("default")
      for i in range(4):
        c = float(i % 2) + 1.5
        f = jax.jit(lambda x, y: x * c + y, donate_argnums=0)
        out = np.asarray(f(jnp.ones(3), jnp.arange(3.0))).tolist()
        g = jax.jit(lambda x: jnp.sum(x) * c, donate_argnums=0)
        out += [float(g(jnp.ones(5)))]
        users_code(i)
        shown.append((out, [str(m.message)[:40] for m in caught]))
    return shown

  want = replay_in_both_modes(run, clear=True)
  assert len(want[-1][1]) == 2   # each shown once


def test_a_warning_whose_text_fails_is_left_to_pythons_filters():
  """A warning whose message's ``str`` raises, issued by a fresh donating
  closure's trace under an ``ignore`` filter: Python never formats it, so
  stock raises nothing, and neither does the package's replacement of
  ``warnings.warn`` that counts the warnings a trace issues (it keeps the
  message unformatted). (A closure reading ``warnings`` is traced as
  stock traces it: the replacement is what this reaches.)"""
  import warnings

  class Unprintable:
    def __str__(self):
      raise RuntimeError("no text")

  def run():
    out = []
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      for i in range(3):
        c = float(i % 2) + 0.5

        def f(x):
          warnings.warn(Unprintable())
          return x * c
        out.append(np.asarray(jax.jit(f, donate_argnums=0)(
            jnp.arange(3.0))).tolist())
    return out

  replay_in_both_modes(run, clear=True)


def test_a_donated_argument_its_closure_holds_too_is_stocks():
  """A donating call given the array its fresh closure holds: stock bakes
  the closed-over array and donates the argument; a shared entry takes
  the array as an argument too, and XLA refuses to donate a buffer the
  same call reads, logging the refusal on stderr before the package's
  retry. Such a call is stock's, before XLA sees it: the same output and
  stderr, each mode in a process of its own."""
  import subprocess
  import sys
  out = {}
  for mode in ("stock", "cache", "verify"):
    done = subprocess.run(
        [sys.executable, "-c", _DONATES_A_CLOSED_OVER_ARRAY, mode],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out[mode] = (done.stdout, [line for line in done.stderr.splitlines()
                               if "donate" in line.lower()])
  assert out["cache"] == out["stock"] and out["verify"] == out["stock"]


def test_other_options_pass_through():
  w = jnp.full(2, 2.0)
  f = jcc.jit(lambda x: x * w, keep_unused=True, inline=True,
              compiler_options={})
  np.testing.assert_array_equal(f(jnp.ones(2)), w)
  sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  g = jcc.jit(lambda x: x * w, in_shardings=sh, out_shardings=sh)
  np.testing.assert_array_equal(g(jnp.ones(2)), w)


def test_unknown_option_is_a_type_error():
  with pytest.raises(TypeError):
    jcc.jit(lambda x: x, static_argnumz=0)


@pytest.mark.parametrize("call", [
    lambda: jcc.jit(lambda x: x, auto_dynamic=True),
    lambda: jcc.jit(lambda x: x, auto_dynamic=False, static_argnums=0),
    lambda: jcc.jit(auto_dynamic=True),
    lambda: jcc.enable(auto_dynamic=True),
    lambda: jcc.enabled(auto_dynamic=False),
], ids=["jit", "jit-with-options", "jit-decorator", "enable", "enabled"])
def test_auto_dynamic_is_a_type_error_that_says_why(call):
  """``auto_dynamic=`` is refused by ``jit``, ``enable`` and ``enabled``
  (at the call), naming tier A, which shares a changing Python scalar's
  executable after a stock trace; nothing is switched on."""
  with pytest.raises(TypeError, match=(
      r"unexpected keyword argument 'auto_dynamic': the auto_dynamic option "
      r"was removed; .*Python int or float that keeps changing.*stock trace "
      r"\(tier A\)")):
    call()
  assert not jcc.is_enabled()


def test_enable_refuses_an_unknown_keyword():
  with pytest.raises(TypeError, match=r"enable\(\) got an unexpected "
                     r"keyword argument 'lift_numbers'$"):
    jcc.enable(lift_numbers=True)


def _make_inner(w):
  def inner(x):
    return jnp.tanh(x @ w)
  return inner


def test_python_jit_errors_and_results_are_kept():
  with pytest.raises(TypeError):
    jcc.jit(fun=_make_inner(jnp.eye(4)))
  with pytest.raises(TypeError):
    jcc.jit(_make_inner(jnp.eye(4)), not_an_option=1)
  deco = jcc.jit(static_argnums=1)
  assert deco(lambda x, n: x * n)(jnp.ones(3), 2).tolist() == [2.0] * 3

  class A:   # bound as a method, as a Python function would be
    j = jcc.jit
  with pytest.raises(TypeError):
    A().j(_make_inner(jnp.eye(4)))


def test_decorator_and_partial_forms():
  w = jnp.full(2, 2.0)

  @jcc.jit
  def a(x):
    return x * w

  @jcc.jit(static_argnums=1)
  def b(x, n):
    return x * w * n

  @functools.partial(jcc.jit, static_argnames="n")
  def c(x, n):
    return x * w + n
  x = jnp.ones(2)
  assert float(a(x)[0]) == 2.0 and float(b(x, 3)[0]) == 6.0
  assert float(c(x, n=1)[0]) == 3.0


def test_aot_methods_and_attributes():
  w = jnp.full(2, 2.0)
  def inner(x):
    return x * w
  f = jcc.jit(inner)
  assert f.__wrapped__ is inner and f.__name__ == "inner"
  x = jnp.ones(2)
  assert "multiply" in f.lower(x).as_text()
  np.testing.assert_array_equal(f.lower(x).compile()(x), f(x))
  assert f.trace(x).jaxpr is not None
  assert f.eval_shape(x).shape == (2,)


def test_composes_with_transforms_and_outer_jit():
  w = jnp.full(3, 2.0)
  f = jcc.jit(lambda x: jnp.sum(jnp.sin(x) * w))
  x = jnp.arange(3.0)
  ref = lambda x: jnp.sum(jnp.sin(x) * w)
  np.testing.assert_allclose(jax.grad(f)(x), jax.grad(ref)(x), rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(f)(jnp.stack([x, x])),
                             jax.vmap(ref)(jnp.stack([x, x])), rtol=1e-6)
  p, t = jax.jvp(f, (x,), (jnp.ones(3),))
  p2, t2 = jax.jvp(ref, (x,), (jnp.ones(3),))
  np.testing.assert_allclose([p, t], [p2, t2], rtol=1e-6)
  np.testing.assert_allclose(STOCK_JIT(lambda x: f(x) + 1)(x), ref(x) + 1,
                             rtol=1e-6)


def test_a_staged_call_gives_stocks_jaxpr_and_eager_transforms_still_hit():
  """Called while a jaxpr is built (``make_jaxpr``, an outer jit), a fresh
  jitted closure whose key has an entry is stock's call: the closed-over
  array stays inside the inner computation (a hit would make it an
  operand, the outer jaxpr's constant). Under transformations of an eager
  call (``grad``, ``vmap``, ``jvp``) the hit stays, with stock's bits."""
  cs = [varied((4,), 0.5 + k) for k in range(3)]
  x = jnp.linspace(-1.0, 1.0, 4)

  def make(c):
    return jax.jit(lambda x: jnp.sin(x * c))

  def staged():
    outer = []
    if jax.__version_info__ < (0, 11):
      # (on 0.11 the trace lookup's shared jaxpr, which answers stock's
      # trace of the inner function here, has the arrays as the inner
      # computation's operands: contract.md, rule 16)
      outer += [str(jax.make_jaxpr(lambda x, c=c: make(c)(x) + 1.0)(x))
                for c in cs]
      outer += [STOCK_JIT(lambda x, c=c: make(c)(x) + 1.0).lower(x).as_text()
                for c in cs]
    return [str(jax.make_jaxpr(make(c))(x)) for c in cs] + outer

  def eager():
    outs = []
    for c in cs:
      outs += [jax.grad(lambda x: jnp.sum(make(c)(x)))(x),
               jax.vmap(make(c))(jnp.stack([x, -x])),
               *jax.jvp(make(c), (x,), (x * 0.5,))]
    return [(a.dtype, a.weak_type, np.asarray(a).tobytes()) for a in outs]

  jcc.disable()
  want_staged, want_eager = staged(), eager()
  jcc.clear()
  jcc.enable(verify=True)
  try:
    for _ in range(2):
      for c in cs:   # entries for the key, from eager calls
        make(c)(x)
      assert staged() == want_staged
      hits = jcc.stats()["hits"]
      assert eager() == want_eager
      assert jcc.stats()["hits"] > hits   # (transforms of eager calls hit)
    assert jcc.stats()["verify_mismatches"] == 0
  finally:
    jcc.disable()


@pytest.mark.parametrize("jit", [STOCK_JIT, jcc.jit], ids=["stock", "cache"])
def test_method_decorated_in_class_body_binds_like_stock(jit):
  class M:
    def __init__(self, s):
      self.s = s

    @jit
    def apply(self, x):
      return x * self.s

    @functools.partial(jit, static_argnums=0)
    def apply_static(self, x):
      return x * 2
  with pytest.raises(TypeError, match="non-array argument"):
    M(2.0).apply(jnp.ones(2))   # self is not an array: stock's error
  np.testing.assert_array_equal(M(2.0).apply_static(jnp.ones(2)), jnp.full(2, 2.0))


def test_jax_clear_caches_clears_the_closure_cache():
  make = lambda w: jcc.jit(lambda x: x * w)
  x = jnp.ones(2)
  for i in range(3):
    make(jnp.full(2, i + 2.0))(x)
  assert jcc.stats()["entries"] >= 1 and jcc.stats()["hits"] == 1
  jax.clear_caches()
  assert jcc.stats()["entries"] == 0
  w7 = jnp.full(2, 7.0)
  with counting() as c:   # the first object again: stock's, compiled anew
    out = make(w7)(x)
  assert c["compiles"] == 1
  np.testing.assert_array_equal(out, jnp.full(2, 7.0))


def test_stats_count_a_hit_that_traced_again():
  make = lambda w: jcc.jit(lambda x: x * w)
  # (not ones: stock's module folds x * 1)
  w = jnp.full(2, 2.0)
  x2, x3, w3 = jnp.ones(2), jnp.ones(3), jnp.full(3, 2.0)
  make(w)(x2)
  make(w)(x2)   # the shared entry: its first trace is not a retrace
  assert jcc.stats()["retraces"] == 0
  out = make(w3)(x3)   # same key, new shapes: a hit that traces again
  np.testing.assert_array_equal(out, jnp.full(3, 2.0))
  assert jcc.stats()["retraces"] == 1 and jcc.stats()["hits"] == 1


def test_jit_without_a_function_and_with_none_is_stocks():
  """``jax.jit()`` is a decorator (a function, as stock's); ``jax.jit(None)``
  raises stock's TypeError; ``device=`` (deprecated) warns as stock's does,
  once per jitted object, at the user's line."""
  import warnings

  def run():
    out = [type(jax.jit()).__name__,
           float(jax.jit(static_argnums=())(lambda v: v + 1.0)(1.0))]
    for bad in (lambda: jax.jit(None), lambda: jax.jit(None)(lambda v: v)):
      with pytest.raises(TypeError) as e:
        bad()
      out.append(str(e.value))
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for i in range(3):
        w = jnp.ones(2) * i
        jax.jit(lambda v: v * w, device=jax.devices()[0])(jnp.ones(2))
    out.append([(c.category.__name__, os.path.basename(c.filename))
                for c in caught])
    return out

  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    assert run() == want


def test_a_renamed_function_and_inexact_options_get_stocks_jitted_object():
  """``jax.jit(f)`` of a closure-free function renamed since its code's
  object was made shows the new name (its module's name too); options
  equal under ``==`` but not to stock's ``jit()`` (``(1.0,)`` for
  ``(1,)``) raise stock's error, whatever was made before."""
  def run():
    def f(a):
      """doc1"""
      return a * 2.0
    out = [float(jax.jit(f)(1.0))]
    f.__name__, f.__qualname__, f.__doc__ = "renamed", "Q.renamed", "doc2"
    f.marker = "mine"
    j = jax.jit(f)
    out += [j.__name__, j.__qualname__, j.__doc__, getattr(j, "marker", None),
            j.lower(1.0).as_text().split("\n")[0].split()[1]]

    def g(x, n):
      return x * n
    out.append(float(jax.jit(g, static_argnums=1)(1.0, 2)))
    with pytest.raises(TypeError) as e:
      jax.jit(g, static_argnums=(1.0,))(1.0, 2)
    out.append(str(e.value))
    return out

  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    assert run() == want


class _Nameless:
  def __call__(self, x, y):
    return x + y


class _Named(_Nameless):
  __name__ = "named_by_its_class"


def test_a_partials_wrapper_is_named_as_stocks():
  """``jax.jit(functools.partial(f, ...))``: stock's object is named by the
  partial's function (``__name__`` and ``__qualname__``, nested partials
  too) and has empty annotations, as JAX's ``util.wraps`` makes it; the
  package's wrapper, a front's or not, reads the same. So does the wrapper
  of a callable object (``<unnamed function>`` without a ``__name__``,
  where it read its class's name), alone or in a partial, and its
  ``__doc__`` (``""`` where the function has none, where it read None)."""
  import functools

  def f(x, y, z=0):
    return x + y + z

  def read(j):
    return (j.__name__, getattr(j, "__qualname__", None),
            getattr(j, "__annotations__", None), repr(j), j.__doc__,
            j.__module__)

  cases = [functools.partial(f, 1), functools.partial(functools.partial(f, 1), 2),
           functools.partial(f, z=3), _Nameless(), _Named(),
           functools.partial(_Nameless(), 1.0)]
  want = [read(STOCK_JIT(p)) for p in cases]
  assert want[3][0] == "<unnamed function>"   # (what the test is about)
  jcc.enable()
  assert [read(jax.jit(p)) for p in cases] == want
  for p, args in zip(cases[:3], [(1.0, 2.0), (1.0,), (1.0, 2.0)]):
    for _ in range(3):   # stored and hit: the later wrappers are fronts'
      jax.jit(p)(*args)
  assert [read(jax.jit(p)) for p in cases] == want


class _Scaled:
  def __init__(self, w):
    self.w = w

  def __call__(self, p):
    return p * self.w


def test_a_shared_entrys_lowering_is_named_as_stocks():
  """A re-created partial of a lambda, or callable object, called and then
  lowered: stock's module is named after JAX's ``fun_name`` of it
  (``jit__lambda``, ``jit__unnamed_function``); the shared entry's lifted
  function was named ``partial`` or after the object's class from the
  second object on (found by a differential pass; long-standing)."""
  import functools
  x = jnp.ones(2)

  def run():
    out = []
    for i in range(3):
      w = jnp.full((2,), float(i))
      for o in (functools.partial(lambda a, p: a * p, w), _Scaled(w)):
        j = jax.jit(o)
        j(x)
        out.append(j.lower(x).as_text().split(" ")[1])
    return out

  want = replay_in_both_modes(run, clear=True)
  assert want[:2] == ["@jit__lambda", "@jit__unnamed_function"]


def test_fresh_closures_renamed_per_call_are_named_as_stocks():
  """Fresh closures of one code, renamed in turn (``__name__`` set, made
  by ``types.FunctionType`` with a name, named by ``functools.wraps``; a
  ``functools.partial`` named by ``update_wrapper`` or by hand; a closure
  calling a renamed helper under an inner ``jit``): each call's value, its
  lowering's module name and a caller's trace of it (``make_jaxpr``, an
  eager ``scan`` over it) name it as stock's do. A hit answered the object
  with the name of the entry's first one (found by a differential pass)."""
  import functools
  import re
  import types
  x = jnp.arange(1.0, 4.0)

  def base(v):
    return v

  def make(c, name, how):
    def f(y):
      return jnp.sin(y) * c
    if how == "set":
      f.__name__ = name
      return f
    if how == "made":
      return types.FunctionType(f.__code__, f.__globals__, name, None,
                                f.__closure__)
    if how == "partial":
      p = functools.partial(lambda a, y: jnp.sin(y) * a, c)
      p.__name__ = name
      return p
    if how == "wrapped partial":
      return functools.update_wrapper(
          functools.partial(lambda a, y: jnp.sin(y) * a, c), base)
    if how == "helper":
      def h(y):
        return jnp.sin(y) * c
      h.__name__ = name

      def outer(y):
        return jax.jit(h)(y) + 1.0
      return outer
    return functools.wraps(base)(f)   # named as ``base``

  def run():
    out = []
    for i in range(3):
      for name, how in (("alpha", "set"), ("beta", "set"), ("gamma", "made"),
                        ("f", "made"), ("", "wraps"), ("delta", "partial"),
                        ("eps", "partial"), ("", "wrapped partial"),
                        ("zeta", "helper"), ("eta", "helper")):
        g = jax.jit(make(2.0, name, how))
        outer = jax.make_jaxpr(lambda y: g(y) + 1)(x)
        scanned = jax.lax.scan(lambda s, v: (s + g(v), s), 0.0, x)[0]
        out.append((i, name, how, g(x).tolist(), float(scanned),
                    re.findall(r"module @(\w+)", g.lower(x).as_text()),
                    re.findall(r"name=(\w+)", str(outer))))
    return out

  want = replay_in_both_modes(run, clear=True)
  assert {w[5][0] for w in want} == {
      "jit_alpha", "jit_beta", "jit_gamma", "jit_f", "jit_base", "jit_delta",
      "jit_eps", "jit_outer"}
  assert {n for w in want for n in w[6]} >= {"zeta", "eta", "delta"}


def test_an_error_of_a_function_the_key_refuses_carries_no_refusal():
  """A re-created function the closure key refuses (it calls
  ``warnings.warn``) raises at trace time: stock's error, with stock's
  ``__context__`` (none), not the cache's refusal chained to it (a
  traceback's "During handling of the above exception")."""
  import warnings

  def run():
    out = []
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      for i in range(5):
        def f(x):
          warnings.warn("w")
          raise ValueError(f"bad {i}")
        try:
          jax.jit(f)(jnp.float32(1))
        except ValueError as e:
          out.append((str(e), e.__context__))
    return out

  want = stock_off(run)
  assert all(context is None for _, context in want)
  for verify in (False, True):
    jcc.clear()
    jcc.enable(verify=verify)
    assert run() == want
    jcc.disable()
