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
from typing import NamedTuple


class Uncacheable(Exception):
  """A callable that the cache must leave to stock ``jax.jit``.

  ``reason`` is a short category (a key of ``stats()['fallback_reasons']``);
  ``detail`` says which value and why.
  """

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason = reason
    self.detail = detail


class Tag:
  """A marker in a key; compares by identity and reads well in a repr."""
  __slots__ = ("name",)

  def __init__(self, name):
    self.name = name

  def __repr__(self):
    return self.name

  def __reduce__(self):
    raise TypeError("closure-cache key markers are not picklable")


LIFTED = Tag("LIFTED")      # an array passed to the shared executable
MISSING = Tag("MISSING")   # a global name that is not (yet) defined
EMPTY = Tag("EMPTY")       # a cell that is not yet filled
FN = Tag("FN")             # (FN, index, code, id(globals), cells, defaults, kwdefaults, globals, chains)
TREE = Tag("TREE")         # (TREE, treedef, leaves)
TREEAUX = Tag("TREEAUX")   # (TREEAUX, node parts, leaves): functions in node data
TREEDEF = Tag("TREEDEF")   # (TREEDEF, node parts): a treedef value holding functions
PARTIAL = Tag("PARTIAL")   # (PARTIAL, func, args, keywords)
METHOD = Tag("METHOD")     # (METHOD, func, self)
WRAPPER = Tag("WRAPPER")   # (WRAPPER, type, static, inner)
OBJ = Tag("OBJ")           # (OBJ, index, type, ((name, value), ...)); arrays by identity
COPY = Tag("COPY")         # (COPY, index, type, ((name, value), ...)); arrays lifted
NUMPY = Tag("NUMPY")       # (NUMPY, dtype, shape, digest)
WEAKREF = Tag("WEAKREF")   # (WEAKREF, referent or None): read through it
CYCLE = Tag("CYCLE")       # (CYCLE, index of an enclosing function or object)
CLASS = Tag("CLASS")       # (CLASS, index, class, ((owner, name, value), ...))
ID = Tag("ID")             # (ID, id(obj), label); obj is an anchor
NOCHAIN = Tag("NOCHAIN")   # an attribute chain whose base is no module or class
DYN = Tag("DYN")           # (DYN, int or float): a Python scalar passed as an argument
SCALAR = Tag("SCALAR")     # a scalar's value, masked (see scalars_that_differ)


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


def fn_part(index, code, globals_id, cells, defaults, kwdefaults, globs,
            chains) -> tuple:
  """An ``FN`` part, as the plain tuple ``FnPart`` names the fields of."""
  return (FN, index, code, globals_id, cells, defaults, kwdefaults, globs,
          chains)


#: Types keyed by their value as they are (floats go through ``float_key``).
ATOMS = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})
#: Pytree node types whose node data holds no user function.
BUILTIN_NODES = frozenset({dict, list, tuple, type(None)})


def float_key(x: float):
  """A float's key: 0.0 == -0.0 and nan != nan; the hex form tells them
  apart exactly."""
  return (float, x) if x == x and x != 0.0 else (float, x.hex())
