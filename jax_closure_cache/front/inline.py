"""The hot path's inline cache and the fast fronts built from it.

``quick``: code object -> the last few stored entries of top-level functions
with that code (newest first), each with the generated matcher of its key
(``key/matchers.py``). ``fronts``: code object -> the ``ClosureJitted``
subclass whose generated ``__call__`` inlines those matchers for the hot
spec (``generated.front_class``); ``jit(fun)`` makes its wrapper of that
class. ``canonical_quick`` is the same table for closure-free functions'
canonical stock objects.

Invariants: entries are held weakly (an entry evicted from its store is gone
here too); both tables are bounded (a code made by ``exec`` in a loop starts
them over); a code whose keys have no matcher is remembered in ``no_quick``
and not retried; a front belongs to one spec, so fronts are dropped when the
defaults change.
"""

from __future__ import annotations

import itertools
import types
import weakref

from jax_closure_cache import cache
from jax_closure_cache.front import generated
from jax_closure_cache.front import options
from jax_closure_cache.key import matchers

PER_CODE = 4
_TABLE_MAX = 1 << 16
FRONTS_MAX = 1024

_STORE, _TRACES = cache.STORE, cache.Store.TRACES
# code -> its stored keys' matchers (the front's, the canonical objects')
quick: dict[types.CodeType, list["Quick"]] = _STORE.table("inline.quick", _TRACES)
canonical_quick: dict[types.CodeType, list["Quick"]] = _STORE.table(
    "inline.canonical_quick", _TRACES)
# codes whose keys have no matcher
no_quick: "weakref.WeakSet[types.CodeType]" = _STORE.table(
    "inline.no_quick", _TRACES, weakref.WeakSet)
# code -> its generated front class
fronts: dict[types.CodeType, type] = _STORE.table("inline.fronts", _TRACES)
options.on_defaults_changed(fronts.clear)   # each front is of one spec
# code -> the front class of a client's own wrapper class, for a code only
# that client wraps (eager control flow's launchers, the binders of static
# arguments): a subclass of the client's class, which ``jit`` never makes
client_fronts: dict[types.CodeType, type] = _STORE.table(
    "inline.client_fronts", _TRACES)
options.on_defaults_changed(client_fronts.clear)


class Quick:
  """One stored key of a code: its options key, matcher and entry."""
  __slots__ = ("options_key", "key", "match", "entry", "source")

  def __init__(self, options_key, key, source, entry):
    self.options_key = options_key
    self.key = key
    self.source = source   # the matcher's checks, for the fast front
    self.match = matchers.compile_matcher(source)
    self.entry = weakref.ref(entry)


_ids = itertools.count()


def remember(table: dict, fun, key, entry) -> list | None:
  """Add a matcher for ``key`` (of plain function ``fun``, or a partial of
  one) to ``table``'s row for its code; returns the row, or None if
  ``key`` has no matcher."""
  source = matchers.match_source(fun, key[1], f"Q{next(_ids)}_K")
  if source is None:
    return None
  code = fun.__code__ if type(fun) is types.FunctionType else fun.func.__code__
  row = [q for q in table.get(code, ())
         if q.key != key and q.entry() is not None]
  row.insert(0, Quick(key[0], key, source, entry))
  del row[PER_CODE:]
  if len(table) >= _TABLE_MAX:
    table.clear()
  table[code] = row
  return row


def refresh_front(code, row: list, base: type, hit_env: dict,
                  table: dict = fronts) -> None:
  """The front class of ``code`` for the hot spec's keys in ``row`` (a
  subclass of ``base``), filed in ``table`` (:data:`fronts`, or
  :data:`client_fronts` for a client's own class), or none if it has no
  such key."""
  spec = options.hot_spec()
  mine = [(q.key, q.source, q.entry) for q in row
          if q.options_key is spec.key]
  cls = (generated.front_class(base, spec, code, mine, hit_env,
                               cache.verifying())
         if mine else None)
  if cls is None:
    table.pop(code, None)
    return
  if code not in table and len(table) >= FRONTS_MAX:
    table.clear()
  table[code] = cls
