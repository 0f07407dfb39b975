"""Re-created closures hit one shared executable; results equal stock JAX.

Every test that asserts a hit also changes the closure's contents, so a key
that ignored them would give a wrong result and fail the comparison.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache.front import verify
from conftest import warm, STOCK_JIT, assert_like_stock, counting
from conftest import replay_in_both_modes, varied


def make_inner(w):
  def inner(x):
    return jnp.tanh(x @ w)
  return inner


def stock(fun, *args, **kwargs):
  return STOCK_JIT(fun)(*args, **kwargs)


def test_recreated_closure_compiles_once():
  x = jnp.ones((4, 4))
  ws = [jnp.full((4, 4), i / 10.0) for i in range(3)]
  ws = [jnp.full((4, 4), i / 10.0) for i in range(5)]
  # The first object is stock's, the second compiles the shared entry.
  for w in ws[:2]:
    with counting() as c:
      out = jcc.jit(make_inner(w))(x)
    assert c["compiles"] == 1
    np.testing.assert_array_equal(out, stock(make_inner(w), x))
  for w in ws[2:]:
    with counting() as c:
      out = jcc.jit(make_inner(w))(x)
    assert c == {"traces": 0, "compiles": 0}
    np.testing.assert_array_equal(out, stock(make_inner(w), x))
  assert jcc.stats()["hits"] == 3 and jcc.stats()["misses"] == 2


def test_new_shape_retraces_in_same_entry_and_stays_correct():
  x4, x8 = jnp.ones((4, 4)), jnp.ones((8, 8))
  w2, w3 = 2 * jnp.eye(8), 3 * jnp.eye(8)
  jcc.jit(make_inner(jnp.eye(4)))(x4)
  out = jcc.jit(make_inner(w2))(x8)
  np.testing.assert_array_equal(out, stock(make_inner(w2), x8))
  with counting() as c:
    jcc.jit(make_inner(w3))(x8)
  assert c["compiles"] == 0


def test_static_scalar_in_cell_is_keyed_by_value():
  def make(scale):
    return jcc.jit(lambda x: x * scale)
  x = jnp.arange(3.0)
  for s in [2.0, 3.0, 2.0, 3.0, 2.0, 3.0]:
    assert_like_stock(make(s)(x), make(s).__wrapped__, x)
  # the first object is stock's and 3.0, a key met once, too; met again,
  # 2.0 and 3.0 compile an entry each, which their next objects hit
  assert jcc.stats()["misses"] == 3 and jcc.stats()["hits"] == 2
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 1}


def test_zero_signs_never_share_an_entry():
  def make(c):
    return lambda x: x * c
  x = jnp.ones(2)
  pos = jcc.jit(make(0.0))(x)
  neg = jcc.jit(make(-0.0))(x)
  assert not np.signbit(pos).any() and np.signbit(neg).all()
  np.testing.assert_array_equal(np.signbit(neg), np.signbit(stock(make(-0.0), x)))


def test_nan_matches_itself():
  def make(c):
    return lambda x: x + c
  x = jnp.ones(2)
  warm(lambda: jcc.jit(make(float("nan")))(x))
  with counting() as c:
    out = jcc.jit(make(float("nan")))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make(float("nan")), x)
  assert_like_stock(jcc.jit(make(2.0))(x), make(2.0), x)   # not NaN's entry


@pytest.mark.parametrize("order", [0, 1])
def test_int_float_bool_numpy_scalar_are_distinct(order):
  def make(c):
    return lambda x: x + c
  consts = [1, 1.0, True, np.float32(1)]
  if order:
    consts = consts[::-1]
  x = jnp.arange(3, dtype=jnp.int32)
  for c in consts * 3:
    got, want = jcc.jit(make(c))(x), stock(make(c), x)
    assert got.dtype == want.dtype and got.weak_type == want.weak_type, c
    np.testing.assert_array_equal(got, want)
  # round one: the first object and three keys met once, stock's; round
  # two: each key, met again, compiles its own entry; round three hits them
  assert jcc.stats()["misses"] == 5 and jcc.stats()["hits"] == 4
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 3}


def test_pytree_leaves_are_lifted():
  class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array

  def make(params):
    def f(x):
      return x @ params["w"] + params["pair"].a - params["pair"].b[0]
    return f

  def params(i):
    return {"w": varied((3, 3), float(i)),
            "pair": Pair(varied(3, i + 1.0), varied(2, 2.0 * i))}
  x = jnp.ones(3)
  # (not params(0): stock's module removes ``- b[0]`` by its zeros)
  p0, p5 = params(1), params(5)
  warm(lambda: jcc.jit(make(p0))(x))
  with counting() as c:
    out = jcc.jit(make(p5))(x)
  assert c["compiles"] == 0
  np.testing.assert_array_equal(out, stock(make(p5), x))


def test_lambda_in_loop_without_closure_is_one_stock_object():
  """The first object of a key is stock's own (a key met once keeps
  nothing); from the second on, every object gets one stock object."""
  fns = [jcc.jit(lambda x: x * 2 + 1) for _ in range(4)]
  # in verify mode, the later objects see the second one's stock object
  # through a view that checks their calls against their own trace
  objects = [f._jitted if isinstance(f, verify.CheckedCanonical) else f
             for f in fns]
  assert objects[1] is objects[2] is objects[3]
  assert objects[0] is not objects[1]
  assert type(objects[1]) is type(STOCK_JIT(lambda x: x))
  x = jnp.arange(3.0)
  assert_like_stock(fns[2](x), lambda x: x * 2 + 1, x)


def fresh_copy(f):
  """A new function object of ``f``'s code, globals and closure, as a
  re-created ``def`` would be."""
  import types
  return types.FunctionType(f.__code__, f.__globals__, f.__name__,
                            f.__defaults__, f.__closure__)


def test_global_array_read_directly_is_lifted():
  ns = {"jnp": jnp}
  exec("def f(x):\n  return x + G\n", ns)
  x = jnp.ones(2)
  ns["G"] = jnp.full(2, 3.0)   # (not zeros: stock's x + 0 is x)
  warm(lambda: jcc.jit(fresh_copy(ns["f"]))(x))
  ns["G"] = jnp.full(2, 7.0)
  with counting() as c:
    out = jcc.jit(fresh_copy(ns["f"]))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, ns["f"], x)


def test_a_closure_free_function_over_a_global_array_is_not_analysed_per_jit(
    monkeypatch):
  """Once its key needed lifting, a re-created closure-free function goes
  to the jit wrapper at ``jit()`` (its front matches it), without a
  canonical analysis of its key per call. An object called before and
  wrapped again is answered as its first call decided (identity first),
  whether its stock object died or not, whatever the global holds then;
  new objects read the global as stock reads it."""
  from jax_closure_cache.key import closure
  ns = {"jnp": jnp}
  exec("def f(x):\n  return x * K\n", ns)
  x = jnp.ones(2)

  def outcome(out):
    return (np.asarray(out).tobytes(), str(out.dtype), out.weak_type)

  def run():
    got = []
    # (a Python float: canonical stock objects; an array: lifted)
    for later in ((4.0, 2.0), (jnp.full(2, 3.0), jnp.full(2, 5.0), 4.0)):
      held = []
      ns["K"] = 2.0
      for _ in range(3):
        held.append(fresh_copy(ns["f"]))
        got.append(outcome(jax.jit(held[-1])(x)))
      for value in later:
        ns["K"] = value
        for _ in range(3):
          got.append(outcome(jax.jit(fresh_copy(ns["f"]))(x)))
        # identity first: each held object as its first call decided
        got += [outcome(jax.jit(g)(x)) for g in held]
    return got

  from conftest import replay_in_both_modes
  replay_in_both_modes(run, clear=True)
  jcc.enable()
  try:
    ns["K"] = jnp.full(2, 6.0)
    warm(lambda: jax.jit(fresh_copy(ns["f"]))(x))
    analysed = []
    real = closure.analyse
    monkeypatch.setattr(closure, "analyse",
                        lambda *a, **k: analysed.append(1) or real(*a, **k))
    ns["K"] = jnp.full(2, 7.0)
    with counting() as c:
      outs = [jax.jit(fresh_copy(ns["f"]))(x) for _ in range(5)]
    assert c["traces"] == c["compiles"] == 0
    assert analysed == []
    for out in outs:
      assert_like_stock(out, ns["f"], x)
  finally:
    jcc.disable()


def test_global_scalar_is_in_key():
  ns = {}
  exec("def f(x):\n  return x * K\n", ns)
  x = jnp.ones(2)
  ns["K"] = 2.0
  for _ in range(3):
    assert_like_stock(jcc.jit(fresh_copy(ns["f"]))(x), ns["f"], x)
  ns["K"] = 3.0
  assert_like_stock(jcc.jit(fresh_copy(ns["f"]))(x), ns["f"], x)


def test_same_function_object_keeps_its_trace_like_stock():
  """Identity first: a function object already called is stock's, stale
  trace included, compared with stock on a twin put through the same steps."""
  src = "def f(x):\n  return x * K\n"
  ns, twin_ns = {}, {}
  exec(src, ns)
  exec(src, twin_ns)
  x = jnp.ones(2)
  ns["K"] = twin_ns["K"] = 2.0
  mine, twin = jcc.jit(ns["f"]), STOCK_JIT(twin_ns["f"])
  np.testing.assert_array_equal(mine(x), twin(x))
  ns["K"] = twin_ns["K"] = 3.0
  with counting() as c:
    got, want = jcc.jit(ns["f"])(x), STOCK_JIT(twin_ns["f"])(x)
  assert c == {"traces": 0, "compiles": 0}
  np.testing.assert_array_equal(got, want)   # both the stale 2.0 trace
  np.testing.assert_array_equal(mine(x), twin(x))


def test_defaults_and_kwdefaults_are_keyed():
  def make(w, n):
    def f(x, w=w, *, n=n):
      return x * w + n
    return f
  x = jnp.ones(2)
  w1, w5 = jnp.full(2, 1.5), jnp.full(2, 5.0)
  warm(lambda: jcc.jit(make(w1, 1))(x))
  with counting() as c:
    out = jcc.jit(make(w5, 1))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make(w5, 1), x)
  assert_like_stock(jcc.jit(make(w5, 4))(x), make(w5, 4), x)


def loss(w, x):
  return jnp.sum((x @ w) ** 2)


def test_partial_is_keyed_by_func_args_keywords():
  x = jnp.ones((2, 2))
  w1, w3 = jnp.eye(2), 3 * jnp.eye(2)
  warm(lambda: jcc.jit(functools.partial(loss, w1))(x))
  with counting() as c:
    out = jcc.jit(functools.partial(loss, w3))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, functools.partial(loss, w3), x)
  out = jcc.jit(functools.partial(loss, x=2 * x))(jnp.eye(2))
  assert_like_stock(out, functools.partial(loss, x=2 * x), jnp.eye(2))


def test_regrad_per_step_hits():
  x = jnp.ones((2, 2))
  w, w2 = jnp.eye(2), 2 * jnp.eye(2)
  warm(lambda: jcc.jit(jax.grad(loss))(w, x))
  with counting() as c:
    g = jcc.jit(jax.grad(loss))(w2, x)
  assert c["compiles"] == 0
  assert_like_stock(g, jax.grad(loss), w2, x)


def test_grad_of_recreated_closure_hits():
  def make(data):
    return jax.grad(lambda w: jnp.sum((data @ w) ** 2))
  w = jnp.ones(3)
  d1, d2 = jnp.full((2, 3), 1.0), jnp.full((2, 3), 2.0)
  warm(lambda: jcc.jit(make(d1))(w))
  with counting() as c:
    g = jcc.jit(make(d2))(w)
  assert c["compiles"] == 0
  assert_like_stock(g, make(d2), w)


class Scaler:
  def __init__(self, s):
    self.s = s

  def apply(self, x):
    return x * self.s


def test_bound_method_refetched_is_keyed_by_self():
  x = jnp.ones(2)
  a = Scaler(2.0)
  assert_like_stock(jcc.jit(a.apply)(x), Scaler(2.0).apply, x)
  jcc.jit(a.apply)(x)   # a second bound method object compiles the entry
  with counting() as c:
    jcc.jit(a.apply)(x)
  assert c["compiles"] == 0
  a.s = 5.0
  assert_like_stock(jcc.jit(a.apply)(x), Scaler(5.0).apply, x)


def test_nested_closures_and_recursion():
  def make(w):
    def helper(x):
      return x @ w
    def rec(x, n):
      return x if n == 0 else rec(helper(x), n - 1)
    return lambda x: rec(x, 2)
  x = jnp.ones(2)
  w1, w2 = jnp.eye(2), 2 * jnp.eye(2)
  warm(lambda: jcc.jit(make(w1))(x))
  with counting() as c:
    out = jcc.jit(make(w2))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make(w2), x)


def test_closure_over_package_jitted_function():
  def make(w):
    inner = jcc.jit(lambda x: x * w)
    return lambda x: inner(x) + 1
  x = jnp.ones(2)
  w2, w3 = jnp.full(2, 2.0), jnp.full(2, 3.0)
  warm(lambda: jcc.jit(make(w2))(x))
  with counting() as c:
    out = jcc.jit(make(w3))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make(w3), x)


def test_trace_time_counter_in_closure_behaves_like_stock():
  count = [0]

  @jcc.jit
  def f(x):
    count[0] += 1
    return x + 1
  x = jnp.ones(2)
  f(x)
  f(x)
  f(x)
  assert count[0] == 1


# -- shared sub-closures: one function reached through several cells --------

def vg_factory(value_fn):
  def _vg(p):
    return jax.value_and_grad(value_fn)(p)
  return _vg


def factory_step(fun, x0, use_while):
  vg = vg_factory(fun)

  def step(p):
    v, g = vg(p)
    return p - 0.01 * g + 0.0 * fun(p)
  if use_while:
    return jcc.lax.while_loop(lambda c: c[0] < 3,
                              lambda c: (c[0] + 1, step(c[1])), (0, x0))[1]
  return jcc.jit(step)(x0)


@pytest.mark.parametrize("use_while", [False, True], ids=["jit", "while_loop"])
def test_closure_factory_beside_the_function_it_wraps_hits(use_while):
  x0 = jnp.ones(3)
  loss_for = lambda m: (lambda p: jnp.sum((m @ p) ** 2))
  ms = [jnp.eye(3) * (i + 1) for i in range(5)]
  for m in ms[:2]:
    factory_step(loss_for(m), x0, use_while)
  for m in ms[2:]:
    with counting() as c:
      out = factory_step(loss_for(m), x0, use_while)
    assert c["compiles"] == 0
    if use_while:
      want = jax.lax.while_loop(
          lambda c: c[0] < 3,
          lambda c: (c[0] + 1, c[1] - 0.01 * jax.grad(loss_for(m))(c[1])),
          (0, x0))[1]
    else:
      want = STOCK_JIT(lambda p: p - 0.01 * jax.grad(loss_for(m))(p))(x0)
    np.testing.assert_allclose(out, want, rtol=1e-6)
  assert jcc.stats()["not_stored"] == {}


def test_closure_over_closure_hits_when_only_the_array_changes():
  def make(w, c):
    inner = lambda y: y * w + c
    mid = lambda y: inner(y) * 2.0
    return lambda x: mid(x) + inner(x)
  x = jnp.ones(3)
  warm(lambda: jcc.jit(make(jnp.full(3, 1.5), 1.0))(x))
  for i in range(2, 5):
    w = jnp.full(3, float(i))   # outside the counted block
    with counting() as c:
      out = jcc.jit(make(w, 1.0))(x)
    assert c["compiles"] == 0
    assert_like_stock(out, make(jnp.full(3, float(i)), 1.0), x)


def test_fast_front_answers_as_the_generic_call():
  """The generated front (front/generated.py) takes the hit in one frame; a new
  input shape traces through it, a closure that reads another value is not
  its hit, and a function referenced weakly keeps its identity row."""
  import weakref
  from jax_closure_cache.front import wrapper
  x4, x8 = jnp.ones((4, 4)), jnp.ones((8, 8))
  for i in range(2):
    jcc.jit(make_inner(jnp.eye(4) * i))(x4)
  w = jcc.jit(make_inner(jnp.eye(4) * 3))
  assert type(w) is not wrapper.ClosureJitted
  assert isinstance(w, wrapper.ClosureJitted)
  assert type(w).__name__ == "ClosureJitted"
  with counting() as c:
    out = w(x4)
  assert c == {"traces": 0, "compiles": 0}
  assert_like_stock(out, w.__wrapped__, x4)
  # a new shape traces the shared entry from the front's own frame
  f8 = make_inner(jnp.eye(8) * 2)
  with counting() as c:
    out = jcc.jit(f8)(x8)
  assert c["compiles"] == 1
  assert_like_stock(out, f8, x8)
  # a value the front compares differs: not its hit (a stale one would
  # return tanh)
  def make_mode(w, mode):
    def inner(x):
      return (jnp.tanh if mode == "tanh" else jnp.sin)(x @ w)
    return inner
  for i in range(3):
    jcc.jit(make_mode(jnp.eye(4) * i, "tanh"))(x4)
  assert type(jcc.jit(make_mode(x4, "tanh"))) is not wrapper.ClosureJitted
  f = make_mode(jnp.eye(4) * 5, "sin")
  out = jcc.jit(f)(x4)
  assert_like_stock(out, f, x4)
  # a function the user refers to weakly: its first wrapper's row is found
  g = make_inner(jnp.eye(4) * 7)
  ref = weakref.ref(g)
  first = jcc.jit(g)(x4)
  with counting() as c:
    again = jcc.jit(g)(x4)
  assert c == {"traces": 0, "compiles": 0} and ref() is g
  np.testing.assert_array_equal(first, again)
  # a front of the same code reused after its keys' entries are cleared
  jcc.clear()
  out = jcc.jit(make_inner(jnp.eye(4) * 9))(x4)
  assert_like_stock(out, make_inner(jnp.eye(4) * 9), x4)


def test_a_miss_walks_the_closure_once_plus_the_post_trace_check(
    monkeypatch):
  """The second function object of a code (the miss that traces the shared
  entry) walks its closure twice: once for its key, once after the trace to
  check what it captured. The walk is the closure key's (``Analysis``, a
  ``Walk``); the trace reuses the miss's walk and the lookup the front's.
  Results as stock's, replayed."""
  from jax_closure_cache.key import closure
  walks = []
  init = closure.Analysis.__init__

  def counted(self, *args, **kwargs):
    walks.append(1)
    init(self, *args, **kwargs)
  monkeypatch.setattr(closure.Analysis, "__init__", counted)
  jcc.enable()
  make = lambda w, b: lambda v, b=b: jnp.tanh(v @ w) + b
  x = jnp.ones((4, 4))
  for replay in range(2):
    for i in range(3):
      w, b = jnp.eye(4) * i, jnp.full((4,), i + 0.5)   # (b added: not 0)
      del walks[:]
      got = jax.jit(make(w, b))(x)
      if (replay, i) == (0, 1):   # the miss
        assert len(walks) == 2, walks
      if replay:   # hits
        assert jcc.stats()["misses"] == 2
      assert_like_stock(got, make(w, b), x, rtol=1e-6)


def test_one_array_at_two_places_is_one_object_in_the_trace():
  """Stock's trace sees one object where the closure holds one array twice
  (an ``is`` test, constants deduplicated by identity); a function holding
  two distinct arrays there has another key, and the fast matcher of one
  key never answers a function of the other."""
  def make(a, b):
    def f(x):
      return x * a + b if a is b else x * a - b
    return f
  # (not ones or zeros: x * a and x - b are removed by their values in
  # stock's module)
  w1, w2, w3 = (jnp.full(3, v) for v in (1.5, 2.0, 3.0))
  x = jnp.arange(3.0)
  pairs = [(w1, w2), (w2, w3), (w1, w1), (w2, w2), (w3, w1), (w3, w3)]
  for _ in range(2):
    for a, b in pairs:
      assert_like_stock(jcc.jit(make(a, b))(x), make(a, b), x)
  last = [(w3, w2), (w1, w1)]
  with counting() as c:
    outs = [jcc.jit(make(a, b))(x) for a, b in last]
  assert c["traces"] == 0 and c["compiles"] == 0
  for out, (a, b) in zip(outs, last):
    assert_like_stock(out, make(a, b), x)


def _bits(tree):
  """Each leaf's dtype, weak type and bytes: equal only bit for bit."""
  return [(a.dtype, a.weak_type, np.asarray(a).tobytes())
          for a in jax.tree_util.tree_leaves(tree)]


def _stats_of_two_runs(run) -> dict:
  """``jcc.stats()`` after ``run()`` twice with both tiers (cleared first):
  the second run replays the first's keys."""
  jcc.clear()
  jcc.enable()
  try:
    run()
    run()
    return jcc.stats()
  finally:
    jcc.disable()


def _assert_tier_a_alone_gives(run, want):
  """``run()`` with tier A alone (``enable(closure_key=False)``, cleared
  first) returns ``want``: the value rules are both tiers'."""
  jcc.clear()
  jcc.enable(closure_key=False)
  try:
    assert run() == want
  finally:
    jcc.disable()


def test_lifted_arrays_stock_folds_by_value_are_stocks():
  """A closed-over jax array is an argument of its entry, where stock's
  module bakes it and XLA simplifies by its value: ``x * 1``, ``x + 0``,
  ``x / -1``, ``max(x, -inf)`` and ``x - nan`` are removed or folded there,
  and the runtime's operation flushes a subnormal ``x``, makes ``-0.0 +
  0.0`` a ``0.0`` and gives a NaN another sign. A call whose arrays hold
  such a value (a zero, a -0.0, a NaN, a subnormal; 1, -1 or an infinity
  where the trace multiplies, divides, bounds by it) is stock's; one whose
  trace computes with the array's value (``sqrt(c)``, ``sign(c)``) never
  shares. Through ``jit``, ``grad``, ``scan`` and an SGD step built per
  learning rate, a one-trip loop's carry or scanned operand (XLA removes
  the loop), an element of an array only partly 1 or 0 (XLA folds the
  element), and a signature traced later that reads the array by its
  value where the first did not; ordinary values share, and tier A alone
  answers alike."""
  x = jnp.asarray([1e-39, -0.0, np.nan, 2.0], jnp.float32)
  values = (3.0, 1.0, 1.0, 0.5, 0.0, -0.0, np.nan, 1e-39, -1.0, np.inf,
            -np.inf, 2.0, 2.0, 0.5)

  def ops(c):
    def f(v):
      return (v * c, v + c, -(v - c), v / c, jnp.maximum(v, c),
              jnp.minimum(v, -c), jnp.tanh(v * c),
              jax.lax.scan(lambda a, _: (a * c, None), v, None, length=2)[0])
    return f

  def by_value(c):   # (never shared: XLA computes sqrt(c) at compile time)
    return lambda v: (v * jnp.sqrt(c), v * jnp.sign(c))

  def later_signature(c):   # a matrix reads ``c`` by identity, a vector not
    return lambda v: v * c if v.ndim == 2 else v - 1.0

  def looped(c):   # a carry or scanned operand XLA sees in a one-trip loop
    w = jnp.full(4, c)
    return lambda v: (
        jax.lax.scan(lambda a, _: (a * v, None), w, None, length=1)[0],
        jax.lax.scan(lambda a, r: (a + r, None), v, w[None])[0],
        jax.lax.fori_loop(0, 1, lambda i, a: a * v, w))

  def parts(c):   # an element or slice of an array that is not all 1 or 0
    w = jnp.stack([c, jnp.float32(2.0)])
    return lambda v: (v * w[0], v + w[0], v[:1] * w[:1], v - w[:1].sum())

  def sgd(lr):
    def update(grads):
      return jax.tree_util.tree_map(lambda g: -lr * g, grads)
    return update

  def loss(c):
    return lambda p: jnp.sum((p * c) ** 2)

  def run():
    outs = []
    for v in values:
      c = jnp.float32(v)
      outs.append(_bits(jax.jit(ops(c))(x)))
      outs.append(_bits(jax.jit(by_value(c))(x)))
      outs.append(_bits(jax.jit(sgd(c))({"w": x, "b": x[:2]})))
      outs.append(_bits(jax.jit(jax.grad(loss(c)))(x[3:])))
      outs.append(_bits(jax.jit(looped(c))(x)))
      outs.append(_bits(jax.jit(parts(c))(x)))
    for v in (3.0, 2.0, 1.0, 1.0, 2.0):
      # (the matrix's signature is first traced by a hit at 1.0)
      c = jnp.float32(v)
      outs.append(_bits(jax.jit(later_signature(c))(x)))
      if v == 1.0:
        outs.append(_bits(jax.jit(later_signature(c))(x[None])))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)
  stats = _stats_of_two_runs(run)
  assert stats["hits"] > 0   # ordinary values share
  assert stats["fallback_reasons"].get("lifted_value", 0) > 0
  assert stats["fallback_reasons"].get("folds_constants", 0) > 0


def test_values_computed_from_lifted_arrays_that_xla_folds_are_stocks():
  """A value computed from a closed-over array by more than moves (``c -
  2.0``, ``c.astype(bool)``, ``c.astype(int)``, ``i // 2``, ``i & 1``, ``i
  == j``) that an operation XLA removes by 1 or 0 reads: stock's module
  folds the value and then removes ``y * 1`` or ``y + 0``, keeping the
  subnormal, the -0.0 and the NaN's sign of ``y``, which the shared
  executable's runtime operation changes, for floating and integer arrays
  alike, at the top level and inside a loop, a ``cond`` and a ``vmap``. A
  conversion that keeps every value (int8 or int16 to float32) still
  moves it, and an ordinary array still shares; tier A alone answers
  alike."""
  y = jnp.asarray([1e-39, -0.0, 3.0, np.nan], jnp.float32)

  def derived(c, i):
    return lambda v: (
        v + (c - 2.0), v * c.astype(jnp.int32), v * c.astype(bool),
        v + (c.astype(jnp.int32) - 2), v * (i[0] // 2), v * (i[0] & 1),
        v * (i[0] == i[1]), v + (i[0] - i[1]),
        jax.lax.scan(lambda a, _: (a * c.astype(bool), None), v, None,
                     length=3)[0],
        jax.lax.cond(v[2] > 0, lambda u: u * c.astype(bool), lambda u: u, v),
        jax.vmap(lambda u: u * c.astype(bool))(v))

  def moved(c8, h):   # exact conversions: read where all 1, -1 or inf
    return lambda v: (v * c8.astype(jnp.float32), v * h.astype(jnp.float32),
                      v + h.astype(jnp.float32))

  def run():
    outs = []
    for v, i in ((2.0, (3, 3)), (1.5, (2, 7)), (5.7, (5, 2)), (2.6, (4, 4)),
                 (2.0, (3, 3))):
      c, ii = jnp.float32(v), jnp.asarray(i, jnp.int32)
      outs.append(_bits(jax.jit(derived(c, ii))(y)))
    for v in (3, 1, 3, 0, 1, 2, 2):
      c8, h = jnp.int8(v), jnp.int16(v)
      outs.append(_bits(jax.jit(moved(c8, h))(y)))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)
  stats = _stats_of_two_runs(run)
  assert stats["hits"] > 0   # exact conversions of ordinary values share
  assert stats["fallback_reasons"].get("folds_constants", 0) > 0


def test_what_xla_folds_beyond_a_whole_constant_is_stocks():
  """XLA simplifies stock's module by a baked array's value in more places
  than a product by the whole array: arithmetic on closed-over arrays
  alone (``c * 1e-10``, whose subnormal result the evaluator keeps and
  the runtime flushes; ``c - c * 1.0000001``, which the runtime fuses into
  one multiply-add), a dot or a convolution by a one-element 1, an
  element reached through a mix with a runtime value (a slice of a
  concatenation, a choice between equal arms or by a literal, a stacked
  element), inside loops, and an inner ``jit`` closing over the array
  (stock keeps it the callee's constant). Each is stock's in both modes
  and in tier A alone; an ordinary closure still shares."""
  x = jnp.asarray([1e-39, -0.0, 3.0, np.nan], jnp.float32)

  def folded(c, d, n):
    return lambda y: (
        d * 1e-10, c - c * 1.0000001, y[:, None] @ c[None, :1],
        jnp.einsum("i,->i", y, c[0]), y * jnp.concatenate([c[:1], y])[0],
        y * jnp.where(y > 0, c[:1], c[:1]), y * jnp.where(True, c[:1], y),
        y * jnp.stack([c[0], y[0]])[0], y * jnp.concatenate([n, y])[0],
        jax.lax.while_loop(
            lambda s: s[1] < 1,
            lambda s: (s[0] * jnp.concatenate([c[:1], s[0]])[0], s[1] + 1),
            (y, 0))[0],
        jax.lax.scan(lambda s, _: (s * jnp.concatenate([c[:1], s])[0], None),
                     y, None, length=2)[0],
        jax.jit(lambda: d * 1e-10)())

  def ordinary(w):
    return lambda y: jnp.tanh(y * w)

  def run():
    outs = []
    for v in (3.0, 5.0, 1.0, 5.0, 1.0):
      c = jnp.asarray([v, v + 1.0, v + 2.0, v + 3.0], jnp.float32)
      d = jnp.full(4, v * 1e-30, jnp.float32)
      n = np.asarray([v], np.float32)
      outs.append(_bits(jax.jit(folded(c, d, n))(x)))
      outs.append(_bits(jax.jit(ordinary(c + 0.5))(x)))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)
  stats = _stats_of_two_runs(run)
  assert stats["hits"] > 0   # the ordinary closure shares


def test_closed_over_negative_zeros_share_unless_a_part_is_taken():
  """XLA keeps a -0.0 of a baked array read whole (a product, a dot, the
  array returned or reshaped), so a closure over one shares its
  executable; a part taken (``c[0]``, also of a mix with a runtime value,
  inside ``cond``, ``while`` and an inner ``jit``; a ``split``; a ``pad``
  cropping) is folded in stock's module (to 0.0, or a part all -0.0 to a
  zero XLA removes ``y - 0`` by), so those calls are stock's, in both
  modes and in tier A alone."""
  y = jnp.asarray([[1.0, -1.0], [0.0, -0.0]], jnp.float32)

  def whole(c):
    return lambda y: (jnp.tanh(c @ y), y * c, c, c.reshape(4), c.T + y)

  def parts(c):
    mix = lambda y: jnp.concatenate([c, y])
    return lambda y: (
        c[0], y * c[0], mix(y)[0], jnp.where(y > 0, c, c)[0],
        jnp.stack([c, y])[0, 0],
        jax.lax.cond(y[0, 0] > 0, lambda z: z[0], lambda z: z[1], mix(y)),
        jax.lax.fori_loop(0, 1, lambda i, a: mix(y)[i], y[0]),
        jax.jit(lambda z: z[0])(mix(y)), jax.jit(lambda: c[0])())

  def split(c):
    return lambda y: y[:, 1:] - jnp.split(c, 2, axis=1)[0]

  def cropped(c):
    return lambda y: y[:, 1:] - jax.lax.pad(c, 7.0, [(0, 0, 0), (0, -1, 0)])

  def run(makers=(whole, parts, split, cropped)):
    outs = []
    for s in (1.0, -3.0, 5.0, -3.0, 5.0):
      c = jnp.asarray([[-0.0, 1.0], [-0.0, 2.0]], jnp.float32) * s
      outs.extend(_bits(jax.jit(make(c))(y)) for make in makers)
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)
  for makers, hits in (((whole,), 3), ((parts,), None), ((split,), None),
                       ((cropped,), None)):
    jcc.clear()
    jcc.enable()
    try:
      run(makers)
      stats = jcc.stats()
    finally:
      jcc.disable()
    if hits is not None:   # the whole reads share (after two meetings)
      assert stats["hits"] == hits and not stats["fallbacks"]
    else:   # each call of the parts over a -0.0 is stock's (s = 5.0,
      # twice; s = 1.0 is a first meeting, and a negative s makes +0.0)
      assert stats["fallback_reasons"].get("lifted_value", 0) >= 2


def test_a_closed_over_typed_key_is_read_once_while_it_lives(monkeypatch):
  """A typed PRNG key closed over call after call (folded in with a
  runtime step) is read by the value check once while it lives, as an
  array is, not on every hit; the calls are stock's bit for bit."""
  from jax_closure_cache.lowering import structure
  key, x = jax.random.key(0), jnp.ones(3)

  def run():
    return [_bits(jax.jit(lambda x, n: x * w + jax.random.normal(
        jax.random.fold_in(key, n), (3,)))(x, jnp.int32(i)))
            for i in range(6) for w in [varied(3, 0.5 + i)]]

  want = replay_in_both_modes(run, clear=True)
  read = []
  real = structure._leaf_answer
  monkeypatch.setattr(structure, "_leaf_answer",
                      lambda c: read.append(type(c)) or real(c))
  jcc.clear()
  jcc.enable()
  try:
    assert run() == want
    stats = jcc.stats()
  finally:
    jcc.disable()
  assert stats["hits"] >= 3
  assert read.count(type(key)) == 1


def test_a_closed_over_index_into_a_constant_is_stocks():
  """A closed-over integer index picking elements of an array baked in
  both modules (the function's own constant, or one built from literals)
  decides a value stock's module folds: where the part picked is all 1 or
  all 0, XLA removes ``y * part`` or ``y + part``, keeping a subnormal
  ``y`` the shared executable's product flushes. So the index is read by
  value: ``dynamic_slice``, ``gather`` and ``dynamic_update_slice``, a
  closed-over predicate choosing a built arm, an index into a mix holding
  built elements, in both modes and in tier A alone (adversarial passes
  65 and 66)."""
  y = jnp.asarray([1e-39, -0.0, 3.0, np.nan], jnp.float32)
  table = np.asarray([2, 3, 5, 7, 1, 1, 1, 1], np.float32)

  picks = (
      lambda i, idx: lambda y: y * jax.lax.dynamic_slice(table, (i,), (4,)),
      lambda i, idx: lambda y: y + jax.lax.dynamic_slice(
          table - 1.0, (i,), (4,)),
      lambda i, idx: lambda y: y * jnp.asarray(table)[idx],
      lambda i, idx: lambda y: y * jax.lax.dynamic_update_slice(
          jnp.ones(8), jnp.full(4, 2.0), (i,))[:4],
      # (pass 66) a built arm chosen, built elements picked from a mix, an
      # update into built zeros (which XLA rewrites around a runtime index)
      lambda i, idx: lambda y: jax.lax.select_n(
          idx > 3, y * 2, jnp.ones(4)) * y,
      lambda i, idx: lambda y: jax.lax.dynamic_slice(
          jnp.concatenate([y * 2, jnp.zeros(4)]), (i,), (4,)) + y,
      lambda i, idx: lambda y: jax.lax.dynamic_update_slice(
          jnp.zeros(4), y[:2] * 3, (i % 3,)) + y,
      lambda i, idx: lambda y: jnp.zeros(4).at[i % 4].set(y[0] * 3) + y,
      # (review) elements a jitted library call builds from a literal
      # (jnp.pad's value), and a call on literals alone
      lambda i, idx: lambda y: y[:1] + jax.lax.dynamic_slice(
          jnp.pad(y, (0, 4)), (i + 1,), (1,)),
      lambda i, idx: lambda y: jax.lax.dynamic_slice(jnp.concatenate(
          [y * 2, jax.jit(lambda: jnp.zeros(4))()]), (i,), (4,)) + y)

  def run():
    return [_bits(jax.jit(pick(jnp.int32(v), jnp.asarray(ix, jnp.int32)))(y))
            for pick in picks
            for v, ix in ((0, [0, 1, 2, 3]), (1, [1, 2, 3, 0]),
                          (4, [4, 5, 6, 7]), (0, [0, 1, 2, 3]),
                          (4, [4, 5, 6, 7]))]

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)


def test_a_closed_over_iota_holding_a_negative_zero_is_stocks():
  """XLA stores a baked array whose values are 0, s, 2s, ... as an iota
  (comparing by value: a leading -0.0 counts as 0), so its -0.0 becomes
  0.0 even read whole (``y * c``, also after a reshape): such a leaf is
  stock's, in both modes and in tier A alone (the maintainers' review of
  the -0.0 rule)."""
  y = jnp.ones(4, jnp.float32)

  def run():
    outs = []
    for s in (2.0, 3.0, 1.0, 3.0, 1.0):
      c = jnp.asarray([-0.0, 1.0, 2.0, 3.0], jnp.float32) * s
      m = c.reshape(2, 2)
      outs.append(_bits(jax.jit(lambda y: y * c)(y)))
      outs.append(_bits(jax.jit(lambda y: y * m.reshape(4) + 1.0)(y)))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)


def test_a_one_piece_split_of_a_narrow_float_shares():
  """``jnp.split(c, 1)`` of a closed-over float16 array is the whole
  array moved, as a slice is: the closure shares, stock's bits."""
  y = jnp.asarray([0.5, -0.0, 3.0, 2.0], jnp.float16)

  def run():
    return [_bits(jax.jit(lambda y: y * jnp.split(c, 1)[0])(y))
            for s in (2.0, 3.0, 5.0, 3.0, 5.0)
            for c in [jnp.asarray([0.5, 1.5, 2.5, 3.5], jnp.float16) * s]]

  want = replay_in_both_modes(run, clear=True)
  jcc.clear()
  jcc.enable()
  try:
    assert run() == want
    stats = jcc.stats()
  finally:
    jcc.disable()
  assert stats["hits"] >= 3 and not stats["fallbacks"]


def test_a_chain_by_an_array_of_one_value_and_a_scalar_is_stocks():
  """XLA rewrites an array constant whose elements are all equal as a
  scalar's broadcast, then reassociates it with a scalar constant in the
  same product or sum (``(y * A) * 0.7`` as ``y * 0.07``, one rounding
  where the shared executable makes two). Such a chain of a closed-over
  array and a scalar is stock's, also inside a cond's branch, through an
  inner jit, with the scalar taken from the array, with the array the
  function's own and the scalar closed over, in both modes and in tier A
  alone (adversarial pass 67)."""
  y = jnp.asarray(np.random.default_rng(1).standard_normal(8), jnp.float32)
  varied = np.asarray([0.1, 0.2, 0.3, 0.7, 0.3, 0.9, 1.3, 0.11], np.float32)
  uniform = np.full(8, 0.1, np.float32)

  chains = (
      lambda a, s: lambda y: (y * a) * 0.7,
      lambda a, s: lambda y: (y + a) + 0.7,
      lambda a, s: lambda y: (y * 0.7) * a,
      lambda a, s: lambda y: jax.lax.cond(
          y[0] > -100, lambda y: (y * a) * 0.7, lambda y: y, y),
      lambda a, s: lambda y: jax.jit(lambda y: y * a)(y) * 0.7,
      lambda a, s: lambda y: (y * a[0]) * a,
      lambda a, s: lambda y: (y * s) * jnp.asarray(np.full(8, 0.1,
                                                           np.float32)))

  def run(arrays=(varied, uniform, varied, uniform)):
    return [_bits(jax.jit(chain(jnp.asarray(a), jnp.float32(a[1])))(y))
            for chain in chains for a in arrays]

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)
  # an array of several values is read by value per call, not refused:
  # chained with a scalar it shares
  others = [varied * (1 + k / 8) for k in range(4)]
  stats = _stats_of_two_runs(lambda: run(others[:1]) + run(others))
  assert stats["hits"] >= 8, stats


def test_a_partly_unrolled_loop_chaining_a_closed_over_value_is_stocks():
  """A scan unrolled by ``1 < k < length`` runs ``k`` copies of its body in
  each trip, the carry passed from one copy to the next: stock's module
  holds ``(x * c) * c`` and XLA folds ``c * c`` there. A body applying a
  closed-over value to the carry so is stock's (scan, fori_loop, a sum, an
  array, with per-step outputs), in both modes and in tier A alone; a
  loop kept whole (unroll 1) shares (adversarial pass 68)."""
  y = jnp.asarray(np.random.default_rng(0).standard_normal(8), jnp.float32)
  scan, fori = jax.lax.scan, jax.lax.fori_loop

  bodies = (
      lambda c: lambda y: scan(lambda x, _: (x * c, None), y, None,
                               length=4, unroll=2)[0],
      lambda c: lambda y: fori(0, 4, lambda i, x: x * c, y, unroll=2),
      lambda c: lambda y: scan(lambda x, _: (x + c, None), y, None,
                               length=5, unroll=2)[0],
      lambda c: lambda y: scan(lambda x, _: (x * (c + jnp.arange(8.0)),
                                             x), y, None, length=4,
                               unroll=3),
      # (pass 70) unrolled whole, XLA's straight-line code: the copies
      # chain too, by a scalar or an array of several values
      lambda c: lambda y: scan(lambda x, _: (x * c, None), y, None,
                               length=2, unroll=2)[0],
      lambda c: lambda y: fori(0, 3, lambda i, x: x + c * jnp.arange(
          1.0, 9.0), y, unroll=True))

  def run():
    return [_bits(jax.jit(body(jnp.float32(v)))(y))
            for body in bodies for v in (0.3, 1.1, 0.3, 1.1)]

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)

  def whole():   # unroll 1: the loop's parameter, never folded
    return [_bits(jax.jit(lambda y: scan(lambda x, _: (x * c, None), y, None,
                                         length=4)[0])(y))
            for c in map(jnp.float32, (0.3, 1.1, 0.3, 1.1))]

  assert replay_in_both_modes(whole, clear=True) == whole()
  assert _stats_of_two_runs(whole)["hits"] >= 6


def test_a_dot_summing_nothing_is_a_product_in_a_chain():
  """XLA makes a ``dot_general`` that sums nothing (batch dimensions alone,
  ``einsum("i,i->i")``; an outer product, contracting a dimension of size
  1) a multiply, and reassociates it with a product by a constant beside
  it: such a chain of a closed-over array is stock's where XLA folds it
  (an array of one value and a scalar, two arrays), in both modes and in
  tier A alone (adversarial pass 70); a dot that sums shares."""
  y = jnp.asarray(np.random.default_rng(2).standard_normal(8), jnp.float32)
  varied = np.asarray([0.1, 0.2, 0.3, 0.7, 0.3, 0.9, 1.3, 0.11], np.float32)
  uniform = np.full(8, 0.1, np.float32)
  ein = functools.partial(jnp.einsum, "i,i->i")
  chains = (
      lambda a: lambda y: ein(y, a) * 0.7,
      lambda a: lambda y: ein(ein(y, a), a),
      lambda a: lambda y: (y[:, None] @ a[None, :]) * 0.7)

  def run():
    return [_bits(jax.jit(chain(jnp.asarray(a)))(y))
            for chain in chains for a in (varied, uniform, varied, uniform)]

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)

  def summed():   # (a dot summing: no chain XLA reassociates)
    return [_bits(jax.jit(lambda y: (y @ a) * 0.7)(y.reshape(1, 8)))
            for a in [jnp.asarray(varied * k).reshape(8, 1)
                      for k in (1.0, 2.0, 1.0, 2.0)]]

  assert replay_in_both_modes(summed, clear=True) == summed()
  assert _stats_of_two_runs(summed)["hits"] >= 6


def test_products_of_products_and_narrow_conversions_in_a_chain_are_stocks():
  """XLA gathers the array constants of a product of products and
  multiplies them together in stock's module (``(x * C) * (y * D)``,
  ``square(x * C)``, a dot or a norm of such), and computes a bfloat16
  product in float32, removing the conversions around it, so a chain goes
  on through ``astype`` (``(x * c).astype(f32) * 0.7``, a loss-scaled
  update). Each is stock's in both modes and in tier A alone (adversarial
  pass 71); a product by one array shares."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(8), jnp.float32)
  y = jnp.asarray(rng.standard_normal(8), jnp.float32)
  h = jnp.asarray(rng.standard_normal(8), jnp.bfloat16)
  arrays = [np.random.default_rng(k).standard_normal(8).astype(np.float32)
            for k in (3, 7, 3, 7)]
  f32 = jnp.float32
  chains = (
      lambda c, d, s: lambda x, y, h: jnp.square(x * c),
      lambda c, d, s: lambda x, y, h: (x * c) * (y * d),
      lambda c, d, s: lambda x, y, h: jnp.dot(x * c, y * d),
      lambda c, d, s: lambda x, y, h: jnp.linalg.norm(x * c),
      lambda c, d, s: lambda x, y, h: (h * s).astype(f32) * 0.7,
      lambda c, d, s: lambda x, y, h: x - 0.1 * (h * s).astype(f32))

  def run():
    return [_bits(jax.jit(chain(jnp.asarray(a), jnp.asarray(a[::-1]),
                                jnp.asarray(a[0], jnp.bfloat16)))(x, y, h))
            for chain in chains for a in arrays]

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)

  def one():   # a product by one array: no constants to gather
    return [_bits(jax.jit(lambda x, y: (x * jnp.asarray(a)) * y)(x, y))
            for a in arrays]

  assert replay_in_both_modes(one, clear=True) == one()
  assert _stats_of_two_runs(one)["hits"] >= 4   # (the second run)


def test_reductions_and_choices_decided_by_closed_over_arrays_are_stocks():
  """XLA rewrites a small product, maximum or minimum reduction over a
  stack holding a baked array as a chain of operations and removes those
  by 1 or -1 (``prod(stack([c, y]))``, ``cumprod``, also of ``abs(c)``),
  and folds a choice whose predicate is computed from a baked array alone
  (``where(i > 0, 1.0, y)``), then removes ``y * 1`` or ``y + 0``. Each is
  stock's in both modes and in tier A alone."""
  x = jnp.asarray([1e-39, -0.0, 3.0, np.nan], jnp.float32)

  def decided(c, i):
    return lambda y: (
        jnp.prod(jnp.stack([c, y]), 0), jnp.prod(jnp.stack([c, y, c]), 0),
        jnp.cumprod(jnp.stack([c, y]), 0)[1],
        jnp.prod(jnp.stack([jnp.abs(c), y]), 0),
        y * jnp.where(y > 0, jnp.abs(c), y),
        y * jnp.where(i > 0, 1.0, y), y + jnp.where(i > 0, 0.0, y),
        y + jnp.where(i > 0, y, 0.0))

  def run():
    outs = []
    for v, k in ((3.0, 2), (5.0, 3), (1.0, 1), (-1.0, 0), (1.0, -1)):
      c = jnp.full(4, v, jnp.float32)
      i = jnp.full(4, k, jnp.int32)
      outs.append(_bits(jax.jit(decided(c, i))(x)))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)


def test_decisions_and_elements_followed_through_calls_and_loops():
  """The value rules follow a closed-over array through calls and loops:
  a choice its value decides, multiplied inside a callee or beside it; a
  ``cond`` index it decides; an element carried through a mix and then
  computed on (``concatenate([c, y])[0] - 2.0``); a two-trip unrolled
  ``scan`` that swaps its carry; a ``device_put`` of several arrays. Each
  is stock's bit for bit in both modes and in tier A alone. (A review's
  cases: on this CPU build they matched stock before the rules followed
  them too, as other refusals or XLA's own order answered them; kept as
  guards of the rules.)"""
  x = jnp.asarray([1e-39, -0.0, 3.0, np.nan], jnp.float32)
  times = jax.jit(lambda b, u: b * u)

  def followed(i, j, c):
    return lambda y: (
        times(jnp.where(i > 0, 1.0, y), y),
        jax.jit(lambda i, y: jnp.where(i > 0, 1.0, y) * y)(i, y),
        jax.jit(lambda a, b, y: jnp.where(a > b, 1.0, y))(i, j, y) * y,
        jax.lax.cond(i > 0, jnp.ones_like, lambda u: u, y) * y,
        (jnp.concatenate([c, y])[0] - 2.0) * y,
        jax.lax.scan(lambda ab, _: ((ab[1], ab[0]), None), (c, y), None,
                     length=2, unroll=2)[0][0] * y,
        jax.device_put((c, y))[0] * y)

  def run():
    outs = []
    for k, v in ((2, 5.0), (3, 4.0), (1, 3.0), (0, 1.0), (2, 3.0)):
      i, j = jnp.asarray(k, jnp.int32), jnp.asarray(1, jnp.int32)
      c = jnp.full(4, v, jnp.float32)
      outs.append(_bits(jax.jit(followed(i, j, c))(x)))
    return outs

  want = replay_in_both_modes(run, clear=True)
  _assert_tier_a_alone_gives(run, want)


def test_lifted_values_are_checked_on_every_route_without_a_second_trace():
  """The value check of lifted arrays holds for ``.lower().compile()`` (its
  signature's trace read first), a donating entry's new signature never
  raises where stock does not (its call consumes its arguments before its
  reads are known), and a leaf
  an inner ``jit`` reads (stock's trace of the first meeting does not
  show it: checked before the lifted trace, never traced twice); a typed
  PRNG key, whose values XLA folds by none, still shares."""
  x = jnp.asarray([1e-39, 2.0], jnp.float32)
  traces = []

  def scaled(c):
    return lambda v: v * c

  def by_shape(c):   # a matrix reads ``c`` by identity, a vector adds it
    return lambda v: v * c if v.ndim == 2 else v + c

  def inner(c):
    def f(v):
      traces.append(1)
      return jax.jit(lambda u: u * c)(v)
    return f

  def keyed(k):   # (a key's data a product or a sum reads is refused: XLA
    # folds it in stock's module, and may remove the operation)
    return lambda v: jnp.dot(v, jax.random.key_data(k).astype(jnp.float32))

  def bits(a):
    return (a.dtype, a.weak_type, np.asarray(a).tobytes())

  def run():
    outs = []
    del traces[:]
    for v in (2.0, 3.0, 4.0, 1.0, 1.0, 5.0):
      c = jnp.full(2, v)
      outs.append(bits(jax.jit(scaled(c)).lower(x).compile()(x)))
      outs.append(bits(jax.jit(by_shape(c), donate_argnums=0)(x + 0.0)))
      if v == 1.0:
        # (a new signature of a donating entry whose trace reads ``c`` by
        # its value: that one call's arguments are consumed, so it is the
        # shared executable's, a documented limit; later calls stock's)
        got = jax.jit(by_shape(c), donate_argnums=0)(x[None] + 0)
        outs.append((got.dtype, got.shape))
      outs.append(bits(jax.jit(inner(c))(x)))
    for i in range(1, 5):
      outs.append(bits(jax.jit(keyed(jax.random.key(i)))(x)))
    return outs, len(traces)

  replay_in_both_modes(run, clear=True)
  jcc.clear()
  jcc.enable()
  try:
    for i in range(1, 6):
      jax.jit(keyed(jax.random.key(i)))(x)
    assert jcc.stats()["hits"] >= 3   # a typed key shares
  finally:
    jcc.disable()


def test_a_function_reading_patched_lax_hits_through_its_matcher(monkeypatch):
  # With the cache on, jax.lax.while_loop (read through the jax module) is
  # the package's launcher, which the closure walk keys through the
  # library's attribute chain. The generated matcher reads that chain as
  # the walk does: re-created closures hit through it, with no re-analysis
  # of their key and no new matcher per call (that cost ~2 ms a call).
  from jax_closure_cache.key import matchers
  from jax_closure_cache.front import inline
  compiled = []
  real = matchers.compile_matcher
  monkeypatch.setattr(matchers, "compile_matcher",
                      lambda source: compiled.append(1) or real(source))

  def make(w):
    def solve(x):
      return jax.lax.while_loop(lambda c: c[1] < 3,
                                lambda c: (c[0] @ w, c[1] + 1), (x, 0))[0]
    return solve
  x = jnp.ones(3)
  ws = [jnp.eye(3) * (i + 1.0) for i in range(6)]
  with jcc.enabled():
    for w in ws[:3]:
      jax.jit(make(w))(x)
    assert make(ws[0]).__code__ in inline.quick
    before, hits = len(compiled), jcc.stats()["hits"]
    for w in ws[3:]:
      np.testing.assert_array_equal(jax.jit(make(w))(x),
                                    STOCK_JIT(make(w))(x))
    assert jcc.stats()["hits"] - hits == 3
    assert len(compiled) == before   # no new matcher: the old one matched


def test_a_local_of_its_own_that_a_nested_function_captures_is_not_a_cell_write():
  """A function assigning a local of its own that a nested function reads
  (``scale = 0.5`` beside ``tree_map(lambda p, g: p - scale * g, ...)``,
  or a nested ``nonlocal`` of that local) writes a cell made afresh by each
  call, never its closure: it is keyed and hits, with stock's results. A
  ``nonlocal`` write to a closed-over variable stays refused."""
  from conftest import replay_like_stock
  grads = {"a": jnp.ones(3), "b": jnp.ones(2)}

  def run():
    outs = []
    for i in range(4):
      params = {"a": jnp.full(3, i + 0.5), "b": jnp.full(2, 1.5)}

      def sgd(g):
        scale = 0.5   # its own local, captured below

        def bump():
          nonlocal scale
          scale = scale * 2.0
        bump()
        return jax.tree_util.tree_map(lambda p, d: p - scale * d, params, g)
      out = jax.jit(sgd)(grads)
      outs += [np.asarray(out["a"]), np.asarray(out["b"])]
    return outs, []

  replay_like_stock(run)
  s = jcc.stats()
  assert s["hits"] >= 4, s
  assert "writes_cells" not in s["fallback_reasons"], s

  count = [0]

  def outer():
    n = 0

    def f(x):
      nonlocal n   # the closure's own variable: stock's trace bumps it
      n += 1
      count[0] = n
      return x * 2.0
    return f
  for _ in range(3):
    jax.jit(outer())(jnp.ones(2))
  assert jcc.stats()["fallback_reasons"].get("writes_cells", 0) >= 1



def _shifter():
  return lambda v: v + 1.0   # fresh, of one code, holding nothing


def _functions_user(g1, g2, a):
  def f(x):
    if g1 is g2:   # one object held twice traces otherwise
      return g1(x @ a)
    return g1(x @ a) + g2(x)
  return f


def _arrays_user(a, b):
  def f(x):
    if a is b:   # likewise one array held twice
      return x @ a - 1.0
    return x @ a + x @ b
  return f


def test_the_hit_tells_one_object_held_twice_from_two():
  """Two functions of one code, then one function held twice; two arrays,
  then one array held twice (other keys: the second place is a
  back-reference), each after hits of the distinct ones: stock's answer
  every time."""
  x = jnp.ones((3, 3))
  for i in range(4):   # stock's object, the entry, hits
    a, b = jnp.eye(3) * (i + 1), jnp.eye(3) * (i + 2)
    g1, g2 = _shifter(), _shifter()
    assert_like_stock(jcc.jit(_functions_user(g1, g2, a))(x),
                      _functions_user(g1, g2, a), x)
    assert_like_stock(jcc.jit(_arrays_user(a, b))(x), _arrays_user(a, b), x)
  for i in range(3):
    a, b = jnp.eye(3) * (i + 1), jnp.eye(3) * (i + 2)
    g1, g2 = _shifter(), _shifter()
    for args in ((g1, g1, a), (g1, g2, a), (g2, g2, b)):
      assert_like_stock(jcc.jit(_functions_user(*args))(x),
                        _functions_user(*args), x)
    for args in ((a, a), (a, b), (b, b)):
      assert_like_stock(jcc.jit(_arrays_user(*args))(x), _arrays_user(*args),
                        x)


def _three_arrays_user(a, b, c):
  def f(x):
    if b is c:
      return x @ a - 1.0
    if a is c:
      return x @ b - 2.0
    return x @ a + x @ b + x @ c
  return f


def test_three_lifted_arrays_told_apart_pair_by_pair():
  """Three arrays, then the second and third one array, then the first and
  third, each after hits of three distinct ones (the pairwise checks)."""
  x = jnp.ones((3, 3))
  fresh = lambda i: [jnp.eye(3) * (i + k) for k in (1, 2, 3)]   # noqa: E731
  for i in range(4):
    a, b, c = fresh(i)
    assert_like_stock(jcc.jit(_three_arrays_user(a, b, c))(x),
                      _three_arrays_user(a, b, c), x)
  for i in range(2):
    a, b, c = fresh(i)
    for args in ((a, b, b), (a, b, a), (a, b, c)):
      assert_like_stock(jcc.jit(_three_arrays_user(*args))(x),
                        _three_arrays_user(*args), x)


def test_closures_reading_frozen_standard_modules_and_registered_classes_hit():
  """Library code is told by where its code was loaded from: a standard
  module frozen into the interpreter (``posixpath``, ``<frozen
  posixpath>``) is the standard library's, and a class registered with
  ``register_pytree_node_class`` (JAX's registry holds its functions for
  good) keys the trace lookup and ``closure_convert`` as it keys an
  entry: re-created functions hit, and nothing falls back."""
  import posixpath
  from value_grammar import LeafNode

  @jax.tree_util.register_pytree_node_class
  class Box(LeafNode):
    pass

  a = jnp.full(2, 2.0)
  jcc.enable()
  w = 1.5
  for _ in range(5):
    jax.jit(lambda x: x * w + len(posixpath.basename("a/bc")))(a)
    jax.lax.fori_loop(0, 2, lambda i, c: Box(c.v * w + a), Box(a))
    jax.closure_convert(lambda c: c.v * w * a, Box(a))
  stats = jcc.stats()
  assert stats["fallbacks"] == 0, stats["fallback_reasons"]
  assert stats["hits"] >= 9, stats   # three of five objects, each pattern
