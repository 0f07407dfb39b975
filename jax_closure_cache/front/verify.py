"""Verify mode for the closure key's hits (tier B): every hit also traces
its function object as stock would, and compares.

A hit skips the trace: it calls the stored entry's lifted function with
this closure's leaves. :func:`checked` traces the function object itself
through JAX's own trace (``_compat.trace.stock_trace``: what ``jax.jit``
of it would trace now, with every trace-time side effect stock has), and
compares that jaxpr with the one the hit ran (``lowering.compare``), with
JAX's test counters muted (the oracle's work is not the cache's). On a
mismatch the entry is dropped, stock's own jit answers (its result, its
exception), the mismatch is counted in ``stats()["verify_mismatches"]``
and one log line names the key and the first differing equation.

Invariants: nothing here runs unless verify mode is on (the front is
generated without it otherwise); a matching hit returns the hit's own
result.
"""

from __future__ import annotations

import logging
import weakref

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache.lowering import compare
from jax_closure_cache.lookup import trace_lookup
from jax_closure_cache.front import entries

logger = logging.getLogger("jax_closure_cache")


#: Function object -> the argument signatures checked for it: stock traces
#: a function object once per signature, and so does the oracle.
_checked = cache.STORE.table("verify.checked", cache.Store.CALLS,
                             weakref.WeakKeyDictionary)


def _first_check(f, args, kwargs) -> bool:
  """Whether this is ``f``'s first check for this argument signature."""
  try:
    sig = _compat.trace.call_signature(args, kwargs)
    seen = _checked.setdefault(f, set())
  except TypeError:   # unhashable or not weakly referable: check every call
    return True
  if sig in seen:
    return False
  seen.add(sig)
  return True


#: The jit options that decide which arguments a trace takes.
_STATIC_OPTIONS = ("static_argnums", "static_argnames")


def _stock_jaxpr(f, args, kwargs, options: dict):
  """Stock's trace of ``f`` for this call: with static arguments, as stock
  ``jax.jit(f, static_argnums=..., static_argnames=...)`` traces it (never
  a shared trace); else through JAX's own trace cache. Traces made inside
  it (an eager loop's body) are stock's own too: a trace the lookup shares
  by closure key lifts closed-over arrays the body never reads."""
  static = {k: v for k, v in options.items() if k in _STATIC_OPTIONS and v}
  with trace_lookup.unshared():   # inner traces too (a loop's body)
    if static:
      return _compat.STOCK_JIT(f, **static).trace(*args, **kwargs).jaxpr
    return _compat.trace.stock_trace(f, args, kwargs)


def _difference(f, hit_trace, leaves, args, kwargs,
                options: dict | None = None) -> str | None:
  """Where the jaxpr ``hit_trace()`` gives differs from stock's trace of
  ``f`` (None: the same computation), JAX's test counters muted."""
  with _compat.oracle_muted():
    try:
      stock = _stock_jaxpr(f, args, kwargs, options or {})
    except Exception as e:   # stock's trace raises where the hit answered
      return f"stock's trace raises {type(e).__name__}: {e}"
    try:
      hit = hit_trace()
    except Exception as e:
      return f"the hit's trace raises {type(e).__name__}: {e}"
  return compare.first_difference(
      stock, hit, _compat.jax.tree_util.tree_leaves(list(leaves)))


def check_hit(f, key, entry, leaves, args, kwargs, options: dict) -> bool:
  """Whether a hit of ``entry`` for ``f`` ran the computation stock's trace
  of ``f`` is (True too where this function object and argument signature
  were checked before: stock traces each once). A mismatch is counted,
  logged and its entry dropped here; the wrapper then answers as stock
  (``MissStages._verified``)."""
  if not _first_check(f, args, kwargs):
    return True

  def hit_trace():
    with entries.calling(entry, f):
      return entry.jitted.trace(leaves, *args, **kwargs).jaxpr
  diff = _difference(f, hit_trace, leaves, args, kwargs, options)
  cache.count_verified(diff is None)
  if diff is not None:
    entries.entries.discard(key)
    _log_mismatch(f, f"the closure key {_key_text(key)}", diff)
  return diff is None


def check_shared_answer(traced, fun, in_avals, debug_info, context, answer):
  """Verify mode for the trace lookup: ``answer``, a trace shared by
  ``fun``'s key (no trace of ``fun`` itself), against stock's own trace
  of ``fun`` (``traced``, uncached: every trace-time side effect stock
  has). The answer where they compute the same; else stock's trace (or
  its exception), the mismatch counted and logged, and the code's later
  functions traced as usual (``closure_cache.unshared_codes``)."""
  with _compat.oracle_muted():
    try:
      stock = traced(fun, in_avals, debug_info, *context)
    except Exception as e:   # stock's trace raises where the answer did not
      _shared_mismatch(fun, f"stock's trace raises {type(e).__name__}: {e}")
      raise
  diff = compare.first_difference(stock[0], answer[0], [])
  if diff is None:
    cache.count_verified(True)
    return answer
  _shared_mismatch(fun, diff)
  return stock


def _shared_mismatch(fun, diff: str) -> None:
  cache.count_verified(False)
  code = trace_lookup.closure_cache.traced_code(fun)   # as the lookup files it
  if code is not None:
    trace_lookup.closure_cache.unshared_codes.add(code)
  _log_mismatch(fun, "a trace shared by its closure key", diff)


trace_lookup.closure_cache.shared_answer_checks.append(check_shared_answer)


class CheckedCanonical:
  """Verify mode's view of the canonical stock object another function
  object of ``fun``'s key owns (``front/canonical.py``): each call is
  checked as a hit, once per signature, against stock's trace of ``fun``."""

  def __init__(self, fun, jitted):
    self._fun, self._jitted = fun, jitted

  def __call__(self, *args, **kwargs):
    effects = _UnwatchedEffects()
    out = self._jitted(*args, **kwargs)
    f = self._fun
    if effects.made():
      # the call traced, making an effect no watch sees (a warning JAX
      # issues for a new signature), which stock's trace of ``f`` would
      # make once more: this object's own trace answered
      return out
    if not _first_check(f, args, kwargs):
      return out
    diff = _difference(f, lambda: self._jitted.trace(*args, **kwargs).jaxpr,
                       (), args, kwargs)
    cache.count_verified(diff is None)
    if diff is None:
      return out
    _log_mismatch(f, "a canonical stock object", diff)
    self._jitted = _compat.STOCK_JIT(f)
    with trace_lookup.unshared():
      return self._jitted(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted, name)


_UnwatchedEffects = trace_lookup.closure_cache.UnwatchedEffects


def _log_mismatch(f, what: str, diff: str) -> None:
  logger.warning(
      "jax_closure_cache: verify mismatch for %s: %s should have differed; "
      "%s. Stock's answer is returned.", getattr(f, "__qualname__", f),
      what, diff)


def _key_text(key) -> str:
  text = repr(key[1]) if isinstance(key, tuple) and len(key) > 1 else repr(key)
  return text if len(text) <= 200 else text[:197] + "..."
