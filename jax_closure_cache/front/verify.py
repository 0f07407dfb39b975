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
_checked = weakref.WeakKeyDictionary()


def _signature(args, kwargs):
  leaves, tree = _compat.jax.tree_util.tree_flatten((args, kwargs))
  return tree, tuple(_compat.trace.typeof(x) for x in leaves)


def checked(w, f, key, entry, leaves, args, kwargs, result):
  """``result`` of a hit of ``entry`` for ``f`` if stock's trace of ``f``
  is the computation the hit ran; else stock's own answer. Each function
  object is checked once per argument signature, as stock traces it."""
  try:
    sig = _signature(args, kwargs)
    seen = _checked.setdefault(f, set())
    if sig in seen:
      return result
    seen.add(sig)
  except TypeError:   # unhashable or not weakly referable: check every call
    pass
  with _compat.oracle_muted():
    try:
      stock = _compat.trace.stock_trace(f, args, kwargs)
    except Exception as e:   # stock's trace raises where the hit answered
      return _mismatch(w, f, key, args, kwargs,
                       f"stock's trace raises {type(e).__name__}: {e}")
    try:
      with entries.calling(entry, f):
        hit = entry.jitted.trace(leaves, *args, **kwargs).jaxpr
    except Exception as e:
      return _mismatch(w, f, key, args, kwargs,
                       f"the hit's trace raises {type(e).__name__}: {e}")
  flat = _compat.jax.tree_util.tree_leaves(list(leaves))
  diff = compare.first_difference(stock, hit, flat)
  if diff is not None:
    return _mismatch(w, f, key, args, kwargs, diff)
  cache.count_verified(True)
  return result


def _mismatch(w, f, key, args, kwargs, diff: str):
  cache.count_verified(False)
  entries.entries.discard(key)
  logger.warning(
      "jax_closure_cache: verify mismatch for %s: the closure key %s "
      "should have differed; %s. Stock's answer is returned.",
      getattr(f, "__qualname__", f), _key_text(key), diff)
  w._own()
  with trace_lookup.unshared():
    return w.stock()(*args, **kwargs)


def _key_text(key) -> str:
  text = repr(key[1]) if isinstance(key, tuple) and len(key) > 1 else repr(key)
  return text if len(text) <= 200 else text[:197] + "..."
