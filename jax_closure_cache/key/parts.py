"""The parts a closure key is made of: its markers and the atoms it keeps.

A key is a nested tuple; each compound part starts with one of these
markers (``FN``, ``TREE``, ``OBJ``, ...), whose comment gives the part's
layout. The walk (``closure``) builds them; ``rebuild``, ``matchers``,
``guards`` and ``diagnostics`` read them.

Invariants: markers compare by identity and are not picklable (a key never
leaves the process); ``ATOMS`` are the types keyed by value as they are.
"""

from __future__ import annotations


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


#: Types keyed by their value as they are (floats go through ``float_key``).
ATOMS = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})
#: Pytree node types whose node data holds no user function.
BUILTIN_NODES = frozenset({dict, list, tuple, type(None)})


def float_key(x: float):
  """A float's key: 0.0 == -0.0 and nan != nan; the hex form tells them
  apart exactly."""
  return (float, x) if x == x and x != 0.0 else (float, x.hex())
