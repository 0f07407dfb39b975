"""Layer two: the closure key inside JAX's memoized trace lookup
(``trace_cache``). Stock ``jax.jit`` objects, ``.trace``/``.lower``/
``.eval_shape`` and JAX's own control-flow functions (not this package's
launchers) share one trace per closure key; results equal stock's with the
cache off on a fresh function object."""

import functools
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat
from conftest import (STOCK_JIT, assert_like_stock, counting,
                      needs_trace_lookup, same_as_stock, script_lines,
                      stock_off, replay_in_both_modes)

pytestmark = needs_trace_lookup


STOCK_CF = _compat.STOCK_CONTROL_FLOW
x = jnp.ones((4, 4))


def make(w):
  return lambda v: jnp.tanh(v @ w)


def test_stock_jit_called_eagerly_shares_the_trace_and_the_executable():
  """With the front installed, a stock jitted object called eagerly (made
  before ``enable()``, or by library code) gets the shared trace, and tier
  A (``lowering/shared.py``) shares its executable with the closure's
  arrays as arguments: the first object of the structure is stock's own,
  the second compiles the shared lowering, the rest compile nothing."""
  jcc.enable(verify=True)
  counts = []
  for i in range(5):
    f = make(jnp.eye(4) * (i + 1))
    with counting() as c:
      out = STOCK_JIT(f)(x)
    counts.append((c["traces"], c["compiles"]))
    assert_like_stock(out, f, x, rtol=1e-6)
  assert [n for _, n in counts] == [1, 1, 0, 0, 0], counts
  assert counts[2:] == [(0, 0)] * 3, counts
  assert jcc.stats()["verify_mismatches"] == 0


def test_fast_path_of_a_reused_stock_jitted_object_passes_its_own_leaves():
  """The C++ fast path of each jitted object carries that closure's leaves:
  two objects called alternately never see each other's arrays."""
  jcc.enable()
  for i in range(2):
    STOCK_JIT(make(jnp.eye(4) * i))(x)
  fa, fb = make(jnp.eye(4) * 2), make(jnp.eye(4) * 3)
  ja, jb = STOCK_JIT(fa), STOCK_JIT(fb)
  for _ in range(3):
    assert_like_stock(ja(x), fa, x, rtol=1e-6)
    assert_like_stock(jb(x), fb, x, rtol=1e-6)
  # and they are on the C++ fast path, as stock's own objects would be
  from jax._src import test_util as jtu
  with jtu.count_pjit_cpp_cache_miss() as misses:
    for _ in range(3):
      ja(x)
      jb(x)
  assert misses() == 0


@pytest.mark.parametrize("shape", [(4, 4), (2, 4)])
def test_the_fronts_miss_traces_once_as_stocks_and_shares_that_trace(shape):
  """Re-created closures through the front, counted with JAX's own
  counters against stock jit of fresh objects with the cache off: the miss
  (and a later new signature) traces as many times as stock's call, not
  once more inside the trace lookup; the lookup is given that trace, so
  ``.trace`` and ``.eval_shape`` of the next closure trace nothing."""
  v = jnp.ones(shape)
  for arg in (x, v):   # jnp's own inner jits, traced once for both runs
    jnp.tanh(arg @ x)
  jcc.enable()

  def call(i, arg):
    f = make(jnp.eye(4) * (i + 1))
    with counting() as c:
      out = jax.jit(f)(arg)
    return out, c["traces"], c["compiles"]
  for i, arg in enumerate([x, x, x, v, v]):
    got, traces, compiles = call(i, arg)
    want, stock_traces, stock_compiles = stock_off(call, i, arg)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (traces, compiles) <= (stock_traces, stock_compiles), i
    if i == 1 or (i == 3 and shape != (4, 4)):   # the miss, a new signature
      assert (traces, compiles) == (stock_traces, stock_compiles) == (1, 1)
    elif i > 1:
      assert (traces, compiles) == (0, 0)
  f = make(jnp.eye(4) * 9)
  with counting() as c:
    traced = jax.jit(f).trace(v)
    shape_out = jax.jit(f).eval_shape(v)
  assert c["traces"] == 0
  assert shape_out.shape == traced.out_info.shape == (shape[0], 4)


def test_aot_shares_the_calls_trace_and_passes_leaves_as_parameters():
  jcc.enable()
  for i in range(3):
    jax.jit(make(jnp.eye(4) * i))(x)
  w = jnp.eye(4) * 5
  f = make(w)
  jitted = jax.jit(f)
  with counting() as c:
    traced = jitted.trace(x)
    shape = jitted.eval_shape(x)
    lowered = jitted.lower(x)
  assert c["traces"] == 0
  # .trace is stock's (the shared trace closed over w; eager, so w is not
  # an argument); .lower is the calls' entry, which takes w as one
  assert len(traced.jaxpr.in_avals) == 1
  assert_like_stock(traced.lower().compile()(x), f, x, rtol=1e-6)
  assert shape.shape == (4, 4) and shape.dtype == jnp.float32
  text = lowered.as_text()
  assert "stablehlo.constant" not in text
  assert "%arg1" in text
  out = lowered.compile()(x)
  assert_like_stock(out, f, x, rtol=1e-6)
  # stock bakes w: its text has the constant, ours never does
  stock_text = stock_off(lambda: STOCK_JIT(make(w)).lower(x).as_text())
  assert "stablehlo.constant" in stock_text


def test_aot_after_calls_reuses_the_calls_executable():
  """``.lower(...).compile()`` of a re-created closure whose key the calls
  stored lowers the calls' entry: nothing traced or compiled, the closure's
  own arrays passed, and the ``Lowered``/``Compiled`` describe the user's
  arguments alone, as stock's do."""
  jcc.enable()
  for i in range(3):
    jax.jit(make(jnp.eye(4) * i))(x)
  wa, wb = jnp.eye(4) * 5, jnp.eye(4) * 6
  with counting() as c:
    lowered_a = jax.jit(make(wa)).lower(x)
    compiled_a = lowered_a.compile()
    out_a = compiled_a(x)
  assert (c["traces"], c["compiles"]) == (0, 0), c
  compiled_b = jax.jit(make(wb)).lower(x).compile()
  assert_like_stock(out_a, make(wa), x, rtol=1e-6)
  assert_like_stock(compiled_b(x), make(wb), x, rtol=1e-6)
  assert_like_stock(compiled_a(x), make(wa), x, rtol=1e-6)   # its own still
  stock = stock_off(lambda: STOCK_JIT(make(wa)).lower(x))
  assert lowered_a.in_tree == stock.in_tree
  assert lowered_a.in_avals == stock.in_avals
  assert lowered_a.out_info == stock.out_info
  assert compiled_a.in_avals == stock.compile().in_avals
  assert "stablehlo.constant" not in lowered_a.as_text()
  with pytest.raises(TypeError):   # stock's error for other argument types
    compiled_a(jnp.ones((3, 3)))


def test_lowered_in_avals_of_a_shared_trace_are_the_users_arguments():
  """The trace lookup's ``Lowered`` (no entry yet: ahead-of-time use first)
  passes the leaves as constants; ``in_avals`` must not count them."""
  jcc.enable()
  for i in range(3):
    jax.jit(make(jnp.eye(4) * i)).lower(x)
  lowered = jax.jit(make(jnp.eye(4) * 7)).lower(x)
  assert lowered.in_avals == ((x.aval,), {})
  assert_like_stock(lowered.compile()(x), make(jnp.eye(4) * 7), x, rtol=1e-6)


@pytest.mark.parametrize("name", ["while_loop", "scan", "cond", "switch",
                                  "fori_loop", "map"])
def test_jax_control_flow_with_fresh_closures_shares_one_executable(name):
  """JAX's own functions (no launcher): their bodies' traces are shared, so
  eager dispatch finds one executable."""
  run = {
      "while_loop": lambda w: STOCK_CF["while_loop"](
          lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)),
          (0, x))[1],
      "scan": lambda w: STOCK_CF["scan"](
          lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0],
      "cond": lambda w: STOCK_CF["cond"](
          True, lambda v: v @ w, lambda v: v - w, x),
      "switch": lambda w: STOCK_CF["switch"](
          1, [lambda v: v @ w, lambda v: v - w], x),
      "fori_loop": lambda w: STOCK_CF["fori_loop"](
          0, 3, lambda i, c: jnp.tanh(c @ w), x),
      "map": lambda w: STOCK_CF["map"](lambda v: v @ w, x),
  }[name]
  jcc.enable()
  counts = []
  for i in range(5):
    w = jnp.eye(4) * (i + 1) / 4
    with counting() as c:
      out = run(w)
    counts.append((c["traces"], c["compiles"]))
    np.testing.assert_array_equal(out, stock_off(run, w))
  assert counts[2:] == [(0, 0)] * 3, counts


def test_cond_branches_sharing_an_array_differ_from_branches_that_do_not():
  """``_dedup_consts`` is keyed on which constants are the same object: a
  pattern change is a different jaxpr, never the other's."""
  jcc.enable()

  def run(a, b):
    return STOCK_CF["cond"](False, lambda v: v @ a, lambda v: v - b, x)
  for i in range(3):
    w = jnp.eye(4) * i
    np.testing.assert_array_equal(run(w, w), stock_off(run, w, w))
  u, v = jnp.eye(4) * 7, jnp.full((4, 4), 2.0)
  np.testing.assert_array_equal(run(u, v), stock_off(run, u, v))


def test_a_trace_that_needs_a_leaf_value_falls_back_to_stock():
  jcc.enable()

  def make_branchy(w):
    def f(v):
      if np.asarray(w)[0, 0] > 0:   # concrete: the lifted trace cannot
        return v @ w
      return v - w
    return f
  for s in (1.0, 2.0, -1.0, 3.0):
    f = make_branchy(jnp.eye(4) * s)
    assert_like_stock(STOCK_JIT(f)(x), f, x)


def test_an_array_read_through_an_object_is_never_stale():
  """An object kept by identity (a root) is not covered by the key: such
  traces are not stored, so a re-assigned attribute is always read."""
  jcc.enable()

  class Holder:
    pass
  h = Holder()

  def make_reader(w):
    return lambda v: v @ w + h.b
  for i in range(4):
    h.b = jnp.full((4, 4), float(i))
    f = make_reader(jnp.eye(4))
    assert_like_stock(STOCK_JIT(f)(x), f, x)


def test_a_function_object_answered_once_keeps_its_answer_like_stock():
  """Identity first: a function object traced before answers with its
  first trace for the same signature, as stock's own cache would, even
  after its cell changes (compared with a stock twin put through the same
  steps)."""
  def make_cell(w):
    def f(v):
      return v @ w
    return f
  jcc.enable()
  for i in range(3):
    STOCK_JIT(make_cell(jnp.eye(4) * i))(x)
  f = make_cell(jnp.eye(4) * 5)
  twin = make_cell(jnp.eye(4) * 5)
  ours = STOCK_JIT(f)
  first = ours(x)
  jcc.disable()
  stock_twin = STOCK_JIT(twin)
  want_first = stock_twin(x)
  twin.__closure__[0].cell_contents = jnp.eye(4) * 9
  want_again = stock_twin(x)
  jcc.enable()
  f.__closure__[0].cell_contents = jnp.eye(4) * 9
  again = ours(x)
  np.testing.assert_array_equal(first, want_first)
  np.testing.assert_array_equal(again, want_again)


def test_the_store_never_keeps_a_leaf_alive():
  jcc.enable()
  refs = []
  for i in range(5):
    w = jnp.eye(4) * i
    refs.append(weakref.ref(w))
    f = make(w)
    jitted = STOCK_JIT(f)
    jitted(x)
    jitted(x)   # the C++ fast path, with the leaves as const args
    jax.jit(f).lower(x)
    STOCK_CF["while_loop"](lambda c, w=w: c[0] < 2,
                           lambda c, w=w: (c[0] + 1, c[1] @ w), (0, x))
    w = f = jitted = None
  gc.collect()
  assert [r() for r in refs] == [None] * 5
  assert jcc.stats()["shared_traces"] > 0


def test_the_store_offers_jax_what_register_cache_documents():
  """The shared traces are one of the store's tables: what JAX's
  ``register_cache`` is given is the store's handle, which clears them."""
  from jax_closure_cache import cache
  from jax_closure_cache.lookup import closure_cache
  handle = cache.jax_handle
  for name in ("cache_clear", "cache_info", "cache_keys"):
    assert callable(getattr(handle, name)), name
  assert cache.STORE.owns(closure_cache.traces)
  closure_cache.traces.put(("handle test",), closure_cache._Shared())
  assert ("handle test",) in handle.cache_keys()
  assert handle.cache_info()["shared_traces"] >= 1
  handle.cache_clear()
  assert len(closure_cache.traces) == 0


def test_clear_caches_clears_the_shared_traces():
  jcc.enable()
  for i in range(3):
    STOCK_JIT(make(jnp.eye(4) * i))(x)
  assert jcc.stats()["shared_traces"] > 0
  jax.clear_caches()
  assert jcc.stats()["shared_traces"] == 0
  f = make(jnp.eye(4) * 4)
  with counting() as c:
    out = STOCK_JIT(f)(x)
  assert c["traces"] >= 1   # cleared: traced again
  assert_like_stock(out, f, x, rtol=1e-6)


def test_disable_restores_every_trace_lookup_patch():
  from jax._src import pjit, stages
  from jax._src.interpreters import partial_eval as pe
  originals = (pe.trace_to_jaxpr, pjit._trace_for_jit,
               pjit._get_fastpath_data, stages.Traced.lower)
  jcc.enable()
  assert pe.trace_to_jaxpr is not originals[0]
  jcc.disable()
  assert (pe.trace_to_jaxpr, pjit._trace_for_jit,
          pjit._get_fastpath_data, stages.Traced.lower) == originals


def test_a_function_reached_twice_is_rebuilt_wherever_it_is_held():
  """``inner`` is reached through ``mid`` and directly: the lifted trace
  must rebuild both holders, or one would bake the first closure's array
  into the shared jaxpr (a stale result for every later closure)."""
  def make_nested(w):
    inner = lambda y: y * w
    mid = lambda y: inner(y) * 2.0
    return lambda y: mid(y) + inner(y)
  jcc.enable()
  v = jnp.ones(3)
  for i in range(5):
    f = make_nested(jnp.full(3, float(i)))
    assert_like_stock(STOCK_JIT(f)(v), f, v)
    assert_like_stock(jax.jit(f).lower(v).compile()(v), f, v)


def test_clear_cache_of_a_jitted_function_forgets_its_key():
  """``clear_cache()`` evicts stock's trace of the object and the trace
  lookup's traces of its key (what holds its executable alive)."""
  jcc.enable()
  for i in range(3):
    STOCK_JIT(make(jnp.eye(4) * i))(x)
  held = jcc.stats()["shared_traces"]
  f = make(jnp.eye(4) * 7)
  jitted = STOCK_JIT(f)
  jitted(x)
  jitted.clear_cache()
  assert jcc.stats()["shared_traces"] < held
  with counting() as c:
    out = STOCK_JIT(f)(x)
  assert c["traces"] >= 1   # forgotten: traced again
  assert_like_stock(out, f, x, rtol=1e-6)


def test_replaced_caches_keep_their_cache_methods():
  """JAX's own tests clear caches by name (``lax_control_flow_test``'s
  ``setUp`` clears ``common._dedup_consts``): the replacements offer what
  the caches they replace offer."""
  from jax._src.interpreters import partial_eval as pe
  from jax._src.lax.control_flow import common
  jcc.enable()
  for i in range(3):
    STOCK_JIT(make(jnp.eye(4) * i))(x)
  for cached in (pe.trace_to_jaxpr, common._dedup_consts):
    cached.cache_clear()
    assert cached.cache_info() is not None
  f = make(jnp.eye(4) * 5)
  out = STOCK_JIT(f)(x)   # stock's trace cache was cleared: still right
  assert_like_stock(out, f, x, rtol=1e-6)


# A module global the functions below read: a dict whose keys do not sort
# (code objects), as the cache's own front table is.
UNSORTABLE = {make.__code__: 1, stock_off.__code__: 2}


def test_a_closure_reading_a_dict_that_does_not_flatten_is_traced_as_usual():
  """tree_flatten raises ValueError on dict keys that do not sort; the trace
  lookup's key must then give up (trace as stock does), never raise."""
  jcc.enable()

  def body_of(w):
    return lambda c: c * w + len(UNSORTABLE)
  for i in range(4):
    w = jnp.full(3, float(i))
    out = STOCK_CF["while_loop"](lambda c: c[0] < 1,
                                 lambda c: (c[0] + 1, body_of(w)(c[1])),
                                 (0, jnp.ones(3)))[1]
    expected = stock_off(lambda: STOCK_CF["while_loop"](
        lambda c: c[0] < 1, lambda c: (c[0] + 1, body_of(w)(c[1])),
        (0, jnp.ones(3)))[1])
    np.testing.assert_array_equal(out, expected)


def test_a_closure_that_calls_the_patched_jit_by_its_global_name_is_shared():
  """``from jax import jit`` after enable() binds this package's ``jit``; a
  function reading it reaches the package, whose functions are keyed by
  identity (its globals are the cache's state, which changes with every
  store and holds dicts keyed by code objects)."""
  jcc.enable()
  jit = jax.jit   # the package's, as a module's ``from jax import jit`` binds
  assert jit is not STOCK_JIT
  # Two codes in the front table, so it does not flatten.
  for code_maker in (lambda w: (lambda v: v * w), lambda w: (lambda v: v + w)):
    for i in range(3):
      jit(code_maker(jnp.full(3, i + 2.0)))(jnp.ones(3))

  def make_outer(w):
    def outer(v):
      return jit(lambda u: u * 2.0)(v) @ w
    return outer
  counts = []
  for i in range(5):
    w = jnp.eye(4) * (i + 1)
    with counting() as c:
      out = jit(make_outer(w))(x)
    counts.append((c["traces"], c["compiles"]))
    assert_like_stock(out, make_outer(w), x, rtol=1e-6)
  assert counts[2:] == [(0, 0)] * 3, counts
  assert jcc.stats()["fallbacks"] == 0


def test_nested_functions_of_the_package_are_walked_as_a_users():
  """Only this package's module-level functions are keyed by identity: a
  function nested in one of its modules (the benchmark's workloads) is
  re-created like a user's and must share like one."""
  ns = {"__name__": "jax_closure_cache.example", "jnp": jnp}
  exec("def make_cond():\n"
       "  def cond(c):\n"
       "    return c[0] < 2\n"
       "  return cond\n", ns)
  jcc.enable()
  counts = []
  for i in range(5):
    w = jnp.full(3, float(i))
    body = lambda c: (c[0] + 1, c[1] * w)
    with counting() as c:
      out = jax.lax.while_loop(ns["make_cond"](), body, (0, jnp.ones(3)))[1]
    counts.append((c["traces"], c["compiles"]))
    np.testing.assert_array_equal(out, np.full(3, float(i)) ** 2)
  assert counts[2:] == [(0, 0)] * 3, counts


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _apply_vjp(f, x):
  return f(x)


_apply_vjp.defvjp(lambda f, x: (f(x), x),
                  lambda f, x, g: (jax.vjp(f, x)[1](g)[0],))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _apply_jvp(f, x):
  return f(x)


@_apply_jvp.defjvp
def _apply_jvp_rule(f, primals, tangents):
  return f(primals[0]), jax.jvp(f, primals, tangents)[1] * 3.0


def _transformed_bodies(i):
  """A closure over an array handed to custom rules inside control flow
  under a transformation, and a ``custom_vmap`` whose rule closes over
  one: JAX binds the transformed ``scan``/``cond`` eagerly with its
  jaxpr, whose constants hold the array, as a parameter."""
  w = jnp.arange(3.0) + i
  f = lambda x: x * w
  ones = jnp.ones(3)
  out = [jax.grad(lambda x: jnp.sum(jax.lax.scan(
      lambda c, _: (_apply_vjp(f, c), None), x, None, length=2)[0]))(ones)]
  out.append(jax.jvp(lambda x: jax.lax.cond(
      True, lambda c: _apply_jvp(f, c), lambda c: c, x), (ones,), (ones,))[1])

  @jax.custom_batching.custom_vmap
  def cf(x):
    return x * w

  @cf.def_vmap
  def rule(axis_size, in_batched, xs):
    return xs * w + 100.0, in_batched[0]
  out.append(jax.vmap(lambda x: jax.lax.cond(True, cf, lambda c: c, x))(
      jnp.ones((2, 3))))
  return out


@pytest.mark.parametrize("verify", [False, True])
def test_a_lifted_array_in_a_bound_jaxprs_constants_is_never_shared(verify):
  """A trace lifting an array that becomes a closed jaxpr's constant in an
  equation's parameter (``apply_primitive`` binding a transformed ``scan``
  or ``cond``) holds a tracer of the lifted trace, dead once it ends: such
  a trace is never stored, so every step gives stock's values (a stored
  one raised "No constant handler" from the second step on)."""
  want = stock_off(lambda: [_transformed_bodies(i % 3) for i in range(6)])
  jcc.enable(verify=verify)
  got = [_transformed_bodies(i % 3) for i in range(6)]
  for g, w in zip(got, want):
    for a, b in zip(g, w):
      same_as_stock(a, b)
  assert jcc.stats()["verify_mismatches"] == 0


# One mode's run (``sys.argv[1]``: stock, on or verify) of fresh outer
# jitted functions whose bodies call fresh inner jitted closures over a jax
# array and a NumPy array, under a captured-constants threshold below what
# each inner function closes over: prints each call's warnings and result.
_NESTED_CONSTANTS = r"""
import sys, warnings
import numpy as np, jax, jax.numpy as jnp
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
jax.config.update("jax_captured_constants_warn_bytes", 16)
b = np.linspace(-1, 1, 4).astype(np.float32)
out = []
for i in range(4):
  W = jnp.asarray(np.random.RandomState(i).randn(4, 4).astype(np.float32))
  x = jnp.ones((2, 4))

  def outer(x):
    y = jax.jit(lambda x: jnp.tanh(x @ W + b))(x)
    return y + jax.jit(lambda x: jnp.tanh(x @ W - b))(x)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    r = np.asarray(jax.jit(outer)(x))
  out.append(([str(w.message)[:70] for w in caught], r.tobytes().hex()))
print(repr(out))
"""


def test_nested_jits_warned_of_their_constants_warn_as_stocks():
  """Stock's lowering warns of captured constants once for each function
  whose own constants reach ``jax_captured_constants_warn_bytes``: a fresh
  outer jit calling two fresh inner jitted closures warns twice per call.
  The lookup never lifts arrays that warn on their own (lifted, they would
  be the outer trace's constants, warned of once); each mode in a process
  of its own."""
  import ast

  def mode(name):
    return ast.literal_eval(script_lines(_NESTED_CONSTANTS, name)[-1])

  want = mode("stock")
  assert all(len(warned) == 2 for warned, _ in want)
  for name in ("on", "verify"):
    assert mode(name) == want, name


class _Meta:   # hashable by identity, walked by its state
  def __init__(self, act):
    self.act = act


class _Tagged:
  def __init__(self, w, meta):
    self.w, self.meta = w, meta


jax.tree_util.register_pytree_node(
    _Tagged, lambda t: ((t.w,), t.meta), lambda meta, ch: _Tagged(ch[0], meta))


def test_an_output_node_holding_the_traces_own_object_is_never_shared():
  """An output whose pytree node holds the function's own object (``out.meta
  is meta``) is stock's for each object in ``eval_shape``, ``.trace`` and
  calls alike: the trace lookup stores no trace whose outputs' nodes hold
  a trace's own object (a later closure's answer would hold the first
  one's)."""
  def run():
    got = []
    for i in range(5):
      meta = _Meta("sin")
      m = _Tagged(jnp.full(2, i + 2.0), meta)
      f = jax.jit(lambda x: _Tagged(jnp.sin(x) + m.w, m.meta))
      x = jnp.ones(2)
      outs = (f(x), jax.eval_shape(f, x),
              jax.tree_util.tree_unflatten(f.trace(x).out_tree, [None]))
      got.append(tuple(o.meta is meta for o in outs))
    return got
  assert replay_in_both_modes(run, clear=True) == [(True,) * 3] * 5
