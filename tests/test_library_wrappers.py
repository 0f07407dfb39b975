"""Library jit wrappers between the user's function and JAX (issue 22): each
pattern's pure-JAX reproduction compiles nothing from call 3 on and matches
stock (the cache off, fresh objects) call by call; the unsound variants of
each pattern are answered as stock answers them."""

import dataclasses
import functools
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import STOCK_JIT, counting, stock_off, ticker, varied

X = jnp.arange(4.0)


def _run_like_stock(program, rounds=6):
  """Run ``program(i)`` for ``rounds`` values of ``i`` with the cache on,
  then again (a replay with fresh objects: hits); each result equals the
  same call with the cache off. Returns the compiles of each call."""
  compiles = []
  for _ in range(2):
    for i in range(rounds):
      with counting() as c:
        got = program(i)
      compiles.append(c["compiles"])
      want = stock_off(program, i)
      for g, w in zip(jax.tree_util.tree_leaves(got),
                      jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0)
  return compiles


# -- 1. a function nested inside a static argument ------------------------------

@functools.partial(jax.jit, static_argnums=1)
def _apply_nested_stock(x, packed):
  (leaves, treedef), _ = packed
  return jax.tree_util.tree_unflatten(treedef, leaves)(x)


def _apply_nested():
  # made under enable(): the package's jit, as a library's module would be
  return jax.jit(_apply_nested_stock.__wrapped__, static_argnums=1)


def test_function_three_levels_down_in_a_static_argument_hits():
  jcc.enable()
  apply_nested = _apply_nested()

  def program(i):
    w = jnp.full((4,), 2.0 + i)
    leaves, treedef = jax.tree_util.tree_flatten(lambda v: v * w)
    return apply_nested(X, ((tuple(leaves), treedef), "tag"))
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


def test_function_in_a_static_treedefs_node_data_hits():
  """``tree_flatten(Partial(f, s))``: the function is in the treedef's node
  data, its argument a leaf; keyed by the function's closure key."""
  jcc.enable()
  apply_nested = _apply_nested()

  def program(i):
    # (not all one value: (v * 3.0) * w of such a w is stock's, as XLA
    # folds 3.0 * w there)
    w = jnp.arange(4.0) + 1.5 + i
    fun = jax.tree_util.Partial(lambda v, s: v * s * w, 3.0)
    leaves, treedef = jax.tree_util.tree_flatten(fun)
    return apply_nested(X, ((tuple(leaves), treedef), "tag"))
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


def test_unhashable_static_container_of_functions_keeps_stocks_error():
  jcc.enable()
  g = jax.jit(lambda fs, x: fs[0](x), static_argnums=0)
  with pytest.raises(ValueError) as ours:
    g([lambda v: v + 1.0], X)
  jcc.disable()
  with pytest.raises(ValueError) as stock:
    STOCK_JIT(lambda fs, x: fs[0](x), static_argnums=0)([lambda v: v], X)
  assert type(ours.value) is type(stock.value)


# -- 2. constants made at trace time under ensure_compile_time_eval --------------

def test_constants_made_under_ensure_compile_time_eval_are_stored():
  jcc.enable()

  def program(i):
    w = varied((4,), 2.0 + i)

    def f(v):
      with jax.ensure_compile_time_eval():
        ok = jnp.asarray(0 == 0)
        n = jnp.sum(jnp.arange(3.0))
      return jnp.where(ok, v * w * n, v)
    return jax.jit(f)(X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)
  assert jcc.stats()["not_stored"].get("untracked_capture", 0) == 0


def test_constant_from_an_uncovered_tick_at_trace_time_is_not_stored():
  """A constant the trace makes from something the key does not cover (a
  ticker a wrapper rule hides; a clock or an iterator, which this test read
  before, now has no key at all) differs between two traces: never stored,
  every call is right."""
  jcc.enable()
  with ticker() as ticks:
    def program(_):
      w = jnp.full((4,), 2.0)

      def f(v):
        with jax.ensure_compile_time_eval():
          t = jnp.asarray(ticks.tick())
        return v * w + t
      return jax.jit(f)(X)
    outs = [float(program(i)[0]) for i in range(5)]
  assert len(set(outs)) == 5   # each trace read a new tick, as stock would
  assert jcc.stats()["not_stored"].get("untracked_capture", 0) >= 1


def test_array_reached_around_the_key_is_still_not_stored():
  """An array that existed before the trace, reached by a name the key
  cannot see (``getattr`` with a computed name), is the same object in both
  traces: not taken for a trace-made constant."""
  jcc.enable()
  holder = types.SimpleNamespace(table_1=jnp.ones(4))
  name = "table_" + "1"

  def program(i):
    w = jnp.full((4,), 2.0 + i)

    def f(v):
      return v * w + getattr(holder, name)
    return jax.jit(f)(X)
  for i in range(3):
    program(i)
  holder.table_1 = jnp.full((4,), 7.0)
  np.testing.assert_allclose(program(3), X * 5.0 + 7.0)


# -- 3. a jaxpr made eagerly, passed statically ----------------------------------

def test_jaxpr_made_per_call_and_passed_statically_hits():
  jcc.enable()

  @functools.partial(jax.jit, static_argnums=0)
  def solve(closed, x):
    return jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x)[0]

  def program(i):
    w = jnp.full((4,), 1.5 + i)
    return solve(jax.make_jaxpr(lambda v: jnp.sin(v) * w + 1.0)(X), X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


def test_jaxprs_that_differ_in_a_literal_or_an_equation_never_share():
  jcc.enable()
  solve = jax.jit(lambda c, x: jax.core.eval_jaxpr(c.jaxpr, c.consts, x)[0],
                  static_argnums=0)
  fs = [lambda v: v * 2.0, lambda v: v * 3.0, lambda v: jnp.cos(v) * 2.0,
        lambda v: v * 2.0]
  for f in fs * 2:
    got = solve(jax.make_jaxpr(f)(X), X)
    np.testing.assert_allclose(got, f(X), rtol=1e-6)


# -- 4. jax.jit of a callable object ---------------------------------------------

@dataclasses.dataclass(eq=False)
class _Model:
  fn: object

  def __call__(self, v):
    return self.fn(v) + 1.0


def test_jit_of_a_callable_object_hits():
  jcc.enable()

  def program(i):
    w = jnp.full((4,), 2.0 + i)
    return jax.jit(_Model(lambda v: v * w))(X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


def test_unhashable_callable_object_keeps_stocks_type_error():
  @dataclasses.dataclass   # eq=True: __hash__ is None
  class Unhashable:
    def __call__(self, v):
      return v

  jcc.enable()
  with pytest.raises(TypeError) as ours:
    jax.jit(Unhashable())(X)
  jcc.disable()
  with pytest.raises(TypeError) as stock:
    jax.jit(Unhashable())(X)
  assert type(ours.value) is type(stock.value)


def test_long_lived_callable_object_keeps_its_first_trace_like_stock():
  """Identity first: stock keys its trace on the object, so an attribute
  changed after the first call is not seen by a new jit of the same object;
  neither is it here."""
  def run():
    m = _Model(lambda v: v * 2.0)
    first = jax.jit(m)(X)
    m.fn = lambda v: v * 5.0
    return first, jax.jit(m)(X)
  jcc.enable()
  for _ in range(3):
    got = run()
    want = stock_off(run)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)


def test_a_new_call_method_on_the_class_is_seen():
  class Scaled:
    def __init__(self, w):
      self.w = w

    def __call__(self, v):
      return v * self.w

  jcc.enable()
  for _ in range(3):
    jax.jit(Scaled(jnp.ones(4)))(X)
  Scaled.__call__ = lambda self, v: v + self.w
  np.testing.assert_array_equal(jax.jit(Scaled(jnp.ones(4)))(X), X + 1.0)


# -- 5. bound methods in a pytree's static part ----------------------------------

class _Inner:
  def __init__(self, w):
    self.w = w

  def apply(self, v):
    return v * self.w


@jax.tree_util.register_pytree_node_class
class _State:
  """Flattens its ``__dict__``: arrays as children, the rest (a bound
  method among them) as aux data."""

  def __init__(self, **kw):
    self.__dict__.update(kw)

  def tree_flatten(self):
    keys = sorted(self.__dict__)
    arrays = tuple(k for k in keys if isinstance(self.__dict__[k], jax.Array))
    rest = tuple((k, self.__dict__[k]) for k in keys if k not in arrays)
    return [self.__dict__[k] for k in arrays], (arrays, rest)

  @classmethod
  def tree_unflatten(cls, aux, children):
    arrays, rest = aux
    return cls(**dict(zip(arrays, children)), **dict(rest))


def test_bound_method_in_a_pytrees_static_part_hits():
  jcc.enable()

  def program(i):
    inner = _Inner(jnp.full((4,), 2.0 + i))
    state = _State(apply=inner.apply, b=jnp.full(4, i + 0.5))
    return jax.jit(lambda v: state.apply(v) + state.b)(X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


def test_bound_method_in_a_static_treedef_hits():
  """The pytree's treedef itself passed statically (its node data holds the
  bound method, whose ``self`` holds the array)."""
  jcc.enable()
  step = jax.jit(
      lambda treedef, x: jax.tree_util.tree_unflatten(treedef, []).apply(x),
      static_argnums=0)

  def program(i):
    inner = _Inner(jnp.full((4,), 3.0 + i))
    return step(jax.tree_util.tree_structure(_State(apply=inner.apply)), X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)


# -- 6. enable() after a library built its jitted wrappers ------------------------

def test_odeint_imported_before_enable_is_reached():
  from jax.experimental import ode
  stock_wrapper = ode._odeint_wrapper
  assert type(stock_wrapper) is type(STOCK_JIT(lambda x: x))
  jcc.enable()

  def program(i):
    # (two elements: a one-element array is a scalar to XLA, which factors
    # the Runge-Kutta sums of its products, and is never shared)
    w = varied((2,), 0.5 + 0.07 * i)   # (never 1.0: stock folds w * y)
    return ode.odeint(lambda y, t: -w * y, jnp.ones(2),
                      jnp.linspace(0.0, 1.0, 3))
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)
  jcc.disable()
  assert ode._odeint_wrapper is stock_wrapper


def test_odeint_of_a_field_closing_over_negative_zeros_shares():
  """A field closing over a matrix scaled by a negative number (each zero
  a -0.0, read whole by ``w @ y``): odeint's converted function, whose key
  has no first meeting of its own, reads stock's trace at its first call
  and shares from its third, bit for bit stock's."""
  from jax.experimental import ode
  jcc.enable()
  try:
    def program(i):
      w = jnp.eye(4) * -(0.5 + 0.07 * i)
      return ode.odeint(lambda y, t: jnp.tanh(w @ y), jnp.ones(4),
                        jnp.linspace(0.0, 1.0, 3))
    compiles = []
    for i in list(range(6)) * 2:
      with counting() as c:
        got = program(i)
      compiles.append(c["compiles"])
      want = stock_off(program, i)
      assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert compiles[3:] == [0] * (len(compiles) - 3)
  finally:
    jcc.disable()


def test_wrappers_built_too_early_outside_jax_are_reported(capsys, caplog):
  """A library outside JAX that built a stock jitted wrapper taking a
  function statically before enable(): doctor and the explanation log
  name it."""
  lib = types.ModuleType("early_lib")

  def integrate(func, x):
    return func(x)
  lib.integrate = STOCK_JIT(integrate, static_argnums=0)
  lib.unrelated = STOCK_JIT(lambda x, n: x * n, static_argnums=1)
  sys.modules["early_lib"] = lib
  try:
    from jax_closure_cache import patching
    assert patching.built_before_enable() == ["early_lib.integrate"]
    from jax_closure_cache.__main__ import main
    main(["doctor"])
    assert "early_lib.integrate" in capsys.readouterr().out
    with jax.explain_cache_misses(True), caplog.at_level("INFO"):
      jcc.enable()
    assert "early_lib.integrate" in caplog.text
  finally:
    del sys.modules["early_lib"]


def test_six_patterns_mixed_in_one_program_replayed():
  """All six at once, twice with fresh objects: every result like stock."""
  from jax.experimental import ode
  jcc.enable()
  apply_nested = _apply_nested()
  solve = jax.jit(lambda c, x: jax.core.eval_jaxpr(c.jaxpr, c.consts, x)[0],
                  static_argnums=0)

  def program(i):
    w = varied((4,), 1.5 + i)
    leaves, treedef = jax.tree_util.tree_flatten(lambda v: v * w)
    a = apply_nested(X, ((tuple(leaves), treedef), "t"))

    def checked(v):
      with jax.ensure_compile_time_eval():
        ok = jnp.asarray(1 == 1)
      return jnp.where(ok, _Model(lambda u: u * w)(v), 0.0)
    b = jax.jit(checked)(a)
    c = solve(jax.make_jaxpr(lambda v: v - w)(X), b)
    state = _State(apply=_Inner(w).apply)
    d = jax.jit(lambda v: state.apply(v))(c)
    # (a whole array of two values: one element is a scalar to XLA, and a
    # slice of w may be all one value, whose Runge-Kutta sums XLA factors)
    w2 = varied((2,), 0.5 + 0.07 * i)
    e = ode.odeint(lambda y, t: -w2 * y, jnp.ones(2),
                   jnp.linspace(0.0, 0.5, 3))
    return d, e
  compiles = _run_like_stock(program, rounds=4)
  assert compiles[3:] == [0] * (len(compiles) - 3)


@jax.tree_util.register_pytree_node_class
class _Objective:
  """A hashable pytree static holding the user's function as a leaf."""

  def __init__(self, fn, tag):
    self.fn, self.tag = fn, tag

  def __hash__(self):
    return hash((self.fn, self.tag))

  def __eq__(self, other):
    return (type(other) is _Objective and self.fn is other.fn
            and self.tag == other.tag)

  def tree_flatten(self):
    return [self.fn], self.tag

  @classmethod
  def tree_unflatten(cls, tag, children):
    return cls(children[0], tag)


def test_function_in_a_registered_pytree_static_hits():
  jcc.enable()
  solve = jax.jit(lambda obj, x: obj.fn(x) * 2.0, static_argnums=0)

  def program(i):
    w = varied((4,), 1.5 + i)
    return solve(_Objective(lambda v: v * w, "t"), X)
  compiles = _run_like_stock(program)
  assert compiles[2:] == [0] * (len(compiles) - 2)
