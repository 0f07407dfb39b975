"""Eager ``jax.closure_convert`` with one trace per closure key.

Stock ``closure_convert(fun, *example_args)`` traces ``fun`` into a jaxpr and
returns a fresh ``converted_fun`` holding that jaxpr and the concrete arrays
``fun`` closed over. Called eagerly with a fresh ``fun`` (``odeint`` does this
for its vector field on every call), it traces every time, and the fresh
``converted_fun`` then misses every cache keyed on it: ``odeint`` passes it
as a static argument of a jitted wrapper.

Here, outside any trace, a function whose closure key (see
:mod:`jax_closure_cache.key.closure`) and argument signature were seen before
reuses one shared trace of its *lifted* form (the closed-over arrays as
leading arguments), and gets a small ``closure_converted`` closure over that
shared function and its own arrays. That closure's key is the same for every
re-creation, so the static-argument route
(:mod:`jax_closure_cache.front.static_args`) hits one executable.

Invariants:
* Identity first: the first function object of a code, and every object
  stock answered before, get stock's own result (and stock's own cache by
  identity); an object answered here keeps its first answer.
* An entry is stored only when its trace captured no array the key does not
  cover; the store holds the shared trace, never a lifted array, and drops
  the entry when an object the key names by identity dies.
* The result is stock's in form: ``(converted, [])`` (eagerly there is no
  tracer to hoist), and ``converted(*args)`` computes what ``fun(*args)``
  computes.
"""

from __future__ import annotations

import types
import weakref

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache.key import closure
from jax_closure_cache.key import guards as key_guards
from jax_closure_cache.front import entries
from jax_closure_cache.key import rebuild
from jax_closure_cache.lookup import closure_cache
from jax_closure_cache.lookup import trace_lookup
from jax_closure_cache import events
from jax_closure_cache.key.closure import Uncacheable

_stock_closure_convert = _compat.STOCK_CLOSURE_CONVERT

# (closure key, trace signature) -> _Shared
_traces = cache.STORE.bounded("convert.traces")


class _Shared(cache.Entry):
  """Stock's converted function of the lifted form, shared by every
  function object with an equal key."""
  __slots__ = ("converted", "anchors", "record")


# Function objects answered here: fun -> {trace signature: converted}; the
# value holds the function's own arrays, which the function holds too.
_answered: "weakref.WeakKeyDictionary" = cache.STORE.table(
    "convert.answered", cache.Store.TRACES, weakref.WeakKeyDictionary)
# Function objects answered by stock (identity first).
_stocks: "weakref.WeakSet" = cache.STORE.table(
    "convert.stocks", cache.Store.TRACES, weakref.WeakSet)


def _bind(shared, leaves):
  def closure_converted(*args_and_hoisted):
    return shared(leaves, *args_and_hoisted)
  return closure_converted


# Our own closures are never a user's long-lived object: the static-argument
# route treats them as re-created from their first one.
entries.ALWAYS_SHARED.add(_bind(None, ()).__code__)


def closure_convert(fun, *example_args):
  """``jax.closure_convert``; eagerly, one trace per closure key."""
  if (not _compat.trace_state_clean() or type(fun) is not types.FunctionType
      or fun in _stocks):
    return _stock_closure_convert(fun, *example_args)
  try:
    signature = _compat.trace_signature(example_args)
    hash(signature)
  except TypeError:
    return _stock_closure_convert(fun, *example_args)
  answered = _answered.get(fun)
  if answered is not None and signature in answered:
    return answered[signature], []
  if entries.first_object(fun, fun.__code__):
    # The first object of a code is stock's (a long-lived function keeps
    # stock's own trace and cache).
    _stocks.add(fun)
    return _stock_closure_convert(fun, *example_args)
  if fun.__code__ in entries.unliftable:
    return _to_stock(fun, example_args, "unliftable",
                     "an earlier lifted trace of this code failed or wrote "
                     "to state its function reaches, so stock traces it")
  refused = None
  try:
    a = closure.analyse(fun)
    # the argument classes' code reads what the class keys cover (the
    # signature holds the classes by identity)
    key = (a.key, signature, closure_cache.argument_classes_key(
        _compat.jax.tree_util.tree_structure(example_args)))
    shared = _traces.get(key)
  except Uncacheable as e:
    refused = e.reason, e.detail
  except TypeError as e:
    refused = "unhashable", str(e)
  if refused is not None:   # (outside the block: no chained refusal)
    return _to_stock(fun, example_args, *refused)
  if any(isinstance(x, _compat.jax.Array) for x in a.anchors):
    # a shared trace would bake it and keep it alive
    return _to_stock(fun, example_args, "array_by_identity",
                     "an array kept by identity would be baked into the "
                     "shared trace")
  if shared is None:
    shared = _trace(fun, a, key, example_args)
    if isinstance(shared, str):
      # (stock's own trace, where that trace's writes land, and every later
      # object of the code too: a lifted trace of it fails again)
      entries.unliftable.add(fun.__code__)
      return _to_stock(fun, example_args, "trace_error", shared)
  else:
    events.hit(shared.record)
  converted = _bind(shared.converted, tuple(a.leaves))
  _answered.setdefault(fun, {})[signature] = converted
  return converted, []


def _to_stock(fun, example_args, reason: str, detail: str):
  """Stock's ``closure_convert`` for ``fun`` from now on, counted and
  explained as a fallback."""
  _stocks.add(fun)
  events.fallback(fun, getattr(fun, "__code__", None), reason, detail)
  return _stock_closure_convert(fun, *example_args)


def _trace(fun, a, key, example_args):
  """Trace the lifted form of ``fun``; store it if its trace captured only
  what the key covers. Returns the shared entry, or a string saying why
  stock must answer."""
  holder = [fun]

  def lifted(leaves, *args):
    # as the front's lifted function: a trace that writes to the rebuild's
    # copy of what the closure reaches, or stores a traced value in the
    # user's, raises (stock's trace writes to the user's objects)
    return rebuild.call_lifted(holder[0], a.key, leaves, args, {})
  trace_lookup.own_code(lifted.__code__)

  try:
    converted, hoisted = _compat.closure_convert_uncached(
        lifted, (tuple(a.leaves), *example_args))
  except Exception as e:
    return f"tracing the lifted form failed: {e!r}"
  finally:
    holder.clear()   # the shared trace must not keep ``fun`` alive
  if hoisted:
    return "the lifted form still closes over traced values"
  shared = _Shared()
  shared.record = events.miss(fun, getattr(fun, "__code__", None), key, 0.0)
  shared.converted = converted
  try:
    after = closure.analyse(fun).key
  except (Uncacheable, TypeError):
    after = None
  if after != a.key:
    # the trace changed what the key covers (a write to a list it reads):
    # a later object's hit would skip the write stock's trace makes
    events.not_stored(fun, "wrote", "its trace changed what its closure "
                      "key covers, so a later object's trace is its own")
    return shared
  captured = _compat.closure_converted_constants(converted)
  guards = key_guards.find_guards(captured, [], {id(x) for x in a.anchors})
  if guards:   # an array the key does not cover: answer, do not store
    events.not_stored(fun, "untracked_capture",
                      getattr(guards, "detail", "closure_convert captured "
                              "an array the key does not cover"))
    return shared
  refused = _traces.keep(key, shared, a.anchors, keep=entries.library_object)
  if refused is not None:
    events.not_stored(fun, "unweakrefable_anchor", refused)
  return shared
