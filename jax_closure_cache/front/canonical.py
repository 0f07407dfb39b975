"""Canonical stock objects for closure-free functions.

A function with no closure whose globals (and its module-level helpers'
globals) hold no array needs nothing lifted: from its key's second
meeting, every re-creation of it gets the very same stock jitted object,
so its calls cost exactly stock's.

Invariants: the object is stock's own ``jax.jit`` of the function object
that met its key second (or of a private copy, when that object already
backs an entry whose globals changed since); a key met once is the jit
wrapper's (stock's own object), so keys that never repeat (a global
changing each step) keep no stock object and no executable; a key that
needs lifting or reads an object by identity is not canonicalised (the jit
wrapper takes it); entries hold their anchors weakly.
"""

from __future__ import annotations

import types
import weakref

from jax_closure_cache import _compat
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache import cache
from jax_closure_cache import diagnostics
from jax_closure_cache import events
from jax_closure_cache.front import entries
from jax_closure_cache.front import identity
from jax_closure_cache.front import inline
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.front import verify
from jax_closure_cache.front import wrapper
from jax_closure_cache.key import closure
from jax_closure_cache.key import parts as key_parts
from jax_closure_cache.key import rebuild
from jax_closure_cache.key.closure import Uncacheable
from jax_closure_cache.lookup import closure_cache

# (options key, function key) -> Canonical
_store = cache.STORE.bounded("canonical.store")


class Canonical(cache.Entry):
  """A canonical stock jitted object and the anchors of its key;
  ``warn_bytes``: ``jax_captured_constants_warn_bytes`` when it was made
  (stock's lowering of each new object warns or not by the threshold in
  force, so an object made under another answers no new function);
  ``prng``: the PRNG options then (``_compat.lowering.prng_options``:
  stock's object, called again, answers from a trace made under them,
  where a new object traces under those in force)."""
  __slots__ = ("jitted", "anchors", "record", "warn_bytes", "prng")

  def __init__(self, jitted, anchors, record):
    super().__init__()
    self.jitted = jitted
    self.anchors = anchors
    self.record = record
    self.warn_bytes = _WARN_BYTES.value
    self.prng = _lowering.prng_options()

  def answers_new_objects(self) -> bool:
    """Whether it answers a new function object of its key now: made under
    the captured-constants threshold and the PRNG options in force, while
    stock's trace or first run of a new object reports nothing a shared
    object's does not (``_compat.lowering.STOCK_REPORTS``)."""
    return (self.warn_bytes == _WARN_BYTES.value
            and self.prng == _lowering.prng_options()
            and _lowering.stock_reports() is None)


_WARN_BYTES = _lowering.WARN_BYTES


_functions: "weakref.WeakSet[types.FunctionType]" = cache.STORE.table(
    "canonical.functions", cache.Store.TRACES, weakref.WeakSet)

# Codes whose key needed lifting or held an object by identity when last
# analysed here: their objects are the jit wrapper's (``entrance.jit``
# makes it at once), without a canonical analysis per ``jit()``, which
# costs as much as a hit. The wrapper's path is the general one, sound for
# any function; a code whose globals later need no lifting stays on it
# (slower than a canonical object, never otherwise).
lifting_codes: "weakref.WeakSet[types.CodeType]" = cache.STORE.table(
    "canonical.lifting", cache.Store.TRACES, weakref.WeakSet)


# (_known: the object has an identity row, which the jit wrapper answers)
_BY_ROW = object()


def _known(fun, full_options_key):
  """The stock object ``fun`` had before (identity first), :data:`_BY_ROW`
  where it has a row without a live stock object (pinned to an entry, or
  stock's whose object died: the wrapper's ``_call_row`` answers it, as
  its first call decided), or the object its key's inline matcher finds;
  None otherwise."""
  row = identity.row_of(fun, full_options_key)
  if row is not None:
    if type(row) is identity.OWNED:
      owned = row()
      if owned is not None:
        return owned
    return _BY_ROW
  if _traced_apart(fun.__code__):
    return None
  for q in inline.canonical_quick.get(fun.__code__, ()):
    if q.options_key == full_options_key and q.match(fun) is not None:
      found = q.entry()
      if found is not None and found.answers_new_objects():
        found.used = True
        events.hit(found.record)
        identity.remember(identity.table(full_options_key), fun,
                          identity.ref(found.jitted))
        return found.jitted
  return None


def _traced_apart(code) -> bool:
  """Whether each object of ``code`` is traced by its own stock object
  (``closure_cache.TracedApart`` lists the reasons)."""
  return code in closure_cache.traced_apart


def canonical_jitted(fun: types.FunctionType, options: dict,
                     options_key: tuple, lift_numpy: bool):
  """The shared stock jitted object for ``fun``, or None if it needs lifting
  or does not wear ``fun``'s face (in verify mode, another object's is
  seen through ``verify.CheckedCanonical``, which checks each call)."""
  jitted = _canonical_jitted(fun, options, options_key, lift_numpy)
  if jitted is not None and not wrapper.Face.of(fun).shown_by(jitted):
    return None   # a renamed function: the jit wrapper gives stock's own
  if (jitted is not None and cache.verifying()
      and getattr(jitted, "__wrapped__", fun) is not fun):
    return verify.CheckedCanonical(fun, jitted)
  return jitted


def _canonical_jitted(fun, options, options_key, lift_numpy):
  if jit_options.donates(options):
    # XLA warns of unusable donated buffers at every compile, which stock
    # makes per function object: the jit wrapper sees the warning and
    # shares no entry that warned.
    return None
  full_options_key = (options_key, lift_numpy)
  known = _known(fun, full_options_key)
  if known is _BY_ROW:
    return None
  if known is not None:
    return known
  if _lowering.stock_reports() is not None:
    # a new object's stock trace reports (Canonical.answers_new_objects)
    return None
  code = fun.__code__
  if _traced_apart(code):
    return None
  try:
    a = closure.analyse(fun, lift_numpy)
  except (Uncacheable, TypeError):   # (a TypeError: unhashable metadata,
    return None   # or a user object's hook answering the walk oddly)
  # Lifting needed; an object kept by identity, whose contents the key does
  # not cover (module-level helpers are walked, so only objects are roots);
  # or an array a shared object would keep alive.
  if (a.leaves or a.roots
      or any(isinstance(x, _compat.jax.Array) for x in a.anchors)):
    lifting_codes.add(code)
    return None
  baked = key_parts.baked_numpy(a.key)
  if _lowering.captured_constants_warning(
      nbytes=key_parts.numpy_bytes(baked)) is not None:
    # stock's lowering of each new object warns of its captured constants
    return None
  if any(_compat.converted_by_x64(n.dtype) for n in baked):
    # its trace would hold JAX's memoized conversion of the array, which a
    # stock trace of the array under the other x64 setting then reads
    # (``_compat.converted_by_x64``): only the user's objects may hold it
    return None
  # (the threshold and PRNG options in force: stock warns of each new
  # object's constants by the one, and traces ``jax.random`` under the
  # others, so an object made under others is not this key's)
  key = (full_options_key, a.key, _WARN_BYTES.value, _lowering.prng_options())
  try:
    found = _store.get(key)
  except TypeError:
    return None
  if found is None and not entries.met_before(("canonical", key)):
    # A key met once is stock's, through the jit wrapper: a canonical
    # object kept for it would keep its executable alive after the user's
    # functions die (a global changing each step makes a key per step).
    return None
  if found is None:
    # Stock caches are keyed on the function object, so a function object
    # that already backs an entry (its globals changed since) gets a private
    # copy; otherwise the user's own function, as stock would hold it.
    own = fun not in _functions
    _functions.add(fun)
    jitted = _compat.STOCK_JIT(fun if own else _copy_function(fun), **options)
    # Its compile happens at its first call, inside stock: cost unknown here.
    found = Canonical(jitted, [], events.miss(fun, code, key, 0.0))
    diagnostics.measure_later(found.record)   # stock compiles at its first call
    refused = _store.keep(key, found, a.anchors, keep=entries.library_object)
    if refused is not None:
      events.not_stored(fun, "unweakrefable_anchor", refused)
  else:
    events.hit(found.record)
  # The inline cache skips the helper scan, so only functions that read no
  # module-level helper take it.
  if not a.roots and len(inline.canonical_quick.get(code, ())) < inline.PER_CODE:
    inline.remember(inline.canonical_quick, fun, key, found)
  identity.remember(identity.table(full_options_key), fun,
                          identity.ref(found.jitted))
  return found.jitted


def _copy_function(f: types.FunctionType) -> types.FunctionType:
  g = types.FunctionType(f.__code__, f.__globals__, f.__name__,
                         f.__defaults__, f.__closure__)
  g.__kwdefaults__ = f.__kwdefaults__
  rebuild.Rebuild.copy_metadata(f, g)
  return g


