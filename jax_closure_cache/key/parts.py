"""The parts a closure key is made of: its markers and the atoms it keeps.

A key is a nested tuple; each compound part starts with one of these
markers (``FN``, ``TREE``, ``OBJ``, ...), whose comment gives the part's
layout. The walk (``closure``) builds them; ``rebuild``, ``matchers``,
``guards`` and ``diagnostics`` read them.

Invariants: markers compare by identity and are not picklable (a key never
leaves the process); ``ATOMS`` are the types keyed by value as they are.
"""

from __future__ import annotations

import types
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
ALIAS = _key.ALIAS         # (ALIAS, i): the array of leaf i met again
MISSING = _key.MISSING     # a global name that is not (yet) defined
EMPTY = _key.EMPTY         # a cell that is not yet filled
FN = _key.FN               # FnPart
TREE = _key.TREE           # TreePart (the package's walk adds the layout)
PARTIAL = _key.PARTIAL     # PartialPart
WEAKREF = _key.WEAKREF     # (WEAKREF, referent or None): read through it
CYCLE = _key.CYCLE         # (CYCLE, index of an enclosing function or object)
ID = _key.ID               # (ID, id(obj), label); obj is an anchor
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
LIBATTR = Tag("LIBATTR")   # (LIBATTR, obj): a library module's attribute, by identity


class FnPart(NamedTuple):
  """The fields of an ``FN`` part, a function walked by its code: read a
  part by name with ``FnPart._make(part)`` (keys keep the plain tuple, whose
  hash and equality are the same and cheaper to build)."""
  tag: Tag              # FN
  index: int            # the walk's ordinal of this function (CYCLE refers to it)
  code: types.CodeType
  globals_id: int       # id of its globals dict (an anchor of the entry)
  cells: tuple          # the parts of its closure cells, in co_freevars order
  defaults: tuple | None
  kwdefaults: tuple | None   # ((name, part), ...)
  globals: tuple        # the parts of the globals its code reads
  chains: tuple         # the parts of the attribute chains it reads


# The other compound parts, named alike: keys keep plain tuples, and the
# readers (rebuild, the explanations in ``names``, the matchers and their
# plans) read a part's fields through these views.

class TreePart(NamedTuple):
  """A ``TREE`` part: a pytree of builtin nodes walked through its flatten."""
  tag: Tag              # TREE
  treedef: Any
  leaves: tuple         # the parts of its leaves, in flatten order
  layout: Any           # each dict's keys in insertion order (key/trees.py)


def tree_part(part: tuple) -> TreePart:
  """The view of a ``TREE`` part: the package's walk adds the layout, the
  closure key module's own walk (its rules used alone) does not."""
  return TreePart._make(part if len(part) == 4 else (*part, None))


class TreeAuxPart(NamedTuple):
  """A ``TREEAUX`` part: a pytree whose custom nodes' data is walked."""
  tag: Tag              # TREEAUX
  nodes: Any            # ``Analysis.node_parts`` of its treedef
  leaves: tuple
  layout: Any


class TreeDefPart(NamedTuple):
  """A ``TREEDEF`` part: a treedef value whose node data holds functions."""
  tag: Tag              # TREEDEF
  nodes: Any


class PartialPart(NamedTuple):
  """A ``PARTIAL`` part: a ``functools.partial``."""
  tag: Tag              # PARTIAL
  func: Any             # the part of the function it wraps
  args: tuple           # the parts of its positional arguments
  keywords: tuple       # ((name, part), ...)


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
  type: type
  items: tuple          # ((attribute, part), ...) or the items' parts
  klass: Any            # the part of its class's namespace, or not a tuple


class ClassPart(NamedTuple):
  """A ``CLASS`` part: a user class keyed by its namespace."""
  tag: Tag              # CLASS
  index: int
  type: type
  items: tuple          # ((owner, name, part), ...)


class WrapperPart(NamedTuple):
  """A ``WRAPPER`` part: an instance of a registered wrapper class."""
  tag: Tag              # WRAPPER
  type: type
  static: Any           # its static part, keyed by value
  inner: Any            # the part of what it wraps


class NumpyPart(NamedTuple):
  """A ``NUMPY`` part: a NumPy array baked by its bytes."""
  tag: Tag              # NUMPY
  dtype: Any
  shape: tuple
  digest: bytes


def fn_part(index, code, globals_id, cells, defaults, kwdefaults, globs,
            chains) -> tuple:
  """An ``FN`` part, as the plain tuple ``FnPart`` names the fields of."""
  return (FN, index, code, globals_id, cells, defaults, kwdefaults, globs,
          chains)


#: Types keyed by their value as they are (floats go through ``float_key``).
ATOMS = _key.ATOMS
#: Pytree node types whose node data holds no user function.
BUILTIN_NODES = frozenset({dict, list, tuple, type(None)})
float_key = _key.float_key
#: A NumPy array's key: dtype, shape and a digest of its bytes.
numpy_key = _key.Walk.numpy
