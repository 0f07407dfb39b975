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
FN = _key.FN               # (FN, index, code, id(globals), cells, defaults, kwdefaults, globals, chains)
TREE = _key.TREE           # (TREE, treedef, leaves)
PARTIAL = _key.PARTIAL     # (PARTIAL, func, args, keywords)
WEAKREF = _key.WEAKREF     # (WEAKREF, referent or None): read through it
CYCLE = _key.CYCLE         # (CYCLE, index of an enclosing function or object)
ID = _key.ID               # (ID, id(obj), label); obj is an anchor
NUMPY = _key.NUMPY         # (NUMPY, dtype, shape, digest)
WRAPPER = _key.WRAPPER     # (WRAPPER, type, static, inner)
# ... and the package's (``closure.Analysis``):
TREEAUX = Tag("TREEAUX")   # (TREEAUX, node parts, leaves): functions in node data
TREEDEF = Tag("TREEDEF")   # (TREEDEF, node parts): a treedef value holding functions
METHOD = Tag("METHOD")     # (METHOD, func, self)
OBJ = Tag("OBJ")           # (OBJ, index, type, ((name, value), ...)); arrays by identity
COPY = Tag("COPY")         # (COPY, index, type, ((name, value), ...)); arrays lifted
CLASS = Tag("CLASS")       # (CLASS, index, class, ((owner, name, value), ...))
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
