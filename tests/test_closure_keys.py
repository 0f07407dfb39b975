"""Closure analysis at the key level: what keys equal, what keys differ, and
that the hot path's generated matcher agrees with the full key exactly."""

import collections
import decimal
import functools
import itertools
import operator
import random
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_closure_cache.key import closure
from jax_closure_cache.key import code_plan
from jax_closure_cache.key import matchers
from jax_closure_cache.key import rebuild

TRICKY = [0, 1, -1, True, False, 0.0, -0.0, 1.0, float("nan"), float("inf"),
          "a", b"a", None, np.float32(1), np.float32(-0.0), np.int32(1),
          jnp.ones(2), jnp.ones(3, jnp.int32), jax.device_put(jnp.ones(2), jax.devices()[0]),
          np, jnp.sum, int, (1, 2.0), {"a": 1}]


def make(c):
  return lambda x: (x, c)


def key(v):
  return closure.analyse(make(v)).key


@pytest.mark.parametrize("i", range(len(TRICKY)))
def test_tricky_values_key_only_to_themselves(i):
  for j, other in enumerate(TRICKY):
    same = key(TRICKY[i]) == key(other)
    if i == j:
      assert same, TRICKY[i]
    elif type(TRICKY[i]) in (float, int, bool, np.float32, np.int32):
      assert not same, (TRICKY[i], other)


def test_arrays_key_by_position_not_value():
  a = closure.analyse(make(jnp.ones(2)))
  b = closure.analyse(make(jnp.zeros(5)))
  assert a.key == b.key and len(a.leaves) == 1


def test_committed_arrays_key_by_identity():
  dev = jax.devices()[0]
  x, y = jax.device_put(jnp.ones(2), dev), jax.device_put(jnp.ones(2), dev)
  assert key(x) != key(y) and key(x) == key(x)
  assert closure.analyse(make(x)).leaves == []


def test_numpy_keys_by_bytes_dtype_shape():
  a = np.arange(3.0)
  assert key(a) == key(a.copy())
  assert key(a) != key(a.astype(np.float32))
  assert key(a) != key(a.reshape(3, 1))
  b = a.copy()
  b[0] = -0.0
  assert key(a) != key(b)   # 0.0 and -0.0 differ in their bytes
  with pytest.raises(closure.Uncacheable):
    key(np.array([object()]))


def test_tracer_anywhere_is_uncacheable():
  def check(x):
    with pytest.raises(closure.Uncacheable) as e:
      closure.analyse(make({"deep": [x]}))
    assert e.value.reason == "tracer"
    return x
  jax.jit(check)(1.0)


def test_cycles_terminate_and_rebuild():
  def outer(w):
    def rec(n):
      return w if n == 0 else rec(n - 1)
    return rec
  a = closure.analyse(outer(jnp.ones(2)))
  assert len(a.leaves) == 1
  rebuilt = rebuild.rebuild(outer(jnp.ones(2)), a.key, [jnp.full(2, 5.0)])
  np.testing.assert_array_equal(rebuilt(3), jnp.full(2, 5.0))


class Opaque(bytearray):   # a C base: state the walk cannot read
  __slots__ = ("v",)

  def __init__(self, v):
    self.v = v

  __hash__ = object.__hash__


def test_objects_the_key_cannot_read_are_stocks():
  """A user object whose state the walk cannot read (a C base) could only
  be kept by identity, where an in-place change would go unseen."""
  with pytest.raises(closure.Uncacheable, match="opaque_object"):
    closure.analyse(make(Opaque(1)))


class Slotted:
  __slots__ = ("v",)

  def __init__(self, v):
    self.v = v


def test_library_objects_kept_by_identity_are_roots():
  o = jax.devices()[0]   # jax's object: by identity, guarded
  a = closure.analyse(make(o))
  assert o in a.roots and o in a.anchors


@pytest.mark.parametrize("state", [
    np.random.default_rng(0), np.random.RandomState(0), random.Random(0),
    itertools.count(), iter([1, 2])], ids=type)
def test_library_state_a_trace_draws_from_has_no_key(state):
  # kept by identity, a later closure would get the first trace's draw
  with pytest.raises(closure.Uncacheable, match="drawn_state"):
    closure.analyse(make(state))


def test_slotted_objects_are_keyed_by_their_slots():
  assert closure.analyse(make(Slotted(1))).key == \
      closure.analyse(make(Slotted(1))).key != \
      closure.analyse(make(Slotted(2))).key
  assert closure.analyse(make(Slotted(1))).roots == []   # nothing opaque


class Cfg:
  def __init__(self, **kw):
    self.__dict__.update(kw)

  def __eq__(self, other):
    return vars(self) == vars(other)


def test_plain_object_budget_then_identity_or_unhashable():
  assert key(Cfg(a=1)) == key(Cfg(a=1)) != key(Cfg(a=2))
  big = Cfg(**{f"a{i}": i for i in range(closure.OBJECT_VALUES_BUDGET + 1)})
  with pytest.raises(closure.Uncacheable):   # __eq__ alone: unhashable
    key(big)


def test_function_attributes_are_ignored():
  def deco(f):
    @functools.wraps(f)
    def wrapper(x):
      return f(x)
    return wrapper
  f1, f2 = deco(make(1)), deco(make(1))
  assert closure.analyse(f1).key == closure.analyse(f2).key


def matcher_for(value):
  fun = make(value)
  return matchers.quick_matcher(fun, closure.analyse(fun).key)


@pytest.mark.parametrize("i", range(len(TRICKY)))
def test_quick_matcher_agrees_with_the_key(i):
  match = matcher_for(TRICKY[i])
  simple = not isinstance(TRICKY[i], np.generic) and not (
      isinstance(TRICKY[i], jax.Array) and TRICKY[i].committed)
  assert (match is not None) == simple
  if match is None:
    return
  for other in TRICKY:
    f = make(other)
    a = closure.analyse(f)
    got = match(f)
    want_equal = a.key == closure.analyse(make(TRICKY[i])).key
    assert (got is not None) == want_equal, (TRICKY[i], other)
    if got is not None:
      assert len(got) == len(a.leaves) and all(
          g is l for g, l in zip(got, a.leaves))


def test_quick_matcher_checks_globals_and_defaults():
  ns = {}
  exec("def make(w, n=2):\n  def f(x, k=n):\n    return x * w + K + k\n"
       "  return f\n", ns)
  ns["K"] = 1.0
  f = ns["make"](jnp.ones(2))
  match = matchers.quick_matcher(f, closure.analyse(f).key)
  assert match is not None and len(match(f)) == 1
  assert match(ns["make"](jnp.zeros(2))) is not None
  assert match(ns["make"](jnp.zeros(2), n=3)) is None   # default differs
  ns["K"] = 2.0
  assert match(f) is None   # a read global differs
  del ns["K"]
  assert match(f) is None
  assert match(types.FunctionType(f.__code__, {}, "f", f.__defaults__,
                                  f.__closure__)) is None


def test_a_chain_from_a_functions_own_local_cell_costs_the_matcher_nothing():
  """A code reading an attribute of its own local cell (a variable an inner
  function closes over: ``jax.vmap``'s wrapper reads ``mesh.shape`` so)
  never reads that chain from a closure (the code, fixed by identity,
  fixes its free variables): the matcher has no check for it, where it
  called ``chain_read`` per hit, raising and catching twice. A chain from
  a cell it does close over is still checked and still misses."""
  ns = {}
  exec("def make(w, t):\n"
       "  def f(x):\n"
       "    m = x\n"
       "    inner = lambda: m\n"
       "    return m.shape, inner(), x * w * t.scale\n"
       "  return f\n", ns)
  t = types.ModuleType("settings_of_a_test")
  t.scale = 2.0
  f = ns["make"](jnp.ones(2), t)
  assert ("cell", "m", ("shape",)) in code_plan.code_plan(f.__code__).chains
  key = closure.analyse(f).key
  src = matchers.match_source(f, key)
  chains = [src.env[n] for n in src.env if type(src.env[n]) is tuple
            and len(src.env[n]) == 3 and src.env[n][0] == "cell"]
  assert chains == [("cell", "t", ("scale",))]
  match = matchers.compile_matcher(src)
  assert match(ns["make"](jnp.zeros(2), t)) is not None
  t.scale = 3.0   # the closed-over chain's value moved: no match
  assert match(ns["make"](jnp.zeros(2), t)) is None


def test_a_global_two_functions_of_one_module_read_is_checked_once():
  """Two functions of one module reading the same global: the matcher
  reads it once (the second function's globals dict is the same object),
  and still misses when it changes or goes."""
  ns = {}
  exec("def make(w):\n  def inner(x):\n    return x * w + K\n"
       "  def outer(x):\n    return inner(x) * K\n  return outer\n", ns)
  ns["K"] = 1.0
  f = ns["make"](jnp.ones(2))
  key = closure.analyse(f).key
  src = matchers.match_source(f, key)
  assert "\n".join(src.lines).count("('K', MISSING)") == 1
  match = matchers.compile_matcher(src)
  assert len(match(ns["make"](jnp.zeros(2)))) == 1
  ns["K"] = 2.0
  assert match(f) is None and closure.analyse(f).key != key
  del ns["K"]
  assert match(f) is None


TREES = [{"w": jnp.ones(2), "b": jnp.zeros(2)}, {"w": jnp.ones(3), "b": jnp.ones(1)},
         {"w": jnp.ones(2), "c": jnp.zeros(2)}, [jnp.ones(2), 1.0], [jnp.ones(2), 2.0],
         [jnp.ones(2), -0.0], (jnp.ones(2),), [jnp.ones(2)], {"w": np.ones(2)},
         # straight-line dict reads: int keys, tuple keys (bound by name), a
         # committed array, and a big node (the gather-and-loop form)
         {1: jnp.ones(2), 2: jnp.ones(2)}, {(1,): jnp.ones(2), (2,): jnp.ones(2)},
         {"w": jax.device_put(jnp.ones(2), jax.devices()[0]), "b": jnp.zeros(2)},
         {f"k{i}": jnp.ones(2) for i in range(12)},
         {f"k{i}": jnp.ones(2) for i in range(11)} | {"z": jnp.ones(2)},
         {f"k{i}": jnp.ones(2) for i in range(11)} | {"k0": 1.0}]


@pytest.mark.parametrize("i", range(len(TREES)))
def test_quick_matcher_agrees_on_pytrees(i):
  base = make(TREES[i])
  match = matchers.quick_matcher(base, closure.analyse(base).key)
  has_numpy = isinstance(TREES[i], dict) and isinstance(TREES[i].get("w"), np.ndarray)
  committed = any(getattr(x, "committed", False)
                  for x in jax.tree_util.tree_leaves(TREES[i]))
  # numpy parts and committed arrays (kept by identity) are not simple
  assert (match is None) == (has_numpy or committed)
  if match is None:
    return
  for other in TREES:
    f = make(other)
    a = closure.analyse(f)
    got = match(f)
    assert (got is not None) == (a.key == closure.analyse(base).key)
    if got is not None:
      assert all(g is l for g, l in zip(got, a.leaves)) and len(got) == len(a.leaves)


def _scaled(w):
  return lambda v: v * w


def _partial_with_attribute():
  p = jax.tree_util.Partial(jax.nn.softmax)
  p.note = 1.0   # state outside its flatten: keyed otherwise
  return p


class _Node:
  def __init__(self, x):
    self.x = x


jax.tree_util.register_pytree_node(_Node, lambda n: ((n.x,), None),
                                   lambda _, c: _Node(*c))

# pytrees whose node data the key walks (``TREEAUX``): jax's Partial with a
# library function, a user's closure (its arrays lifted before the leaves)
# or atoms in its node data and leaves; Partials inside dicts (insertion
# order) and an OrderedDict. The last three have no matcher: a Partial with
# state outside its flatten (keyed as an object), a user's registered class
# (its class walked) and a jitted function in node data (kept by identity)
AUX_TREES = [
    lambda: jax.tree_util.Partial(jax.nn.softmax),
    lambda: jax.tree_util.Partial(operator.neg),
    lambda: jax.tree_util.Partial(jax.nn.softmax, jnp.ones(2)),
    lambda: jax.tree_util.Partial(jax.nn.softmax, jnp.ones(3)),
    lambda: jax.tree_util.Partial(jax.nn.softmax, 1.0),
    lambda: jax.tree_util.Partial(jax.nn.softmax, 1),
    lambda: jax.tree_util.Partial(jax.nn.softmax, True),
    lambda: jax.tree_util.Partial(jax.nn.softmax, -0.0),
    lambda: jax.tree_util.Partial(jax.nn.softmax, x=jnp.ones(2)),
    lambda: jax.tree_util.Partial(_scaled(jnp.ones(2)), jnp.zeros(2)),
    lambda: jax.tree_util.Partial(_scaled(2.0), jnp.zeros(2)),
    lambda: {"m": jax.tree_util.Partial(jax.nn.softmax), "w": jnp.ones(2)},
    lambda: {"w": jnp.ones(2), "m": jax.tree_util.Partial(jax.nn.softmax)},
    lambda: [jax.tree_util.Partial(jax.nn.softmax), None, jnp.ones(2)],
    lambda: collections.OrderedDict(b=jax.tree_util.Partial(jax.nn.softmax),
                                    a=jnp.ones(2)),
    lambda: collections.OrderedDict(a=jnp.ones(2),
                                    b=jax.tree_util.Partial(jax.nn.softmax)),
    _partial_with_attribute,
    lambda: jax.tree_util.Partial(jax.nn.softmax, _Node(jnp.ones(2))),
    lambda: jax.tree_util.Partial(jnp.tanh),
]


def _analysed(f):
  try:
    return closure.analyse(f)
  except closure.Uncacheable:
    return None


@pytest.mark.parametrize("i", range(len(AUX_TREES)))
def test_quick_matcher_agrees_on_pytrees_whose_node_data_is_walked(i):
  """A matcher for a ``TREEAUX`` key answers a fresh value exactly when the
  full walk keys it alike, with the walk's lifted leaves in its order."""
  base = make(AUX_TREES[i]())
  base_key = closure.analyse(base).key
  match = matchers.quick_matcher(base, base_key)
  assert (match is None) == (i >= len(AUX_TREES) - 3)
  if match is None:
    return
  assert match(make(AUX_TREES[i]())) is not None   # a fresh equal value
  for build in AUX_TREES:
    f = make(build())
    a = _analysed(f)
    got = match(f)
    assert (got is not None) == (a is not None and a.key == base_key), i
    if got is not None:
      assert len(got) == len(a.leaves) and all(
          g is l for g, l in zip(got, a.leaves))


def nested(w, scale, share=False, w2=None):
  w2 = w if w2 is None else w2   # one array at two places, or two arrays
  def inner(x):
    return x * w
  other = inner if share else (lambda x: x * w2)
  def outer(x):
    return inner(x) + other(x) * scale
  return outer


NESTED = [nested(jnp.ones(2), 1.0), nested(jnp.zeros(3), 1.0),
          nested(jnp.ones(2), 2.0), nested(jnp.ones(2), 1.0, share=True),
          nested(jnp.ones(2), 1.0, w2=jnp.ones(2)),
          nested(jax.device_put(jnp.ones(2), jax.devices()[0]), 1.0)]


@pytest.mark.parametrize("i", range(len(NESTED)))
def test_quick_matcher_agrees_on_nested_functions(i):
  base = NESTED[i]
  base_key = closure.analyse(base).key
  match = matchers.quick_matcher(base, base_key)
  # a shared function is a back-reference the matcher checks by identity, and
  # so is one array at two places; a committed array is kept by identity,
  # which it does not check
  assert (match is None) == (i >= 5)
  if match is None:
    return
  for f in NESTED:
    a = closure.analyse(f)
    got = match(f)
    assert (got is not None) == (a.key == base_key), closure.analyse(f).key
    if got is not None:
      assert len(got) == len(a.leaves) and all(g is l for g, l in zip(got, a.leaves))


def test_quick_matcher_on_regrad_wrappers():
  def loss(w, x):
    return jnp.sum((x @ w) ** 2)
  g1, g2 = jax.grad(loss), jax.grad(loss, argnums=1)
  k1 = closure.analyse(g1).key
  match = matchers.quick_matcher(g1, k1)
  assert match is not None
  assert match(jax.grad(loss)) == []
  assert match(g2) is None and closure.analyse(g2).key != k1


def test_stdlib_objects_keyed_by_their_wrapped_function_or_identity():
  # an lru_cache wrapper by its __dict__ (the wrapped function's code and
  # what it reads); operator's getters by identity (they never change)
  def wrapped(version):
    @functools.lru_cache
    def helper(k):
      return k * version
    return helper
  assert key(wrapped(1)) == key(wrapped(1)) != key(wrapped(2))
  getter = operator.itemgetter(0)
  assert getter in closure.analyse(make(getter)).anchors


@pytest.mark.parametrize("state", [threading.local(), decimal.Context()],
                         ids=type)
def test_library_objects_not_known_to_be_read_only_have_no_key(state):
  # kept by identity, a change to their attributes would go unseen
  with pytest.raises(closure.Uncacheable, match="opaque_object"):
    closure.analyse(make(state))


def test_parts_of_the_closure_key_modules_own_walk_are_named():
  # The closure key module's walk, its rules used alone, builds a TREE part
  # without the layout the package's walk adds; explanations name both.
  from jax_closure_cache.key import closure_key, names
  d = {"w": jnp.ones(2)}

  def f(x):
    return x * d["w"]
  base = closure_key.Walk().function(f)
  assert [n for n, _ in names.named_parts(f, base)] == ["cell 'd'[0]"]
  package = closure.analyse(f).key
  assert [n for n, _ in names.named_parts(f, package)] == ["cell 'd'[0]"]


def _helper_scale(w, x):
  return x * w


class _Scaler:
  def __init__(self, w):
    self.w = w

  def apply(self, x):
    return x * self.w


def test_explanations_name_partials_methods_and_library_attributes():
  """A partial's and a bound method's parts are named under their carrier
  (not run together with it), and a partial and a method render as
  themselves, not as a raw tuple."""
  from jax_closure_cache.key import names, parts as key_parts
  part = functools.partial(_helper_scale, 2.0)
  apply = _Scaler(3.0).apply

  def f(x):
    return part(x) + apply(x) + jnp.tanh(x)
  key = closure.analyse(f).key
  named = [n for n, _ in names.named_parts(f, key)]
  assert "cell 'apply' -> self" in named, named
  assert "cell 'part' -> partial arg 0" in named, named
  assert not [n for n in named if "'part'partial" in n or "'apply'method" in n]
  cells = dict(zip(f.__code__.co_freevars, key_parts.FnPart._make(key).cells))
  assert names.render(cells["part"]) == ("partial(_helper_scale)", "partial")
  assert names.render(cells["apply"]) == ("method _Scaler.apply",
                                          "bound method")


# The view of each marker's compound part (``key/parts.py``); bare markers
# stand alone in a key, never at a tuple's head.
_VIEWS = {"ALIAS": "AliasPart", "CYCLE": "CyclePart", "WEAKREF": "WeakrefPart",
          "ID": "IdPart", "FN": "FnPart", "TREE": "TreePart",
          "PARTIAL": "PartialPart", "NUMPY": "NumpyPart",
          "WRAPPER": "WrapperPart", "TREEAUX": "TreeAuxPart",
          "TREEDEF": "TreeDefPart", "METHOD": "MethodPart", "OBJ": "ObjPart",
          "COPY": "ObjPart", "CLASS": "ClassPart", "LIBATTR": "LibAttrPart"}
_BARE = {"LIFTED", "MISSING", "EMPTY", "NOCHAIN"}


def test_every_marker_has_a_view_of_its_layout():
  from jax_closure_cache.key import closure_key, parts
  markers = {n for n, v in vars(parts).items() if type(v) is parts.Tag}
  assert markers == set(_VIEWS) | _BARE
  for marker, view_name in _VIEWS.items():
    view = getattr(parts, view_name)
    assert view._fields[0] == "tag" and marker in view.__doc__, view_name
  # the closure key module's own parts' views live there, re-exported
  for marker in ("ALIAS", "CYCLE", "WEAKREF", "ID", "FN", "TREE", "PARTIAL",
                 "NUMPY", "WRAPPER"):
    assert getattr(parts, _VIEWS[marker]) is getattr(closure_key,
                                                     _VIEWS[marker])
  assert parts.tree_part is closure_key.tree_part
  assert parts.Atom._fields == ("type", "value")


def _tagged_parts(k, found):
  from jax_closure_cache.key import parts
  if type(k) is tuple:
    if k and type(k[0]) is parts.Tag:
      found.setdefault(k[0], []).append(k)
    for x in k:
      _tagged_parts(x, found)
  return found


def test_views_read_the_parts_the_walk_builds():
  """Keys hold plain tuples; each view reads a walked part by name, the
  fields what the walk put there."""
  import weakref
  from jax_closure_cache.key import parts
  w = jnp.ones(2)
  w_again = w   # an ALIAS
  pinned = jax.device_put(jnp.ones(3), jax.devices()[0])   # by identity
  baked = np.arange(6.0).reshape(2, 3)

  class Box:
    def get(self):
      return self.v
  box = Box()
  box.v = 3
  getter = box.get   # a METHOD, its instance an object by its state

  def helper(x):
    return helper if x is None else jnp.tanh(x)   # a CYCLE, a LIBATTR
  ref = weakref.ref(helper)
  part = functools.partial(operator.mul, 2)

  def f(x):
    return (x * w + w_again, pinned, baked, helper(x), ref, part, getter, 7,
            1.5)

  a = closure.analyse(f)
  found = _tagged_parts(a.key, {})
  for tag in (parts.ALIAS, parts.CYCLE, parts.WEAKREF, parts.ID, parts.FN,
              parts.PARTIAL, parts.NUMPY, parts.METHOD, parts.LIBATTR):
    assert tag in found, tag
  for tag, ks in found.items():
    view = getattr(parts, _VIEWS[tag.name])
    for k in ks:
      assert type(k) is tuple   # keys stay plain tuples
      v = parts.tree_part(k) if tag is parts.TREE else view._make(k)
      assert v.tag is tag and v == k[:len(v)]
  alias, = found[parts.ALIAS]
  assert a.leaves[parts.AliasPart._make(alias).index] is w
  fns = {parts.FnPart._make(k).index: k for k in found[parts.FN]}

  def function(k):   # a walked function, or one reached again
    if k[0] is parts.CYCLE:
      k = fns[parts.CyclePart._make(k).index]
    return parts.FnPart._make(k)
  assert helper.__code__ in {function(k).code for k in found[parts.CYCLE]}
  ids = {parts.IdPart._make(k).id for k in found[parts.ID]}
  assert id(pinned) in ids and all(
      any(id(x) == i for x in a.anchors) for i in ids)
  assert parts.LibAttrPart._make(found[parts.LIBATTR][0]).obj is jnp.tanh
  n = parts.NumpyPart._make(found[parts.NUMPY][0])
  assert (n.dtype, n.shape) == (baked.dtype, baked.shape)
  referent = parts.WeakrefPart._make(found[parts.WEAKREF][0]).referent
  assert function(referent).code is helper.__code__
  p = parts.PartialPart._make(found[parts.PARTIAL][0])
  assert parts.Atom._make(p.func).value is operator.mul   # by value
  assert p.args == ((int, 2),)
  assert parts.Atom._make(p.args[0]) == (int, 2)
  m = parts.MethodPart._make(found[parts.METHOD][0])
  o = parts.ObjPart._make(m.instance)
  assert parts.IdPart._make(o.type).id == id(Box)
  assert ("v", (int, 3)) in o.items
  assert Box in a.anchors   # (held by the store weakly: dies with its class)
  top = parts.FnPart._make(a.key)
  assert top.code is f.__code__ and top.index == 0


def test_the_closure_key_modules_difference_names_cells_and_globals():
  # its explanation reads FN parts, atoms and ALIAS parts through the views
  from jax_closure_cache.key import closure_key

  def make_f(c, v, w):
    def f(x):
      return x * c + v + w + jnp.pi
    return f
  arr = jnp.ones(2)
  walk = closure_key.Walk
  a = walk().function(make_f(0.0, jnp.ones(2), jnp.ones(2)))
  assert walk.difference(a, walk().function(make_f(-0.0, arr, arr))) == (
      "cell 'c': float 0.0 -> float -0.0")
  assert walk.difference(a, walk().function(make_f(0.0, arr, arr))) == (
      "cell 'w': an array -> the array of lifted place 0 again")
  assert walk.difference((int, 1), (int, 2)) == "the function: int 1 -> int 2"


class _UserJitted:
  """A user's wrapper class whose name ends in ``Jitted``."""

  def __init__(self, fun):
    self.fun = fun


def test_explanations_name_a_wrapper_by_its_registered_label():
  """A registered wrapper's static part is named by the label it was
  registered with (the package's jit wrapper: ``jitted``), else by its
  class's name, never by a guess from that name."""
  import jax_closure_cache as jcc
  from jax_closure_cache.key import names, parts as key_parts, values
  w = jnp.ones(3)
  inner = jcc.jit(lambda v: v * w)
  values.register_wrapper(_UserJitted, lambda u: ((), u.fun),
                          lambda s, fun: _UserJitted(fun))
  try:
    user = _UserJitted(lambda v: v + w)

    def f(x):
      return inner(x) + user.fun(x)
    key = closure.analyse(f).key
    named = [n for n, _ in names.named_parts(f, key)]
    assert "cell 'inner' -> jitted" in named, named
    assert "cell 'user' -> _UserJitted" in named, named
    assert not [n for n in named if "'user' -> jitted" in n], named
    cells = dict(zip(f.__code__.co_freevars,
                     key_parts.FnPart._make(key).cells))
    assert names.render(cells["inner"])[0].startswith("jitted(")
    assert names.render(cells["user"])[0].startswith("_UserJitted(")
  finally:
    values.unregister_wrapper(_UserJitted)


def test_static_of_is_one_object_per_exact_value_and_keys_as_static():
  """``Static.of`` (a launcher's parameters) is one object per tuple of
  exact types and values of ints, bools and None, equal to a ``Static`` of
  the same values; ``1``, ``True`` and ``1.0`` are three keys."""
  from jax_closure_cache.key.values import Static
  assert Static.of(0, 16, None) is Static.of(0, 16, None)
  ones = [Static.of(1), Static.of(True), Static.of(1.0)]
  assert len({s.ident for s in ones}) == 3
  assert ones[0] is not ones[1]
  for value in ((1,), (True,), (1.0,), (0, 16, None), (np.int32(3), 2)):
    assert Static.of(*value) == Static(*value)
    assert Static.of(*value).ident == Static(*value).ident
  assert Static.of(np.int32(3)) is not Static.of(np.int32(3))   # not kept
