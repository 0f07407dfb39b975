"""What a treedef does not say about a pytree: the order and exact types of
each dict's keys, and state of a custom node outside its flatten.

A treedef compares dict keys with ``==`` (``1``, ``1.0`` and ``True`` are
one key) and holds them sorted, while a trace iterates a dict in insertion
order. :func:`layout` is the part of a closure key that says both; the walk
puts it in every ``TREE`` part, the matchers compare it, and
:func:`restore_order` gives a rebuilt tree the user's orders back.

Invariants: nothing here calls user code but a registered node's flatten
(which ``tree_flatten`` calls anyway); a dict whose order a rebuild could
not restore (one under a custom node, which the node's own unflatten
builds) is refused, never keyed as another order.
"""

from __future__ import annotations

import collections
import enum
import functools
import types
import weakref

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache._compat.lowering import module_holds
from jax_closure_cache.atoms import Inexact, exact_key, library_value_key
from jax_closure_cache.key.code_plan import library_class, stable_module
from jax_closure_cache.key.parts import Uncacheable
from jax_closure_cache.key.values import node_datas

_DICTS = (dict, collections.defaultdict)
_SEQUENCES = (list, tuple)


def key_atom(k):
  """A dict key or set element by exact type and value bits
  (``atoms.exact_key``: ``True``, ``1`` and ``1.0`` differ, as ``0.0`` and
  ``-0.0`` do), or a value of jax, numpy or the standard library (a device,
  a dtype) or an enum member (compared as jax, numpy, the standard library
  or ``enum`` compare them). Anything else is refused: a user class's
  ``==`` would decide."""
  try:
    return exact_key(k, _library_atom)
  except Inexact as e:
    raise Uncacheable("user_equality", str(e)) from None


#: What an Enum member's own ``__dict__`` holds for ``enum`` itself
_ENUM_OWN = frozenset({"_value_", "_name_", "__objclass__", "_sort_order_",
                       "__init__"})


def enum_member_has_state(v) -> bool:
  """Whether Enum member ``v`` holds attributes of its own (``Mode.A.scale
  = 5.0``, or set by its class's ``__init__``): state its ``==`` (identity)
  does not compare."""
  return not _ENUM_OWN.issuperset(getattr(v, "__dict__", ()))


def _library_atom(k):
  t = type(k)
  if library_class(t) or (
      isinstance(k, enum.Enum) and t.__eq__ is enum.Enum.__eq__
      and t.__hash__ is enum.Enum.__hash__
      and not enum_member_has_state(k)):
    # jax's, numpy's, the standard library's ==, or their exact fields
    return library_value_key(k, t)
  raise Uncacheable("user_equality", f"a {t.__name__} as a dict key or set "
                    "element: only atoms are keyed there (by exact type and "
                    "bits), never by a class's own ==")


def layout(v, treedef) -> tuple:
  """The keys of each dict of ``v`` (whose structure is ``treedef``) in
  insertion order, as :func:`key_atom` parts, in the treedef's pre-order.

  Raises:
    Uncacheable: a key that is not an atom, a dict under a custom node
      whose insertion order is not the sorted one its unflatten would get,
      or a custom node with state outside its flatten (:func:`covers_state`).
  """
  out: list = []
  _layout(v, treedef, False, out)
  return tuple(out)


def layout_or_none(v, treedef):
  """:func:`layout`, or None where it refuses (a matcher's miss)."""
  try:
    return layout(v, treedef)
  except Uncacheable:
    return None


def _layout(v, treedef, under_custom: bool, out: list) -> None:
  data = treedef.node_data()
  if data is None:
    return   # a leaf
  t, aux = data
  children = treedef.children()
  if t in _DICTS or t is collections.OrderedDict:
    keys = tuple(v)
    out.append(tuple([key_atom(k) for k in keys]))
    flattened = aux[1] if t is collections.defaultdict else aux
    if under_custom and t is not collections.OrderedDict and (
        list(keys) != list(flattened)):
      raise Uncacheable("dict_order", "a dict under a custom pytree node is "
                        "not in sorted key order, which the node's unflatten "
                        "would not keep")
    values = [v[k] for k in flattened]
  elif t in _SEQUENCES or (isinstance(v, tuple) and hasattr(t, "_fields")):
    values = list(v)
  elif t is type(None):
    return
  else:
    # (a node that is its own node data, ``register_static``, is walked
    # whole as node data)
    if aux is not v and not covers_state(v):
      raise Uncacheable("pytree_state", f"a {t.__name__} in a pytree keeps "
                        "state outside its tree_flatten, which a rebuild "
                        "through its unflatten would lose")
    values = list(_compat.flatten_one_level(v)[0])
    under_custom = True
  for x, c in zip(values, children):
    _layout(x, c, under_custom, out)


def has_dict(treedef) -> bool:
  """Whether ``treedef`` has a dict node (whose order a rebuild restores)."""
  return any(data[0] in _DICTS for data in node_datas(treedef))


def restore_order(v, rebuilt):
  """``rebuilt`` (``tree_unflatten`` of ``v``'s structure: dicts sorted)
  with each dict reached through dicts, lists and tuples in ``v``'s
  insertion order; ``layout`` refused the dicts it cannot reach."""
  t = type(v)
  if t is dict:
    return {k: restore_order(v[k], rebuilt[k]) for k in v}
  if t is collections.defaultdict:
    return collections.defaultdict(
        v.default_factory, {k: restore_order(v[k], rebuilt[k]) for k in v})
  if t is list:
    return [restore_order(x, y) for x, y in zip(v, rebuilt)]
  if t is tuple:
    return tuple([restore_order(x, y) for x, y in zip(v, rebuilt)])
  if isinstance(v, tuple) and hasattr(t, "_fields") and type(rebuilt) is t:
    return t(*[restore_order(x, y) for x, y in zip(v, rebuilt)])
  return rebuilt


def covers_state(v) -> bool:
  """Whether a custom node's flatten carries all of ``v``'s state as it
  is: each attribute (in ``__dict__`` or a slot), a partial's function,
  arguments and keywords, a tuple's items, is one of its children, its
  node data, or an item of a tuple or list node data (a rebuild through its
  unflatten then holds the same state). False for an object without a
  ``__dict__``, one of a dict, list or set subclass (its items are state
  of their own), or one with state kept outside its flatten
  (``self.scale`` set in ``__init__`` but not flattened). Node data is
  searched three tuples deep (a dataclass node keeps its static fields in
  a tuple)."""
  try:
    state = list(vars(v).values())
  except TypeError:
    return False
  if type(v) is _PARTIAL and not state:   # jax's: its flatten holds the rest
    return True
  if isinstance(v, _ITEMS_OF_THEIR_OWN):
    return False
  state += slot_values(v)
  if isinstance(v, functools.partial):
    state += (v.func, v.args, v.keywords)
  elif isinstance(v, tuple):
    state += v
  if not state:   # (nothing outside what the node's class itself is)
    return True
  children, aux = _compat.flatten_one_level(v)
  held = collections.Counter(map(id, children))
  pending, depth = [aux], 3   # node data, and what its tuples hold
  while pending and depth:
    items, pending, depth = pending, [], depth - 1
    for x in items:
      held[id(x)] += 1
      if type(x) in _SEQUENCES:
        pending.extend(x)
  for x in state:   # each piece of state takes a holder of its own
    if held[id(x)] <= 0:
      return False
    held[id(x)] -= 1
  return True


_PARTIAL = _compat.jax.tree_util.Partial
_ITEMS_OF_THEIR_OWN = (dict, list, set, frozenset, bytearray,
                       collections.deque)


def slot_values(v) -> list:
  """The values of ``v``'s slots that are set (``__slots__`` of its class
  and its bases, read through their own descriptors)."""
  slots = _SLOTS.get(type(v))
  if slots is None:
    slots = _SLOTS[type(v)] = _slot_descriptors(type(v))
  out = []
  for d in slots:
    try:
      out.append(d.__get__(v))
    except AttributeError:   # not set
      pass
  return out


def _slot_descriptors(t: type) -> tuple:
  found = []
  for c in t.__mro__:
    names = c.__dict__.get("__slots__", ())
    for name in (names,) if type(names) is str else names:
      if name in ("__dict__", "__weakref__"):
        continue
      if name.startswith("__") and not name.endswith("__"):
        name = f"_{c.__name__.lstrip('_')}{name}"   # a private name
      d = c.__dict__.get(name)
      if type(d) is _MemberDescriptor:
        found.append(d)
  return tuple(found)


_MemberDescriptor = types.MemberDescriptorType   # a slot's
#: class -> its slots' descriptors (:func:`slot_values`)
_SLOTS = cache.STORE.table("trees.slots", cache.Store.FACTS,
                           weakref.WeakKeyDictionary)


def rebuilt_as_given(original, out, leaves: list, given: list) -> bool:
  """Whether ``out``, an unflatten of ``original``'s structure with its
  ``leaves`` replaced by ``given``, is ``original`` again with only those
  replaced: each node of the same class, its attributes (and slots) of the
  same names in the same order, each the given leaf, a node rebuilt as
  the original's, or the very object the original holds; an object the
  original reaches twice, one object in ``out`` too. An unflatten that
  converts or computes (``jnp.asarray(w, jnp.float32)`` in ``__init__``,
  a dataclass's ``__post_init__``), drops node data, or sets attributes in
  another order gives something else, where stock's trace reads the
  user's object as it is."""
  replaced = {id(a): b for a, b in zip(leaves, given) if a is not b}
  return _same_state(original, out, replaced, {}, 0)


def _same_state(a, b, replaced: dict, seen: dict, depth: int) -> bool:
  r = replaced.get(id(a), _ABSENT)
  if r is not _ABSENT:
    return b is r
  if a is b:
    return True
  if depth > _STATE_DEPTH or type(a) is not type(b):
    return False
  if type(a) in _ATOMIC:   # (a rebuild may pass an equal new one along)
    return exact_key(a, _never) == exact_key(b, _never)
  known = seen.get(id(a))
  if known is not None:   # reached before: the same rebuilt object again
    return known[1] is b
  seen[id(a)] = (a, b)   # (a kept alive: its id is not reused meanwhile)
  depth += 1
  if isinstance(a, (list, tuple)):
    return (len(a) == len(b) and _same_attributes(a, b)
            and all(_same_state(x, y, replaced, seen, depth)
                    for x, y in zip(a, b)))
  if isinstance(a, dict):
    return (list(map(id, a)) == list(map(id, b)) and _same_attributes(a, b)
            and all(_same_state(a[k], b[k], replaced, seen, depth)
                    for k in a))
  if isinstance(a, functools.partial):
    if not (_same_state(a.func, b.func, replaced, seen, depth)
            and _same_state(a.args, b.args, replaced, seen, depth)
            and _same_state(a.keywords, b.keywords, replaced, seen, depth)):
      return False
  elif not type(a).__dictoffset__ and not slot_values(a):
    return False   # a state of its own no attribute shows: itself only
  return _same_attributes(a, b, replaced, seen, depth)


def _same_attributes(a, b, replaced=None, seen=None, depth=0) -> bool:
  """``a``'s and ``b``'s ``__dict__`` and slots: the same names in the same
  order, each value the same state (with no ``replaced``: both empty)."""
  da, db = (vars(a), vars(b)) if type(a).__dictoffset__ else ({}, {})
  if list(da) != list(db):
    return False
  sa, sb = slot_values(a), slot_values(b)
  if len(sa) != len(sb):
    return False
  if replaced is None:
    return not da and not sa
  return all(_same_state(x, y, replaced, seen, depth)
             for x, y in zip((*da.values(), *sa), (*db.values(), *sb)))


def _never(v):   # (exact_key's fallback, unreached for _ATOMIC's types)
  raise TypeError(type(v).__name__)


_ATOMIC = frozenset({int, float, complex, bool, str, bytes, type(None)})
_STATE_DEPTH = 32
_ABSENT = object()


def conflated_node_data(treedef) -> str | None:
  """Why JAX's own ``==`` of ``treedef`` (a call's arguments', which a
  shared jitted function's cache compares) could take one call's pytree
  for another's that traces otherwise, or None. A node's data is compared
  by its ``==``: a custom node's auxiliary data (``1`` and ``1.0``, an
  object whose ``__eq__`` compares a name, one changed in place since) and
  a dict's keys may be equal and differ to the trace. Only data of strings
  alone (a dict's keys, field names) is exact."""
  todo = [treedef]
  while todo:
    node = todo.pop()
    data = node.node_data()
    if data is not None and not _exact_node_data(data[1]):
      return (f"an argument's {getattr(data[0], '__name__', 'pytree')} node "
              "holds data JAX's cache compares by ==")
    todo.extend(node.children())
  return None


def output_node_data(treedef, kept: frozenset | set) -> str | None:
  """Why a stored entry's outputs would differ from stock's in ``treedef``
  (a trace's outputs'), or None. A hit returns its outputs in the trace's
  own treedef, whose nodes' data are that trace's objects; stock's trace of
  each function object puts that object's own there (``out.meta is meta``).
  Only data the same for every hit may stay: atoms (exact under the key's
  rule), a dtype, an enum member of a library's enum, tuples of these
  (never a list: the caller may change it), and objects the key holds by
  identity (``kept``: their ids), which each hit's function holds too."""
  todo = [treedef]
  while todo:
    node = todo.pop()
    data = node.node_data()
    if data is not None and not _node_data_same(data, kept):
      return (f"an output's {getattr(data[0], '__name__', 'pytree')} node "
              f"holds a {type(data[1]).__name__} of the trace's own, where "
              "stock's trace of each object holds that object's")
    todo.extend(node.children())
  return None


_OUTPUT_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes})


def _node_data_same(data, kept) -> bool:
  """Whether a node's ``(type, data)`` is the same for every hit: a dict's
  keys (the list is JAX's own), a defaultdict's factory and keys, or any
  node's data by :func:`_same_for_every_hit`."""
  t, aux = data
  if (t is dict or t is collections.OrderedDict) and type(aux) is list:
    return all(_same_for_every_hit(k, kept) for k in aux)
  if t is collections.defaultdict and type(aux) is tuple and len(aux) == 2:
    factory, keys = aux
    return (_same_for_every_hit(factory, kept)
            and all(_same_for_every_hit(k, kept) for k in keys))
  return _same_for_every_hit(aux, kept)


def _same_for_every_hit(aux, kept) -> bool:
  t = type(aux)
  if t in _OUTPUT_ATOMS or id(aux) in kept or isinstance(aux, np.dtype):
    return True
  if isinstance(aux, enum.Enum):   # one object per member, the class's own
    return library_class(t) or id(t) in kept
  if _library_module_level(aux):   # ``jax.nn.relu``: one object per process
    return True
  if t is tuple:
    return all(_same_for_every_hit(x, kept) for x in aux)
  return False


def _library_module_level(obj) -> bool:
  """Whether ``obj`` is what a stable module holds under its name (a
  library's function, ``jax.nn.relu``)."""
  try:
    module = getattr(obj, "__module__", None)
    return (type(module) is str and stable_module(module)
            and module_holds(module, getattr(obj, "__name__", None), obj))
  except Exception:   # an attribute that raises when read
    return False


def _exact_node_data(aux) -> bool:
  if aux is None or type(aux) is str:
    return True
  if type(aux) is tuple or type(aux) is list:
    return all(map(_exact_node_data, aux))
  return False
