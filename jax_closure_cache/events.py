"""What happened to a call, counted and explained by one call each.

Each outcome of the cached path is one function here: it moves the counter
``stats()`` reads (``cache``) and records, explains and reports it
(``diagnostics``: per-location records, the explanation log under
``JAX_CLOSURE_CACHE_EXPLAIN``, ``jax.monitoring`` events). Callers never
touch the counters or the explanations of these outcomes themselves.

| outcome | ``stats()`` | log / monitoring |
|---|---|---|
| ``hit`` | ``hits`` | ``/jax_closure_cache/hit`` |
| ``miss`` | ``misses`` | miss explanation, storm warning, ``/jax_closure_cache/miss`` |
| ``fallback`` | ``fallbacks``, ``fallback_reasons`` | fallback explanation, ``/jax_closure_cache/fallback`` |
| ``not_stored`` | ``not_stored`` | "entry not stored" explanation |
| ``retrace`` | ``retraces`` | retrace explanation |

The fast front's generated hit (``front/generated.py``) is the one
exception: it counts on the entry's record, which ``stats()`` adds
(``cache.STORE.count_hits``), because a call here would cost a frame.

Invariants: ``stats()`` and the log cannot disagree about an outcome, since
one call does both; an outcome with a reason is counted under that reason
even when explanations are off.
"""

from __future__ import annotations

from jax_closure_cache import cache
from jax_closure_cache import diagnostics

_counters = cache.counters


def hit(record: diagnostics.Record) -> None:
  """A call answered by a stored entry."""
  next(_counters.hits)
  diagnostics.hit(record)


def miss(fun, code, full_key, cost: float,
         first_object: bool = False) -> diagnostics.Record:
  """A call that traced and compiled; returns the entry's record."""
  cache.count_miss()
  return diagnostics.miss(fun, code, full_key, cost, first_object)


def fallback(fun, code, reason: str, detail: str) -> None:
  """A call answered by stock jit, for ``reason``."""
  cache.count_fallback(reason)
  diagnostics.fallback(fun, code, reason, detail)


def met_once(fun, code, key, detail: str) -> None:
  """A call answered by stock because its key was met for the first time
  (counted as the fallback ``key_met_once``)."""
  cache.count_fallback("key_met_once")
  diagnostics.met_once(fun, code, key, detail)


def not_stored(fun, reason: str, detail: str) -> None:
  """A miss whose entry was answered but not stored, for ``reason``."""
  cache.count_not_stored(reason)
  diagnostics.not_stored(fun, reason, detail)


def retrace(fun, key, old_avals, new_avals, old_static, new_static) -> None:
  """A stored entry traced again (new argument types or static parts)."""
  cache.count_retrace()
  if diagnostics.explaining():
    diagnostics.explain_retrace(fun, key, old_avals, new_avals, old_static,
                                new_static)
