"""The bounded store of compiled entries and the counters behind ``stats()``.

Invariants:
* At most ``capacity()`` entries and ``max_bytes()`` bytes of the constants
  entries keep alive per store; inserting past either evicts the least
  recently used. ``get`` refreshes recency.
* ``hits + misses + fallbacks`` counts every call routed through the cache;
  counters are exact under threads (``itertools.count`` steps atomically).
* Every store registered with :func:`new_store` is emptied by :func:`clear`.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any

from jax_closure_cache import settings

DEFAULT_CAPACITY = settings.CAPACITY.default
_capacity = settings.read(settings.CAPACITY)
_max_bytes = settings.read(settings.MAX_BYTES)
_verify = settings.read(settings.VERIFY)
_stores: "weakref.WeakSet[LRUStore]" = weakref.WeakSet()
_clear_hooks: list = []   # (hook, whether what it clears holds traces)


def register_clear_hook(hook, holds_traces: bool = True) -> None:
  """Call ``hook()`` from :func:`clear`, for caches kept outside the stores;
  ``holds_traces``: also from :func:`release_traces` (what it clears may hold
  a jaxpr and its constants)."""
  _clear_hooks.append((hook, holds_traces))


# Hits counted outside ``counters`` (the fast front counts its hits on the
# entry's record alone: one statement per hit instead of three); each is a
# function returning its count since the last :func:`clear`.
_hit_counts: list = []


def register_hit_count(count) -> None:
  """Add ``count()`` to :func:`stats`' ``hits``."""
  _hit_counts.append(count)


class Entry:
  """Base of stored values: ``used`` is the second-chance bit, set by every
  hit (the inline cache's included) and cleared by eviction's sweep."""
  __slots__ = ("used", "nbytes", "__weakref__")

  def __init__(self):
    self.used = False
    self.nbytes = 0   # what it keeps alive of captured constants


class LRUStore:
  """A thread-safe bounded mapping from cache keys to :class:`Entry` values.

  Eviction is least-recently-used, approximated by a second-chance (CLOCK)
  bit kept on the entry: a hit only sets ``entry.used``, so no hit path
  hashes the key twice or reorders the table; an eviction skips (and
  clears) entries whose bit is set.
  """

  def __init__(self, kind: str = "entries"):
    self.kind = kind   # the stats() count this store's size goes to
    self._data: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()
    self._bytes = 0   # the entries' nbytes, summed
    # (key, entry) pairs a weak reference's callback could not drop at once:
    # the collector can run it while this thread holds the lock
    self._pending: list = []

  def get(self, key) -> Any:
    """The entry for ``key`` or None. Raises TypeError if ``key`` is
    unhashable (a pytree's metadata can be)."""
    if self._pending:
      self._drain()
    entry = self._data.get(key)
    if entry is not None:
      entry.used = True
    return entry

  # Nothing is freed while the lock is held: a freed entry can drop the
  # last reference to an anchor whose weak reference's callback takes the
  # lock again (``discard_entry``). Each removal returns what it removed,
  # to be freed by the caller's frame after the lock is released.

  def put(self, key, entry: Entry) -> None:
    if self._pending:
      self._drain()
    with self._lock:
      entry.used = False
      replaced = self._data.get(key)
      if replaced is not None:
        self._bytes -= replaced.nbytes
      self._data[key] = entry
      self._bytes += entry.nbytes
      self._data.move_to_end(key)
      evicted = self._evict()
    del replaced, evicted   # freed outside the lock

  def _evict(self) -> list:
    data, evicted = self._data, []
    while len(data) > _capacity or (self._bytes > _max_bytes and len(data) > 1):
      key, entry = next(iter(data.items()))
      if entry.used:   # used since its last chance: move it to the young end
        entry.used = False
        data.move_to_end(key)
      else:
        evicted.append(data.pop(key))
        self._bytes -= entry.nbytes
    return evicted

  def discard(self, key) -> None:
    with self._lock:
      removed = self._data.pop(key, None)
      self._bytes -= 0 if removed is None else removed.nbytes
    del removed   # freed outside the lock

  def discard_entry(self, key, entry: Entry) -> None:
    """Drop ``key`` if it still maps to ``entry`` (a weak reference's
    callback: the key may have been stored again since). Never blocks: a
    callback the collector runs while the lock is held defers the drop to
    the next use of the store."""
    if entry is None:
      return
    if not self._lock.acquire(blocking=False):
      self._pending.append((key, entry))
      return
    try:
      removed = self._data.pop(key) if self._data.get(key) is entry else None
      self._bytes -= 0 if removed is None else removed.nbytes
    finally:
      self._lock.release()
    del removed   # freed outside the lock

  def _drain(self) -> None:
    pending, self._pending = self._pending, []
    for key, entry in pending:
      self.discard_entry(key, entry)

  def clear(self) -> None:
    with self._lock:
      old, self._data = self._data, collections.OrderedDict()
      self._bytes = 0
    del old   # freed outside the lock

  def __len__(self) -> int:
    return len(self._data)

  def trim(self) -> None:
    with self._lock:
      evicted = self._evict()
    del evicted   # freed outside the lock


def new_store(kind: str = "entries") -> LRUStore:
  store = LRUStore(kind)
  _stores.add(store)
  return store


def capacity() -> int:
  """Entries kept per store (default 1024, or ``JAX_CLOSURE_CACHE_CAPACITY``)."""
  return _capacity


def max_bytes() -> int:
  """Bytes of captured constants kept per store (default 1 GiB, or
  ``JAX_CLOSURE_CACHE_MAX_BYTES``)."""
  return _max_bytes


def set_max_bytes(n: int) -> None:
  """Keep at most ``n`` bytes of captured constants per store, evicting the
  oldest entries now if needed."""
  global _max_bytes
  _max_bytes = _positive("max_bytes", n)
  _trim_all()


def set_capacity(n: int) -> None:
  """Keep at most ``n`` entries per store, evicting the oldest now if needed."""
  global _capacity
  _capacity = _positive("capacity", n)
  _trim_all()


def verifying() -> bool:
  """Whether verify mode is on: every hit is also answered as stock would
  answer it and compared (``JAX_CLOSURE_CACHE_VERIFY``, ``enable(verify=)``)."""
  return _verify


_verify_hooks: list = []


def register_verify_hook(hook) -> None:
  """Call ``hook(on)`` whenever verify mode is turned on or off (generated
  hit paths are made anew with or without the check)."""
  _verify_hooks.append(hook)


def set_verify(on: bool) -> None:
  global _verify
  if bool(on) != _verify:
    _verify = bool(on)
    for hook in _verify_hooks:
      hook(_verify)


def count_verified(same: bool) -> None:
  """One hit checked in verify mode; ``same``: it matched stock's."""
  next(counters.verified)
  next(_verify_totals[0])
  if not same:
    next(counters.verify_mismatches)
    next(_verify_totals[1])


# Hits checked and mismatches since the process started (``clear()`` does
# not reset them): what ``pytest --closure-cache-verify`` reports.
_verify_totals = (itertools.count(), itertools.count())


def verify_totals() -> tuple[int, int]:
  """``(hits checked, mismatches)`` in verify mode since the process started."""
  return _read(_verify_totals[0]), _read(_verify_totals[1])


def _positive(name: str, n) -> int:
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"{name} must be a positive int, got {n!r}")
  return n


def _trim_all() -> None:
  for store in list(_stores):
    store.trim()


class Counters:
  """Exact counters: ``next()`` on an ``itertools.count`` is atomic.

  One instance (:data:`counters`) lives for the whole process; :func:`clear`
  resets it in place, so the hot path may bind it once and call
  ``next(counters.hits)`` without a Python frame.
  """

  def __init__(self):
    self.lock = threading.Lock()
    self.reset()

  def reset(self) -> None:
    self.hits = itertools.count()
    self.misses = itertools.count()
    self.fallbacks = itertools.count()
    self.retraces = itertools.count()
    self.verified = itertools.count()
    self.verify_mismatches = itertools.count()
    self.reasons: collections.Counter = collections.Counter()
    self.not_stored: collections.Counter = collections.Counter()


def _read(counter: itertools.count) -> int:
  # count objects expose their next value only through repr: "count(N)".
  return int(repr(counter)[6:-1])


counters = Counters()


def count_miss() -> None:
  next(counters.misses)


def count_fallback(reason: str) -> None:
  c = counters
  next(c.fallbacks)
  with c.lock:
    c.reasons[reason] += 1


def count_retrace() -> None:
  """A call that found its entry but traced it again (new argument types or
  structure, a new trace context)."""
  next(counters.retraces)


def count_not_stored(reason: str) -> None:
  """A miss whose entry was dropped after the call (counted as a miss)."""
  c = counters
  with c.lock:
    c.not_stored[reason] += 1


def stats() -> dict:
  """Counts since start or the last :func:`clear`.

  ``hits``, ``misses``, ``fallbacks`` (calls answered by stock jit) are ints;
  ``fallback_reasons`` maps each fallback reason to its count;
  ``not_stored`` maps reasons a missed entry was dropped (its trace captured
  an array no key or guard covers) to counts; ``retraces`` counts calls that
  found their entry but traced it again (a hit is not always free of
  tracing); ``entries`` is the number of shared executables' entries held
  now, and ``shared_traces`` the number of traces the memoized trace
  lookup holds for re-created closures (``lookup/trace_lookup.py``);
  ``verified`` the hits checked in verify mode and ``verify_mismatches``
  those that differed from stock's (answered by stock); ``tier_a`` the
  shared lowerings (``lowering/shared.py``).
  """
  c = counters
  with c.lock:
    reasons = dict(c.reasons)
    not_stored = dict(c.not_stored)
  hits = _read(c.hits) + sum(count() for count in _hit_counts)
  return {"hits": hits, "misses": _read(c.misses),
          "fallbacks": _read(c.fallbacks), "fallback_reasons": reasons,
          "retraces": _read(c.retraces),
          "not_stored": not_stored,
          "verified": _read(c.verified),
          "verify_mismatches": _read(c.verify_mismatches),
          "entries": _held("entries"),
          "shared_traces": _held("shared_traces"),
          **{kind: report() for kind, report in _reports}}


_reports: list = []   # (name, function) of other modules' figures


def register_report(name: str, report) -> None:
  """Add ``report()`` to :func:`stats` under ``name``."""
  _reports.append((name, report))


def _stores_of(kind: str) -> list:
  """The entries held now by the stores counted under ``kind``."""
  return [e for s in list(_stores) if s.kind == kind
          for e in list(s._data.values())]


def _held(kind: str) -> int:
  return (sum(len(s) for s in list(_stores) if s.kind == kind)
          + sum(size() for k, size in _sizes if k == kind))


_sizes: list = []   # (kind, size function) of stores kept elsewhere


def register_size(kind: str, size) -> None:
  """Count ``size()`` in :func:`stats` under ``kind`` (a store this module
  does not own, such as the trace lookup's)."""
  _sizes.append((kind, size))


def clear_entries() -> None:
  """Drop every entry of every store (and what the hooks keep); counts stay."""
  for store in list(_stores):
    store.clear()
  for hook, _ in _clear_hooks:
    hook()


def release_traces() -> None:
  """Drop every entry that may hold a trace (every store but the shared
  lowerings, which hold no constants): what a stock program would no longer
  hold, such as JAX's memoized conversion of a NumPy array changed in place
  since (``key.closure.fresh_conversion``). Counts stay."""
  for store in list(_stores):
    if store.kind != "lowerings":
      store.clear()
  for hook, holds_traces in _clear_hooks:
    if holds_traces:
      hook()


_count_resets: list = []


def register_count_reset(hook) -> None:
  """Call ``hook()`` from :func:`clear`, for counts kept outside ``counters``."""
  _count_resets.append(hook)


def clear() -> None:
  """Drop every entry of every store and zero the counters."""
  clear_entries()
  with counters.lock:
    counters.reset()
  for hook in _count_resets:
    hook()


class _JaxCacheHandle:
  """What JAX's ``register_cache`` expects of a cache, so that
  ``jax.clear_caches()`` clears this one's entries as well."""

  def cache_clear(self) -> None:
    clear_entries()

  def cache_info(self):
    return {"entries": sum(len(s) for s in list(_stores))}

  def cache_keys(self):
    return [k for s in list(_stores) for k in list(s._data)]


# JAX holds registered caches weakly: this module keeps the handle alive.
jax_handle = _JaxCacheHandle()
