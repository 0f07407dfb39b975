"""Why a call missed or fell back, recompile storms, monitoring events, and
per-location statistics.

Invariants:
* Nothing here runs on a cache hit except :func:`hit`, which bumps a record
  and emits a ``jax.monitoring`` event only when a listener is registered.
* Explanations are logged through the ``jax_closure_cache`` logger, computed
  only when one of two options is on: at WARNING under
  ``JAX_CLOSURE_CACHE_EXPLAIN``, at INFO under JAX's own
  ``jax_explain_cache_misses`` alone (so that JAX's warnings are exactly
  what stock logs under its own option).
* The storm guard logs at most once per user code object, at WARNING
  through the ``jax_closure_cache`` logger (never through ``warnings``).

Names in messages follow the walk (``explain``).
"""

from __future__ import annotations

import collections
import logging
import threading
import types
from typing import Any

import jax

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache import explain
from jax_closure_cache.key import names as key_names
from jax_closure_cache import settings

logger = logging.getLogger("jax_closure_cache")

EXPLAIN_ENV = settings.EXPLAIN.name
DEFAULT_STORM_THRESHOLD = settings.STORM_THRESHOLD.default
_storm_threshold = settings.read(settings.STORM_THRESHOLD)
#: The keys of a code's recent misses kept whole, for explanations and the
#: storm guard's naming (a key holds what its closure held); of the rest
#: their hashes alone.
RECENT_KEYS = 3


def storm_threshold() -> int:
  """Entries one code object may accumulate before the storm warning."""
  return _storm_threshold


def set_storm_threshold(n: int) -> None:
  """Warn once when a code object accumulates more than ``n`` entries."""
  global _storm_threshold
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"storm threshold must be a positive int, got {n!r}")
  _storm_threshold = n


def explain_level() -> int:
  """The level explanations are logged at: WARNING under the package's own
  option, INFO under JAX's ``jax_explain_cache_misses`` alone, else 0 (not
  explained)."""
  if settings.read(settings.EXPLAIN):
    return logging.WARNING
  return logging.INFO if _compat.explain_cache_misses() else 0


def explaining() -> bool:
  return explain_level() != 0


def _explain(msg: str, *args) -> None:
  logger.log(explain_level() or logging.INFO, msg, *args)


# -- per-location records ----------------------------------------------------

class Record:
  """One entry's counts: hits, and the trace+compile seconds of its miss.

  ``front`` counts the fast front's hits (generated.HIT adds to it and
  to nothing else, so a hit there costs one statement); ``hits`` counts the
  others, which also count in ``cache.counters``. Under the GIL of CPython
  3.11 ``record.front += 1`` runs no check for a thread switch between its
  read and its write, so the count is exact.
  """
  __slots__ = ("hits", "cost", "front")

  def __init__(self, cost: float):
    self.hits = 0
    self.front = 0
    self.cost = cost

  @property
  def total(self) -> int:
    return self.hits + self.front


class CodeStats:
  """Everything seen for one code object (one source location)."""
  __slots__ = ("location", "misses", "fallbacks", "records", "hashes",
               "keys", "met_once", "warned")

  def __init__(self, location: str):
    self.location = location
    self.misses = 0
    self.fallbacks: collections.Counter = collections.Counter()
    self.records: list[Record] = []
    # the hashes of this code's recent keys (missed, or met once and
    # answered by stock), newest last: the storm guard counts them
    self.hashes: collections.deque = collections.deque(maxlen=128)
    # the last few of those keys themselves, (options key, function key),
    # missed and met once apart, which explanations and the storm guard
    # name parts of: only a few, as a key holds what the closure held (its
    # values, a class)
    self.keys: collections.deque = collections.deque(maxlen=RECENT_KEYS)
    self.met_once: collections.deque = collections.deque(maxlen=RECENT_KEYS)
    self.warned = False

  @property
  def hits(self) -> int:
    return sum(r.total for r in self.records)

  @property
  def seconds_avoided(self) -> float:
    return sum(r.total * r.cost for r in self.records)


def _drop_records() -> None:
  """Empty ``_by_code`` (``jax.clear_caches()``), its front hits carried
  in ``stats()`` until the counts are zeroed (``clear()``)."""
  with _lock:
    cache.STORE.carry_hits(_records_front_hits())
    _by_code.clear()


_by_code: dict[Any, CodeStats] = cache.STORE.table(
    "diagnostics.by_code", cache.Store.CALLS, empty=_drop_records)
_lock = threading.Lock()


def _records_front_hits() -> int:
  return sum(r.front for s in list(_by_code.values())
             for r in list(s.records))


def _front_hits() -> int:
  """The fast front's hits on the records kept now (every entry it can
  hit has a record here: the front is built for stored entries only)."""
  with _lock:
    return _records_front_hits()


cache.STORE.count_hits(_front_hits)


def location(fun) -> str:
  """``name (file:line)`` of the function under ``fun``'s wrappers."""
  inner = fun
  while True:
    if isinstance(inner, types.FunctionType):
      code = inner.__code__
      return f"{inner.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    inner = (getattr(inner, "func", None) or getattr(inner, "__func__", None)
             or getattr(inner, "__wrapped__", None))
    if inner is None:
      return repr(fun)


def _stats(code, fun) -> CodeStats:
  s = _by_code.get(code)
  if s is None:
    with _lock:
      s = _by_code.setdefault(code, CodeStats(location(fun)))
  return s


def summary(top: int = 10) -> dict:
  """Counters, the busiest locations, and trace+compile time avoided."""
  rows = sorted(_by_code.values(),
                key=lambda s: -(s.hits + s.misses + sum(s.fallbacks.values())))
  return {
      **cache.stats(),
      "seconds_avoided": sum(s.seconds_avoided for s in _by_code.values()),
      "locations": [{"location": s.location, "hits": s.hits,
                     "misses": s.misses, "fallbacks": dict(s.fallbacks),
                     "seconds_avoided": s.seconds_avoided}
                    for s in rows[:top]],
  }


# -- the cost of a compile stock makes for us -----------------------------------
#
# A closure-free function's first object is handed stock's own jitted object
# before it is called, so its trace and compile happen later, inside stock.
# JAX reports their durations as monitoring events; they are added to that
# entry's record until the next cache event, so ``run`` can say how much
# time its hits avoided.

class _Unmeasured(threading.local):
  record = None


_unmeasured = _Unmeasured()


def _on_duration(event: str, seconds: float, **_) -> None:
  record = _unmeasured.record
  if record is not None and event in _compat.COMPILE_DURATION_EVENTS:
    record.cost += seconds


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def measure_later(record: Record) -> None:
  """Attribute the trace and compile JAX reports next to ``record``."""
  _unmeasured.record = record


# -- events ------------------------------------------------------------------

_monitoring_active = _compat.monitoring_active


def hit(record: Record) -> None:
  _unmeasured.record = None
  record.hits += 1
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/hit")


def miss(fun, code, full_key, cost: float, first_object: bool = False) -> Record:
  """Record a miss; explain it and guard storms. ``first_object``: the first
  function object of its code, left to stock's own jit (identity first)."""
  _unmeasured.record = None
  record = Record(cost)
  s = _stats(code, fun)
  with _lock:
    s.misses += 1
    s.records.append(record)
    previous = list(s.keys)
    _remember_key(s, s.keys, full_key)
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/miss")
  if explaining():
    why = explain.explain_miss(fun, full_key, previous)
    if first_object:
      why = why + ["first function object of this code: stock jit traces it "
                   "(a re-created one compiles the shared lifted entry)"]
    _explain("closure-cache miss for %s: %s", s.location, "; ".join(why))
  _guard_storm(fun, code, s, previous + list(s.met_once) + [full_key])
  return record


def met_once(fun, code, full_key, detail: str) -> None:
  """A key met for the first time past its code's first object, answered
  by stock (no entry): explained by what differs from the code's recent
  keys, and counted by the storm guard, since stock compiles it."""
  if code is None:
    return fallback(fun, code, "key_met_once", detail)
  s = _stats(code, fun)
  with _lock:
    s.fallbacks["key_met_once"] += 1
    previous = list(s.keys) + list(s.met_once)
    _remember_key(s, s.met_once, full_key)
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/fallback",
                                reason="key_met_once")
  if explaining():
    why = explain.explain_miss(fun, full_key, previous) if previous else []
    _explain("closure-cache fallback to stock jit for %s: %s",
             s.location, "; ".join([*why, detail]))
  _guard_storm(fun, code, s, previous + [full_key])
  return None


def _remember_key(s: CodeStats, recent, full_key) -> None:
  """Records ``full_key``: its hash, and itself in ``recent``."""
  recent.append(full_key)
  s.hashes.append(_hashable(full_key))


def _guard_storm(fun, code, s: CodeStats, keys: list) -> None:
  with _lock:   # (another thread may be recording a key of this code)
    distinct = len(set(s.hashes))
  if distinct > _storm_threshold and not s.warned:
    s.warned = True
    try:
      _warn_storm(fun, code, s, keys, distinct)
    except Exception as e:   # naming the culprit must never fail the call
      logger.warning("jax_closure_cache: %s has met %d distinct closure keys "
                     "(naming what changes failed: %s)", s.location,
                     distinct, type(e).__name__)


def _hashable(key):
  try:
    return hash(key)
  except TypeError:
    return id(key)


def not_stored(fun, reason: str, detail: str) -> None:
  """A missed entry that was not stored: say why (explanations only)."""
  if explaining():
    _explain("closure-cache entry not stored for %s (%s): %s; later "
             "re-created closures of this code will miss again",
             location(fun), reason, detail)


def fallback(fun, code, reason: str, detail: str) -> None:
  if code is not None:
    _stats(code, fun).fallbacks[reason] += 1
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/fallback", reason=reason)
  if explaining():
    _explain("closure-cache fallback to stock jit for %s: %s",
             location(fun), explain.name_uncacheable(fun) or detail)


# -- enable() came late ------------------------------------------------------

def built_too_early(names: list) -> None:
  """At ``enable()``: stock jitted functions outside JAX that take
  functions statically and were built before it (never reached)."""
  if names and explaining():
    _explain("closure-cache: enable() came after these stock jitted "
             "functions that take functions as static arguments were "
             "built: %s; fresh functions passed to them compile on "
             "every call, as with stock (enable() before importing "
             "their modules, or set JAX_CLOSURE_CACHE=1)",
             ", ".join(names))


def explain_retrace(fun, key, old_avals, new_avals, old_static=None,
                    new_static=None) -> None:
  """A hit traced its shared function again: log what changed."""
  changes = explain.retrace_changes(fun, key, old_avals, new_avals,
                                    old_static, new_static)
  _explain("closure-cache retrace for %s: %s", location(fun),
           "; ".join(changes) or "argument types changed")


# -- recompile storms ----------------------------------------------------------

def _shortened(text: str, most: int = 60) -> str:
  """``text`` cut to ``most`` characters (a value's rendering may be
  megabytes: a closed-over ``bytes``)."""
  return text if len(text) <= most else text[:most - 3] + "..."


def _warn_storm(fun, code, s: CodeStats, keys: list, distinct: int) -> None:
  """Log once per user code object, as a record attributed to that code's
  file and line, naming the value that keeps changing. Logging, not
  ``warnings``: a storm is a performance note, and ``-W error`` suites must
  not fail on it."""
  changing = collections.defaultdict(set)
  for full_key in keys:   # (options, key), or (options, key, *context)
    for name, part in key_names.named_parts(fun, full_key[1]):
      try:
        changing[name].add(part)
      except TypeError:
        changing[name].add(id(part))
  culprits = sorted((n for n, parts in changing.items() if len(parts) > 1),
                    key=lambda n: -len(changing[n]))
  if culprits:
    name = culprits[0]
    examples = ", ".join(_shortened(key_names.render(p)[0])
                         for p in list(changing[name])[:3])
    what = f"{name} keeps changing ({examples}, ...)"
  else:
    what = "its closure keeps changing"
  advice = ("Pass that value as an argument, or make it a jax array so it "
            "is lifted instead of baked into each trace.")
  if culprits and key_names.is_binders_static_values(culprits[0], code):
    what = f"its static arguments keep changing ({examples}, ...)"
    advice = ("Each distinct static value is a trace of its own, as with "
              "stock; pass a value that changes as a dynamic argument.")
  message = (f"jax_closure_cache: {s.location} has met {distinct} "
             f"distinct closure keys (more than {_storm_threshold}); {what}, "
             "so each call traces again (tier A may still share the "
             f"executable). {advice}")
  filename = getattr(code, "co_filename", "?")
  lineno = getattr(code, "co_firstlineno", 0)
  if logger.isEnabledFor(logging.WARNING):
    record = logger.makeRecord(logger.name, logging.WARNING, filename, lineno,
                               message, (), None,
                               func=getattr(code, "co_name", None))
    logger.handle(record)
