"""The house: one owner (:data:`STORE`) of every table the cache keeps,
the bounded mapping its entries live in, and the counters behind ``stats()``.

Invariants:
* Every table of the package's (per key, per code, per class, per object)
  is made by, and held by, :data:`STORE`, under a name and a kind that says
  what drops it (:class:`Store`); a module keeps at most a name bound to
  it. ``tests/test_layout.py`` finds every module-level table and checks
  that the store owns it.
* At most ``capacity()`` entries and ``max_bytes()`` bytes of what entries
  keep alive (captured constants; tier A's compiled executables) per
  bounded table; inserting or growing past either evicts the least
  recently used. ``get`` refreshes recency.
* ``hits + misses + fallbacks`` counts every call routed through the cache;
  counters are exact under threads (``itertools.count`` steps atomically).
* Tables are emptied in place, never replaced: a name bound to one stays
  the store's.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Any, Callable, NamedTuple

from jax_closure_cache import settings

DEFAULT_CAPACITY = settings.CAPACITY.default
_capacity = settings.read(settings.CAPACITY)
_max_bytes = settings.read(settings.MAX_BYTES)
_verify = settings.read(settings.VERIFY)


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
    # the collector can run it while this thread holds the lock (a deque:
    # appends and pops are atomic, so none is lost to a concurrent drain)
    self._pending: collections.deque = collections.deque()

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

  def resize(self, key, entry: Entry, nbytes: int) -> None:
    """Count ``nbytes`` for ``entry`` from now on (what it keeps grew: an
    executable compiled after the entry was stored), if ``key`` still maps
    to it; evicts past the bounds."""
    with self._lock:
      if self._data.get(key) is entry:
        self._bytes += nbytes - entry.nbytes
        entry.nbytes = nbytes
        evicted = self._evict()
      else:
        entry.nbytes, evicted = nbytes, []
    del evicted   # freed outside the lock

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

  def hold(self, key, entry: Entry, anchors, keep=None) -> list | str:
    """What ``entry``, stored under ``key``, keeps of ``anchors`` (the
    objects whose ids ``key`` holds): weak references whose death drops
    the entry (:meth:`discard_entry`), so no id in a stored key is reused
    and the store never extends an object's life; a globals dict, and
    what ``keep(anchor)`` allows, held as they are.

    Returns the list, or a string saying which anchor cannot be held
    weakly (then the entry must not be stored). The callers store the
    entry (:meth:`put`) once it holds the list."""
    entry_ref = weakref.ref(entry)

    def drop(_, store=self):
      # (the collector may run this while the store's lock is held:
      # ``discard_entry`` never blocks)
      store.discard_entry(key, entry_ref())

    held = []
    for a in anchors:
      try:
        held.append(a if type(a) is dict else weakref.ref(a, drop))
      except TypeError:
        if keep is None or not keep(a):
          return (f"a {type(a).__name__} kept by identity cannot be weakly "
                  "referenced, so storing it would keep it alive")
        held.append(a)
    return held

  def keep(self, key, entry: Entry, anchors, keep=None) -> str | None:
    """Store ``entry`` under ``key`` until one of ``anchors`` dies
    (:meth:`hold`, the list set as ``entry.anchors``, then :meth:`put`),
    for a flow that sets nothing on the entry between the two (the
    front's miss path sets its guards there, after :meth:`hold` succeeded).
    Returns None once stored, or why it was not (an anchor that cannot be
    held weakly; an unhashable key: ``TypeError``'s text), for the
    caller's ``not_stored`` event."""
    try:   # (before any weak reference whose callback would hash it)
      hash(key)
    except TypeError as e:   # a pytree's metadata can be unhashable
      return str(e)
    held = self.hold(key, entry, anchors, keep)
    if isinstance(held, str):
      return held
    entry.anchors = held
    self.put(key, entry)
    return None

  def _drain(self) -> None:
    pending = self._pending
    for _ in range(len(pending)):   # (one still locked out goes back)
      try:
        key, entry = pending.popleft()
      except IndexError:   # drained by another thread meanwhile
        return
      self.discard_entry(key, entry)

  def clear(self) -> None:
    with self._lock:
      old, self._data = self._data, collections.OrderedDict()
      self._bytes = 0
    del old   # freed outside the lock

  def __len__(self) -> int:
    return len(self._data)

  def keys(self) -> list:
    return list(self._data)

  def values(self) -> list:
    return list(self._data.values())

  def nbytes(self) -> int:
    """What the entries keep alive, summed (``Entry.nbytes``)."""
    return self._bytes

  def trim(self) -> None:
    with self._lock:
      evicted = self._evict()
    del evicted   # freed outside the lock


class Counters:
  """Exact counters: ``next()`` on an ``itertools.count`` is atomic.

  One instance (``STORE.counters``) lives for the whole process;
  :func:`clear` resets it in place, so the hot path may bind it once and
  call ``next(counters.hits)`` without a Python frame.
  """

  def __init__(self):
    self.lock = threading.Lock()
    # hits checked and mismatches since the process started (``reset``
    # keeps them): what ``pytest --closure-cache-verify`` reports
    self.verified_total = itertools.count()
    self.mismatches_total = itertools.count()
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


class Held(NamedTuple):
  """One table of the store: its name (``module.table``), the object, what
  drops it (a :class:`Store` kind), how to empty it, and, for tables
  counted in ``stats()``, the count (``counted``) and how to size it."""
  name: str
  table: Any
  kind: str
  empty: Callable[[], Any]
  counted: str | None
  size: Callable[[], int] | None


class Store:
  """The one owner of the cache's state.

  Each table is made here (:meth:`table`, :meth:`bounded`) or, where it is
  an object with its own clearing (a ``weakref_lru_cache``, the trace
  store), handed here (:meth:`own`), under a kind saying what drops it:

  * ``TRACES``: what may hold a jaxpr and its constants, and what is read
    with it (entries, identity rows, matchers, fronts, last keys): dropped
    by :meth:`clear` (``jax.clear_caches()``, ``jax_closure_cache.clear()``)
    and by :meth:`release_traces`;
  * ``CALLS``: what calls made that holds no constants (shared lowerings,
    the structures met once, per-location records): dropped by
    :meth:`clear`;
  * ``FACTS``: what is read off code objects, classes and options alone
    (code plans, a class's layout, the option specs), weakly keyed or
    bounded by the code the program has: kept;
  * ``REGISTRY``: what the package is (the patches applied, the wrapper
    classes and rules in use, listeners): kept.

  Counts are :attr:`counters` and the figures other tables report
  (:meth:`report`, :meth:`count_hits`, :meth:`reset_counts`).
  """
  TRACES, CALLS, FACTS, REGISTRY = "traces", "calls", "facts", "registry"
  _DROPPED_BY_CLEAR = frozenset({TRACES, CALLS})

  def __init__(self):
    self._held: dict[str, Held] = {}
    self._ids: set[int] = set()
    self.counters = Counters()
    # functions other tables answer stats() with: (name, report), hit
    # counts kept outside ``counters``, counts zeroed by clear()
    self._reports: list = []
    self._hit_counts: list = []
    self._count_resets: list = []
    self._verify_listeners: list = []
    self._carried_hits = 0   # hits of dropped records (carry_hits)
    self.clears = 0   # calls of clear_entries, ever

  # -- making and owning tables

  def own(self, name: str, table, kind: str, *, empty=None,
          counted: str | None = None, size=None):
    """Hold ``table`` under ``name``; ``empty()`` (default
    ``table.clear``, else ``table.cache_clear``) drops what it holds;
    ``counted``: ``stats()[counted]`` adds ``size()`` (default ``len``)."""
    if kind not in (self.TRACES, self.CALLS, self.FACTS, self.REGISTRY):
      raise ValueError(f"unknown kind {kind!r} of table {name!r}")
    if name in self._held:
      raise ValueError(f"the store already holds a table named {name!r}")
    if empty is None:
      empty = getattr(table, "clear", None) or table.cache_clear
    if counted is not None and size is None:
      size = table.__len__
    self._held[name] = Held(name, table, kind, empty, counted, size)
    self._ids.add(id(table))
    return table

  def table(self, name: str, kind: str, factory=dict, **options):
    """A new table (``factory()``: a dict, set, list, weak mapping...)
    owned under ``name``."""
    return self.own(name, factory(), kind, **options)

  def bounded(self, name: str, counted: str = "entries",
              kind: str = TRACES) -> "LRUStore":
    """A new :class:`LRUStore` owned under ``name``, its length counted in
    ``stats()[counted]`` and bounded by :func:`capacity` and
    :func:`max_bytes`."""
    return self.own(name, LRUStore(counted), kind, counted=counted)

  def owns(self, table) -> bool:
    return id(table) in self._ids and any(
        h.table is table for h in self._held.values())

  def held(self) -> list[Held]:
    """Every table, in the order they were made."""
    return list(self._held.values())

  def bounded_tables(self) -> list["LRUStore"]:
    return [h.table for h in self._held.values()
            if isinstance(h.table, LRUStore)]

  # -- dropping

  def clear_entries(self) -> None:
    """Drop what every ``TRACES`` and ``CALLS`` table holds; counts stay
    (``clears`` counts the calls: ``jax.clear_caches()`` made inside a
    trace is an effect a hit would skip)."""
    self.clears += 1
    self._drop(self._DROPPED_BY_CLEAR)

  def release_traces(self) -> None:
    """Drop what every ``TRACES`` table holds: what a stock program would
    no longer hold, such as JAX's memoized conversion of a NumPy array
    changed in place since (``key.closure.fresh_conversion``)."""
    self._drop((self.TRACES,))

  def _drop(self, kinds) -> None:
    for held in list(self._held.values()):
      if held.kind in kinds:
        held.empty()

  def clear(self) -> None:
    """Drop every entry and zero the counters."""
    self.clear_entries()
    with self.counters.lock:
      self.counters.reset()
      self._carried_hits = 0
    for reset in self._count_resets:
      reset()

  # -- counting

  def report(self, name: str, report, reset=None) -> None:
    """Add ``report()`` to ``stats()`` under ``name``; ``reset()`` zeroes
    its counts in :meth:`clear`."""
    self._reports.append((name, report))
    if reset is not None:
      self._count_resets.append(reset)

  def count_hits(self, count) -> None:
    """Add ``count()`` to ``stats()``' ``hits`` (hits counted on entries'
    records by the generated fronts, where a call would cost a frame)."""
    self._hit_counts.append(count)

  def carry_hits(self, n: int) -> None:
    """Keep ``n`` hits of records being dropped (``clear_entries``) in
    ``stats()`` until the counts are zeroed."""
    with self.counters.lock:
      self._carried_hits += n

  def on_verify_changed(self, listener) -> None:
    """Call ``listener(on)`` whenever verify mode is turned on or off."""
    self._verify_listeners.append(listener)

  def verify_changed(self, on: bool) -> None:
    for listener in self._verify_listeners:
      listener(on)

  def record_hits(self) -> int:
    """The hits counted on entries' records (:meth:`count_hits`)."""
    return sum(count() for count in self._hit_counts)

  def entries_of(self, counted: str) -> list:
    """The entries the bounded tables counted under ``counted`` hold now."""
    return [e for s in self.bounded_tables() if s.kind == counted
            for e in s.values()]

  def size(self, counted: str) -> int:
    return sum(h.size() for h in list(self._held.values())
               if h.counted == counted)

  def stats(self) -> dict:
    c = self.counters
    with c.lock:
      reasons = dict(c.reasons)
      not_stored = dict(c.not_stored)
      carried = self._carried_hits
    hits = _read(c.hits) + carried + self.record_hits()
    return {"hits": hits, "misses": _read(c.misses),
            "fallbacks": _read(c.fallbacks), "fallback_reasons": reasons,
            "retraces": _read(c.retraces),
            "not_stored": not_stored,
            "verified": _read(c.verified),
            "verify_mismatches": _read(c.verify_mismatches),
            "entries": self.size("entries"),
            "shared_traces": self.size("shared_traces"),
            **{name: report() for name, report in self._reports}}

  def trim(self) -> None:
    for store in self.bounded_tables():
      store.trim()


#: The one store of the process.
STORE = Store()
counters = STORE.counters
STORE.own("settings.WARNED", settings.WARNED, Store.REGISTRY)


def capacity() -> int:
  """Entries kept per bounded table (default 1024, or
  ``JAX_CLOSURE_CACHE_CAPACITY``)."""
  return _capacity


def max_bytes() -> int:
  """Bytes of captured constants kept per bounded table (default 1 GiB, or
  ``JAX_CLOSURE_CACHE_MAX_BYTES``)."""
  return _max_bytes


def set_max_bytes(n: int) -> None:
  """Keep at most ``n`` bytes of captured constants per bounded table,
  evicting the oldest entries now if needed."""
  global _max_bytes
  _max_bytes = _positive("max_bytes", n)
  STORE.trim()


def set_capacity(n: int) -> None:
  """Keep at most ``n`` entries per bounded table, evicting the oldest now
  if needed."""
  global _capacity
  _capacity = _positive("capacity", n)
  STORE.trim()


def _positive(name: str, n) -> int:
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"{name} must be a positive int, got {n!r}")
  return n


def verifying() -> bool:
  """Whether verify mode is on: every hit is also answered as stock would
  answer it and compared (``JAX_CLOSURE_CACHE_VERIFY``, ``enable(verify=)``)."""
  return _verify


def set_verify(on: bool) -> None:
  global _verify
  if bool(on) != _verify:
    _verify = bool(on)
    STORE.verify_changed(_verify)


def count_verified(same: bool) -> None:
  """One hit checked in verify mode; ``same``: it matched stock's."""
  next(counters.verified)
  next(counters.verified_total)
  if not same:
    next(counters.verify_mismatches)
    next(counters.mismatches_total)


def verify_totals() -> tuple[int, int]:
  """``(hits checked, mismatches)`` in verify mode since the process started
  (``clear()`` does not reset them)."""
  return _read(counters.verified_total), _read(counters.mismatches_total)


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
  return STORE.stats()


def clear_entries() -> None:
  """Drop every entry of every table (``STORE.clear_entries``); counts stay."""
  STORE.clear_entries()


def release_traces() -> None:
  """``STORE.release_traces``: drop every table that may hold a trace."""
  STORE.release_traces()


def clear() -> None:
  """Drop every entry of every table and zero the counters."""
  STORE.clear()


class _JaxCacheHandle:
  """What JAX's ``register_cache`` expects of a cache, so that
  ``jax.clear_caches()`` clears the store's tables as well (registered
  once, for the whole store)."""

  def cache_clear(self) -> None:
    STORE.clear_entries()

  def cache_info(self):
    return {"entries": STORE.size("entries"),
            "shared_traces": STORE.size("shared_traces")}

  def cache_keys(self):
    return [k for s in STORE.bounded_tables() for k in s.keys()]


# JAX holds registered caches weakly: this module keeps the handle alive.
jax_handle = _JaxCacheHandle()
