"""The parts a closure key is made of: its markers and the atoms it keeps.

A key is a nested tuple; each compound part starts with one of these
markers (``FN``, ``TREE``, ``OBJ``, ...), whose comment names the view of
the part's layout (``FnPart``, ``TreePart``, ``ObjPart``, ...), and an atom
with its type (``Atom``). The walk (``closure``) builds plain tuples;
``rebuild``, ``names``, ``matchers`` and ``match_plan`` read a part's fields
by name through its view (``FnPart._make(part).code``). The closure key
module defines the views of its own parts; this module re-exports them
beside the package's.

Invariants: markers compare by identity and are not picklable (a key never
leaves the process); ``ATOMS`` are the types keyed by value as they are.
"""

from __future__ import annotations

import math

from typing import Any, NamedTuple

from jax_closure_cache.key import closure_key

_key = closure_key

#: A callable the cache must leave to stock ``jax.jit``: the closure key's
#: ``Unkeyable``. ``reason`` is a short category (a key of
#: ``stats()['fallback_reasons']``); ``detail`` says which value and why.
Uncacheable = _key.Unkeyable
#: A marker in a key; compares by identity and reads well in a repr.
Tag = _key.Marker

# The closure key's own parts (``key/closure_key.py``), whose layouts
# its ``Walk`` builds:
LIFTED = _key.LIFTED       # an array passed to the shared executable
ALIAS = _key.ALIAS         # AliasPart: the array of leaf i met again
MISSING = _key.MISSING     # a global name that is not (yet) defined
EMPTY = _key.EMPTY         # a cell that is not yet filled
FN = _key.FN               # FnPart
TREE = _key.TREE           # TreePart (the package's walk adds the layout)
PARTIAL = _key.PARTIAL     # PartialPart
WEAKREF = _key.WEAKREF     # WeakrefPart: read through it
CYCLE = _key.CYCLE         # CyclePart: an enclosing function or object again
ID = _key.ID               # IdPart: an anchor, by identity
NUMPY = _key.NUMPY         # NumpyPart
WRAPPER = _key.WRAPPER     # WrapperPart
# ... and the package's (``closure.Analysis``):
TREEAUX = Tag("TREEAUX")   # TreeAuxPart: functions in node data
TREEDEF = Tag("TREEDEF")   # TreeDefPart: a treedef value holding functions
METHOD = Tag("METHOD")     # MethodPart
OBJ = Tag("OBJ")           # ObjPart; arrays by identity
COPY = Tag("COPY")         # ObjPart; arrays lifted
CLASS = Tag("CLASS")       # ClassPart
NOCHAIN = Tag("NOCHAIN")   # an attribute chain whose base is no module or class
LIBATTR = Tag("LIBATTR")   # LibAttrPart: a library module's attribute


# The views of the closure key module's own parts (see its comment there):
AliasPart = _key.AliasPart
CyclePart = _key.CyclePart
WeakrefPart = _key.WeakrefPart
IdPart = _key.IdPart
Atom = _key.Atom
FnPart = _key.FnPart
TreePart = _key.TreePart
tree_part = _key.tree_part
PartialPart = _key.PartialPart
NumpyPart = _key.NumpyPart
WrapperPart = _key.WrapperPart


# The package's compound parts, named alike.

class TreeAuxPart(NamedTuple):
  """A ``TREEAUX`` part: a pytree whose custom nodes' data is walked."""
  tag: Tag              # TREEAUX
  nodes: Any            # NodePart of its treedef's root
  leaves: tuple
  layout: Any


class TreeDefPart(NamedTuple):
  """A ``TREEDEF`` part: a treedef value whose node data holds functions."""
  tag: Tag              # TREEDEF
  nodes: Any            # NodePart of its root


class MethodPart(NamedTuple):
  """A ``METHOD`` part: a bound method."""
  tag: Tag              # METHOD
  func: Any             # the part of ``__func__``
  instance: Any         # the part of ``__self__``


class ObjPart(NamedTuple):
  """An ``OBJ`` part (arrays kept by identity) or a ``COPY`` part (arrays
  lifted through a shallow copy): a plain object keyed by its state."""
  tag: Tag              # OBJ or COPY
  index: int            # the walk's ordinal (CYCLE refers to it)
  type: tuple           # its class, by identity (an ``IdPart``: an anchor)
  items: tuple          # ((attribute, part), ...) or the items' parts
  klass: Any            # the part of its class's namespace, or not a tuple


class ClassPart(NamedTuple):
  """A ``CLASS`` part: a user class keyed by its namespace."""
  tag: Tag              # CLASS
  index: int
  type: tuple           # the class, by identity (an ``IdPart``: an anchor)
  items: tuple          # ((owner, name, part), ...)


class LibAttrPart(NamedTuple):
  """``(LIBATTR, obj)``: what an attribute chain reads from a library module
  (``jnp.tanh``), kept by identity (``closure.Analysis.chain``); also a bare
  ``object()`` sentinel (``closure.Analysis.state_object``)."""
  tag: Tag              # LIBATTR
  obj: Any              # the object itself (a matcher compares it with ``is``)


class ValuePart(NamedTuple):
  """``(type, value, klass)``: a hashable value of a user's class (an
  ``Enum`` member) keyed by value, with its class's namespace
  (``closure.Analysis.opaque``); a value of a stable module's class is an
  ``Atom``, ``(type, value)``."""
  type: type
  value: Any
  klass: Any            # the part of its class (``Analysis.klass``)


class NodePart(NamedTuple):
  """``(type, aux, children, klass)``: one node of a treedef whose node data
  is walked (``closure.Analysis.node_parts``; a leaf is None), the nodes of
  a ``TREEAUX`` or ``TREEDEF`` part."""
  type: type            # the node's class
  aux: Any              # its node data's part (a builtin node's, by value)
  children: tuple       # the children's NodeParts (None for a leaf)
  klass: Any            # the part of a custom node's class, or None


#: Types keyed by their value as they are (floats go through ``float_key``).
ATOMS = _key.ATOMS
#: Pytree node types whose node data holds no user function.
BUILTIN_NODES = frozenset({dict, list, tuple, type(None)})
float_key = _key.float_key
#: A NumPy array's key: dtype, shape and a digest of its bytes.
numpy_key = _key.Walk.numpy


def baked_numpy(key) -> list:
  """The NumPy arrays a key holds baked (``NUMPY`` parts, anywhere in it,
  as :class:`NumpyPart`): the constants a trace of what it covers
  captures."""
  found, todo = [], [key]
  while todo:
    k = todo.pop()
    if type(k) is tuple:
      if k and k[0] is NUMPY:
        found.append(NumpyPart._make(k))
      else:
        todo.extend(k)
    elif type(k) is frozenset:
      todo.extend(k)
  return found


def numpy_bytes(parts) -> int:
  """The bytes of the NumPy arrays ``parts`` describes (:func:`baked_numpy`'s
  answer)."""
  return sum(n.dtype.itemsize * math.prod(n.shape) for n in parts)
