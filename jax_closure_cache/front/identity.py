"""Identity first: what the first call of a function object decided.

Stock keys its caches on the function object, so a function object called
before is answered as its first call decided, whatever its closure holds
later. This module owns the rows that remember it, per options key.

Invariants: a row never refers to its function, and goes (with no Python
frame of ours) the moment the function dies; tables are emptied, never
replaced (the hot path holds them); ``clear()`` empties them.
"""

from __future__ import annotations

import sys
import weakref

from jax_closure_cache import cache

#: A function object whose first call hit a shared lifted entry keeps calling
#: that entry, with the arrays it read then, as stock would keep its first
#: trace. After this many calls times arrays (a closure over 256 arrays or
#: more at its second call) it is long-lived: it gets stock's own executable
#: (arrays baked), which is faster per call when it closes over many arrays.
#: Stock pays that compile at the first call, so the total is never more
#: than stock's.
PROMOTE_AFTER_CALLS = 256


# What the first call of one function object (under one set of options)
# decided, for all its later calls; stock keys its caches on the object too.
# A row is either
#
# * a weak reference to a stock jitted object of the function (``OWNED``:
#   stock traced it, so it is stock's from then on; when that object is
#   gone, a new stock ``jax.jit`` of the function finds stock's own trace of
#   it, as stock would), or
# * a :class:`Pinned`: its first call hit a shared entry, which it keeps.
#
# Rows refer neither to the function nor, once it dies, to anything of it.
OWNED = weakref.ReferenceType


class Pinned:
  """The row of a function object whose first call used a shared entry.

  ``entry``: that entry (``cache.Entry``); ``key``: the full key it was
  found under; ``leaves``: the arrays the object's closure held then,
  passed to the entry at every call, as stock keeps its first trace's;
  ``calls``: calls times arrays since (promoted to stock's own executable
  at ``PROMOTE_AFTER_CALLS``), reset when the entry warns."""
  __slots__ = ("entry", "key", "leaves", "calls")

  def __init__(self, entry, key, leaves):
    self.entry = entry
    self.key = key
    self.leaves = leaves
    self.calls = 0


# options key -> {weakref(function object): row}. Each weak reference's
# callback is its table's own ``pop``, so a row goes, with no Python frame of
# ours, the moment its function object dies (a dead reference keeps its hash
# and equals only itself). Tables are emptied, never replaced.
tables: dict[tuple, dict] = cache.STORE.table(
    "identity.tables", cache.Store.TRACES, empty=lambda: clear_tables())
# eager control flow's rows (``control_flow/launchers._Row``, a weak
# reference to its user function, mapped to itself and found by a plain
# weak reference), each dropping itself the moment its function dies
launch_rows: dict = cache.STORE.table("identity.launch_rows",
                                      cache.Store.TRACES)
ref = weakref.ref
getweakrefcount = weakref.getweakrefcount
# Without reference counts (not CPython), every hit records its row.
getrefcount = getattr(sys, "getrefcount", lambda _: LONE_REFS + 1)
# References to a function held by a wrapper alone, as counted in the hot
# path: the wrapper's slot, the local name, getrefcount's argument.
LONE_REFS = 3


def table(options_key) -> dict:
  found = tables.get(options_key)
  if found is None:
    found = tables.setdefault(options_key, {})
  return found


def clear_tables() -> None:
  for rows in list(tables.values()):
    rows.clear()


def row_of(fun, options_key):
  table = tables.get(options_key)
  if table is None:
    return None
  try:
    return table.get(ref(fun))
  except TypeError:   # not weakly referenceable, or unhashable
    return None


def remember(table: dict, fun, row) -> None:
  try:
    table[ref(fun, table.pop)] = row
  except TypeError:   # not weakly referenceable, or unhashable: no row
    pass


def forget(table: dict, fun) -> None:
  try:
    table.pop(ref(fun), None)
  except TypeError:   # not weakly referenceable, or unhashable: no row
    pass
