"""Entries: one shared executable per closure key, and how it is made.

An ``Entry`` is a stock jitted *lifted* function -- ``lifted(leaves, *args,
**kwargs)``, which rebuilds the calling wrapper's function with the leaves in
the lifted positions (``key/rebuild.py``) or evaluates layer two's shared
jaxpr for it (``lookup/trace_lookup.call_shared``) -- plus its guards and the
weak anchors of its key. ``entries`` is the LRU store of them, keyed by
``(options key, closure key)``.

Invariants:
* An entry holds no lifted array and none of the user's functions: the
  objects its key names by identity are held weakly (``LRUStore.hold``), and
  their death drops the entry, so no id in a stored key is ever reused.
* The lifted function rebuilds the function its caller passes with the
  call (``Entry.caller``, set around each call of the entry and cleared
  after it), so nothing of a call outlives it. Two threads calling one
  entry at once may trace either caller's function: both matched the
  entry's key, so either traces what the shared executable computes.
* The first function object of a code is stock's (``first_object``, the
  closure cache module's rule);
  a code whose lifted trace failed where stock's did not is stock's from then
  on (``unliftable``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
import weakref

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache import cache
from jax_closure_cache import diagnostics
from jax_closure_cache import events
from jax_closure_cache import explain
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.key import closure
from jax_closure_cache.key import code_plan
from jax_closure_cache.key import guards as key_guards
from jax_closure_cache.key import rebuild
from jax_closure_cache.lookup import trace_lookup
from jax_closure_cache.lowering import structure as _structure

_JaxArray = _compat.jax.Array
_ArrayImpl = _compat.ArrayImpl
_WARN_BYTES = _lowering.WARN_BYTES

#: Whether stock's lowering of a new function object's call would warn of
#: an entry's captured constants now, as one expression over ``entry`` and
#: ``WARN_BYTES`` (off at -1 only, as stock's check is).
WARNED = ("(warn := WARN_BYTES.value) != -1"
          " and warn <= entry.constant_bytes")
#: Whether a stored entry (None: gone) may not answer a new function object
#: of its key now: it keeps guards (the slow path checks them), an argument
#: class its traces met reads otherwise, stock would warn (``WARNED``), or
#: stock reports per trace now (``_compat.lowering.STOCK_REPORTS``: NaN
#: checks, logged checkpoint residuals, raw keys warned of or refused), or
#: its traces were made under other PRNG options than those in force
#: (``Entry.prng``; read by identity: an equal value of another object
#: goes to the slow path, which compares).
#: The generated front inlines this text; ``refuses_new_object`` is compiled
#: from it for the wrapper's other paths, so the two cannot differ. It reads
#: the names in ``REFUSES_NEW_OBJECT_NAMES``.
REFUSES_NEW_OBJECT = ("entry is None or entry.guards or entry.classes is not"
                      " None and not entry.classes.holds() or " + WARNED
                      + " or " + _lowering.REPORTS_TEST +
                      " or PRNG_IMPL.value is not entry.prng[0]"
                      " or CUSTOM_PRNG.value is not entry.prng[1]")
REFUSES_NEW_OBJECT_NAMES = types.MappingProxyType({
    "WARN_BYTES": _WARN_BYTES, **_lowering.REPORTS_NAMES,
    "PRNG_IMPL": _lowering.PRNG_IMPL, "CUSTOM_PRNG": _lowering.CUSTOM_PRNG})
_warned = eval(compile(f"lambda entry: {WARNED}", __file__, "eval"),
               {"WARN_BYTES": _WARN_BYTES})
refuses_new_object = eval(
    compile(f"lambda entry: {REFUSES_NEW_OBJECT}", __file__, "eval"),
    dict(REFUSES_NEW_OBJECT_NAMES))

_NONE_YET = object()   # (Entry.forwarded_alike: no trace noted yet)
_PRNG_MIXED = (object(), object(), object())   # (Entry.prng: equal to none)
_VARIES = object()   # (Entry.forwarded_alike: signatures differ)

_STORE = cache.STORE
# (options key, closure key) -> Entry
entries = _STORE.bounded("entries.entries")
# The whole store, once: jax.clear_caches() empties it
_compat.register_cache(cache.jax_handle, "jax_closure_cache")
# Codes whose lifted trace failed (or leaked a tracer) where stock's did not.
unliftable: "weakref.WeakSet[types.CodeType]" = _STORE.table(
    "entries.unliftable", cache.Store.TRACES, weakref.WeakSet)


class StockAnswered(cache.Entry):
  """A key stock answers, for ``reason`` (``detail`` says why): its lifted
  trace adds a value computed from lifted arrays alone to one that may be
  all zeros, which XLA folds in stock's module only (``folds_zero``), or,
  traced with a new signature, has constants stock's eager primitive
  takes as operands (``operand_zero``)."""
  __slots__ = ("reason", "detail")

  def __init__(self, reason: str, detail: str):
    super().__init__()
    self.reason, self.detail = reason, detail


# Keys whose calls go to stock (bounded; an id reused by another object
# costs that object its sharing, never a result).
stock_answered = _STORE.bounded("entries.stock_answered",
                               counted="stock_answered")
class LeafReadsRead(cache.Entry):
  """Which of a key's lifted leaves stock's trace of its first meeting
  read by value (``structure.LeafReads``), so that its next meeting, whose
  leaves may hold zeros or ones, checks them before a lifted trace
  (``check_values``) as precisely as an entry's hit does."""
  __slots__ = ("reads",)

  def __init__(self, reads):
    super().__init__()
    self.reads = reads


# Keys met once -> what stock's trace of them read by value (bounded)
leaf_reads = _STORE.bounded("entries.leaf_reads", counted="leaf_reads")


# Codes a stock trace of which was one stock must answer (a runtime
# callable, a zero XLA folds: ``StockAnswered``): each new key of theirs has
# stock's trace of its first meeting read, so that its later objects go to
# stock without a lifted trace, whose trace-time effects (a write, a log
# line) stock's trace would make a second time.
stock_codes: "weakref.WeakSet[types.CodeType]" = _STORE.table(
    "entries.stock_codes", cache.Store.TRACES, weakref.WeakSet)
# The package's own closures made afresh for a user's function (never a
# user's long-lived object): they take the shared entry from their first call.
ALWAYS_SHARED: set[types.CodeType] = _STORE.table(
    "entries.always_shared", cache.Store.REGISTRY, set)


def first_object(fun, code: types.CodeType) -> bool:
  """Whether ``fun`` is the first function object of ``code`` (recording
  it if the code has none): stock's, every time it is traced (identity
  first). The closure cache module's one rule, which JAX's trace lookup
  applies to the same objects, so both modes agree."""
  return trace_lookup.closure_cache.first_object(fun, code)


def met_before(key) -> bool:
  """Whether ``key`` was met before (recording it): an entry is stored for
  a key met twice, so never-repeating keys keep only what stock keeps. The
  closure cache module's rule, as :func:`first_object`."""
  return trace_lookup.closure_cache.met_before(key)


def forget_met(key) -> None:
  """Forget that ``key`` was met (:func:`met_before`): a meeting stock
  answered with an error, whose trace could not be read."""
  trace_lookup.closure_cache.forget_met(key)


class JitWrapper:
  """What the package's jit wrappers have in common: ``_fun``, the callable
  they wrap (``ClosureJitted`` and its kinds derive from it)."""
  __slots__ = ()


def code_of(fun) -> types.CodeType | None:
  """The code object of a function, partial, bound method, callable object
  or one of the package's jit wrappers (None for anything else)."""
  while True:
    if isinstance(fun, types.FunctionType):
      return fun.__code__
    if isinstance(fun, functools.partial):
      fun = fun.func
    elif isinstance(fun, types.MethodType):
      fun = fun.__func__
    elif isinstance(fun, JitWrapper):
      fun = getattr(fun, "__wrapped__", None)   # the wrapped function
    else:
      method = closure.as_method(fun)   # a callable object's __call__
      if method is None:
        return None
      fun = method


@contextlib.contextmanager
def calling(entry, fun, walk=None):
  """While a slow path (a miss, a store, ``.lower``) calls ``entry``'s
  jitted function for ``fun``, with ``walk`` (the miss's own walk of
  ``fun``, for the trace to take instead of walking again). The generated
  hit and ``_call_entry`` set ``entry.caller`` inline, without this frame."""
  saved = entry.caller, entry.walk
  entry.caller, entry.walk = fun, walk
  try:
    yield
  finally:
    entry.caller, entry.walk = saved


class NoCaller(Exception):
  """A lifted function traced outside a wrapper's call of its entry (no
  ``Entry.caller``): the call is answered by stock."""


class CallerChanged(Exception):
  """A trace of an entry for a function object whose closure key is no
  longer the entry's: an object pinned to the entry at its first call,
  whose closure changed since (a ``nonlocal`` rebound), called with a new
  argument signature. Stock traces that signature over the object's
  state now; the entry's trace would be that state's computation stored
  under the earlier state's key. The call is answered by stock, and the
  object's row stays pinned (its earlier signatures keep their answers,
  as stock's cache keeps its earlier traces)."""


def caller_changed(error) -> bool:
  """Whether ``error`` is, or was raised from, :class:`CallerChanged`."""
  return _behind(error, CallerChanged) is not None


def _behind(error, cls):
  """The exception of class ``cls`` that ``error`` is or was raised from,
  if any (JAX may re-raise an exception from inside a trace with it as
  the cause)."""
  seen = 0
  while error is not None and seen < 8:
    if isinstance(error, cls):
      return error
    error = error.__cause__ or error.__context__
    seen += 1
  return None


def _caller_for_trace(e, lift_numpy):
  """The function whose call of entry ``e`` traces, and its walk (the
  miss's own, if it made one)."""
  current = None if e is None else e.caller
  if current is None:
    raise NoCaller("a shared lifted function traced outside a call")
  a = e.walk
  if a is not None:
    e.walk = None
    return current, a
  return current, closure.analyse(current, lift_numpy)


class Entry(cache.Entry):
  """One shared executable: a stock jitted lifted function and its guards."""
  __slots__ = ("jitted", "anchors", "guards", "traces", "checked", "record",
               "forwarded_alike", "closure_key",
               "avals", "static", "caller", "walk", "classes",
               "constant_bytes", "forwarded", "prng", "effects", "values",
               "value_masks",
               "_used", "_swept")

  def __init__(self):
    self.record = diagnostics.Record(0.0)   # hits; replaced when stored
    super().__init__()
    self.jitted = None
    # the closure key it is stored under: a trace for a caller whose key
    # is another now is refused (``CallerChanged``); None: not checked
    self.closure_key = None
    self.anchors: list = []
    self.guards: list = []
    self.traces = 0    # incremented inside every trace of the lifted function
    self.checked = 0   # value of ``traces`` when the guards were derived
    # whether the lifted function's latest trace made an effect no watch
    # sees (a warning: ``closure_cache.note_trace_effect``)
    self.effects = False
    self.avals: list = []   # the lifted leaves' types at the last trace
    self.static = None      # the arguments' static parts, described (explain)
    # The function a call of ``jitted`` is for, set by the wrapper around the
    # call and cleared after it (a trace rebuilds *this* object, so it reads
    # the caller's current objects, never a stale exemplar's); and the walk
    # a miss made of it, taken once by that trace.
    self.caller = None
    self.walk = None
    # the argument classes its traces met (a guard, once one met any),
    # checked by every hit of the entry (``classes_hold``)
    self.classes: key_guards.ArgumentClasses | None = None
    # the bytes stock's lowering of a call counts as captured constants
    # (the lifted leaves and the trace's own), below the warning threshold
    # when stored; a threshold lowered to them since makes a new object's
    # lowering warn, so the entry answers no new object (``warned``)
    self.constant_bytes = 0
    # per argument signature (``_compat.trace.call_signature``), the
    # outputs its trace returns as an argument was passed, ``(output index,
    # flat argument index)`` (``_compat.lowering.forwarded_inputs``): eager
    # control flow's stock returns the caller's own object there. None
    # while no trace forwarded any; a signature not in it forwards none.
    self.forwarded: dict | None = None
    # what every signature traced so far forwards, while they all agree
    # (a launch then reads no signature); _VARIES once two differ
    self.forwarded_alike = _NONE_YET
    # the PRNG options its traces were made under
    # (``_compat.lowering.prng_options``; ``_PRNG_MIXED`` once two traces
    # were made under different ones): a new object is answered only under
    # them, as JAX's trace context leaves them out
    self.prng = _lowering.prng_options()
    # which lifted leaves an operation XLA removes by their value reads
    # (x * 1, x + 0), over its traces (``structure.LeafReads``): a call
    # whose leaves stock's module bakes and folds by value is stock's
    # (``check_values``). None: nothing is checked (no leaves, or a
    # launcher, whose stock takes them as operands too).
    self.values = None
    # ``(values, structure.value_masks of them)`` for this key's leaves,
    # made at the first check after ``values`` changes, one object (a hit
    # reads it inline and uses it only while its ``values`` is the entry's)
    self.value_masks = None

  def note_values_read(self, reads) -> None:
    """At a trace whose stock bakes the lifted leaves: the leaves an
    operation XLA removes by their value reads (``constant_reads``),
    checked from now on."""
    read = _structure.LeafReads(reads.by_identity, reads.by_zero,
                                reads.partly, reads.by_uniform)
    self.values = read if self.values is None else self.values.merged(read)

  def warned(self) -> bool:
    """Whether stock's lowering of a new object's call would warn of its
    captured constants now (``jax_captured_constants_warn_bytes`` lowered
    to this entry's since it was stored): then no new object gets it
    (``WARNED``)."""
    return _warned(self)

  def note_trace(self, jaxpr, lifted: int, args, kwargs) -> None:
    """At a trace of this call's signature, its jaxpr (whose first
    ``lifted`` inputs are the lifted leaves): which outputs it returns as
    an argument was passed, and whether it was made under the PRNG options
    of the entry's first."""
    if self.prng != _lowering.prng_options():
      self.prng = _PRNG_MIXED
    found = _lowering.forwarded_inputs(jaxpr, lifted)
    if self.forwarded_alike is _NONE_YET:
      self.forwarded_alike = found
    elif self.forwarded_alike != found:
      self.forwarded_alike = _VARIES
    if found is None and self.forwarded is None:
      return   # (the common case: no trace of it forwards anything)
    try:
      signature = _compat.trace.call_signature(args, kwargs)
      hash(signature)
    except Exception:   # unhashable node data: this signature forwards none
      self.forwarded_alike = _VARIES
      return
    if found is not None:
      if self.forwarded is None:
        self.forwarded = {}
      self.forwarded[signature] = found
    else:
      self.forwarded.pop(signature, None)

  def forwarded_for(self, args, kwargs) -> tuple | None:
    """The outputs the trace of this call's signature returned as an
    argument was passed (``note_trace``), or None."""
    if self.forwarded is None:
      return None
    if self.forwarded_alike is not _VARIES:
      return self.forwarded_alike   # (every signature forwards the same)
    try:
      return self.forwarded.get(_compat.trace.call_signature(args, kwargs))
    except Exception:   # node data unhashable or failing ==: never recorded
      return None

  def note_argument_classes(self, args, kwargs) -> None:
    """At a trace: the user's classes among the arguments' pytree nodes,
    and what the trace can read of them, guarded from now on."""
    classes = closure.argument_classes(
        _compat.jax.tree_util.tree_structure((args, kwargs)))
    if not classes:
      return
    if self.classes is None:
      self.classes = key_guards.ArgumentClasses()
    self.classes.note(classes)

  def classes_hold(self) -> bool:
    """Whether the argument classes its traces met read as then (a hit's
    check beside ``guards``, cheap for a plain NamedTuple)."""
    return self.classes is None or self.classes.holds()

  # The second-chance bit of cache.LRUStore, which the fast front does not
  # set: it counts its hits on the record, and a count moved since the last
  # sweep reads as set.
  @property
  def used(self) -> bool:
    return self._used or self.record.front != self._swept

  @used.setter
  def used(self, value: bool) -> None:
    self._used = value
    if not value:
      self._swept = self.record.front


class LiftedValueRefused(Exception):
  """This call's lifted leaves hold a value stock's module folds, which the
  entry's executable takes as an argument (``structure.lifted_refusal``):
  the call is answered by stock."""


def check_values(entry, leaves) -> None:
  """Raise :class:`LiftedValueRefused` where ``leaves`` hold a value
  stock's module would fold by (a -0.0, a NaN, a subnormal, a boolean;
  zeros, or 1, -1 or an infinity, where the entry's traces read them so
  (``structure.lifted_refusal``). The hit's first step, for an entry whose
  ``values`` is not None (``generated.CALL``, which passes the leaves it
  knows to be ordinary inline and calls this for the rest)."""
  values, kept = entry.values, entry.value_masks
  if kept is None or kept[0] is not values or len(kept[1]) != len(leaves):
    kept = entry.value_masks = (values, _structure.value_masks(
        values, len(leaves)))
  reason = _structure.lifted_refusal(leaves, values, kept[1])
  if reason is not None:
    raise LiftedValueRefused(
        f"{reason}; the closure's array is an argument of the shared "
        "executable, a constant of stock's")


def guarded_leaves(leaves):
  """``leaves`` for a call of an entry: as they are, unless a transfer
  guard is in force and one of them is a host array (a lifted NumPy
  array); then those are put on the device first, under the package's own
  ``transfers_allowed``, as stock's compile puts the constant it bakes:
  the call then makes no transfer (logged or refused by the guard) that
  stock's does not. The generic hit and ``_call_entry`` read their leaves
  through it; a generated front's leaves are jax arrays by construction
  (its matchers take nothing else)."""
  for x in leaves:   # (the guards' states are read only for a host leaf)
    if type(x) is not _ArrayImpl:
      break
  else:
    return leaves
  if (all(isinstance(x, _JaxArray) for x in leaves)
      or not _lowering.transfers_guarded()):
    return leaves
  with _lowering.transfers_allowed():
    return [x if isinstance(x, _JaxArray) else _compat.jax.device_put(x)
            for x in leaves]


def library_object(obj) -> bool:
  """An instance of a JAX, NumPy or standard-library class that is not an
  array (a ``jax.default_matmul_precision`` decorator's state, reached
  through the decorated function's closure): library code's own object,
  held as module globals are; it holds none of the user's data."""
  t = type(obj)
  return (not isinstance(obj, (_JaxArray, np.ndarray))
          and code_plan.stable_module(getattr(t, "__module__", None)))


class _SourceStub:
  """What ``jax`` reads for source info (``__code__``, ``__name__``) without
  holding the user's function, whose closure holds arrays."""
  __slots__ = ("__code__", "__name__")

  def __init__(self, code, name):
    self.__code__ = code
    self.__name__ = name


class Presented:
  """A traced function presented as another (``fun``), with ``signature``:
  a static-argument binder traced under the user's name, source line and
  argument names, as stock's jit of the user's function is."""
  __slots__ = ("fun", "__signature__", "__name__", "__qualname__")

  def __init__(self, fun, signature):
    self.fun, self.__signature__ = fun, signature
    self.__name__ = _compat.wrapped_name(fun)   # as stock's jit names it
    self.__qualname__ = getattr(fun, "__qualname__", self.__name__)

  def __call__(self, *args, **kwargs):   # never called: inspect needs it
    raise TypeError("a Presented function is never called")


def _lifted_signature(fun) -> inspect.Signature:
  leaves = inspect.Parameter("__closure_cache_leaves__",
                             inspect.Parameter.POSITIONAL_ONLY)
  try:
    sig = inspect.signature(fun)
  except (TypeError, ValueError):
    return inspect.Signature([
        leaves,
        inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
        inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
  # JAX reads the signature for argument names and static_argnames; the
  # default values themselves (arrays, for ``def f(x, w=w)``) must not be
  # held by the shared entry, so each becomes a placeholder.
  params = [p if p.default is p.empty else p.replace(default=_DEFAULT)
            for p in sig.parameters.values()]
  return sig.replace(parameters=[leaves, *params])


class _Default:
  __slots__ = ()

  def __repr__(self):
    return "<default>"


_DEFAULT = _Default()


def shares_traces(options: dict) -> bool:
  """Whether an entry's traces are the trace lookup's too (read from its
  store, published to it: ``trace_lookup.call_shared`` and ``publish``).
  Not with static arguments (passed as they are, so pjit's signature for
  the user's function differs)."""
  return not jit_options.has_static_arguments(options)


_UnwatchedEffects = trace_lookup.closure_cache.UnwatchedEffects


def make_lifted_jit(fun, code, entry: Entry, options: dict, lift_numpy: bool,
                    n_args: int):
  """Stock ``jax.jit`` of a function that takes the lifted leaves first."""
  entry_ref = weakref.ref(entry)

  def lifted(leaves, /, *args, **kwargs):
    e = entry_ref()
    current, a = _caller_for_trace(e, lift_numpy)
    if len(a.leaves) != len(leaves):
      raise AssertionError("closure layout changed between key and trace")
    if e is not None and e.closure_key is not None and a.key != e.closure_key:
      raise CallerChanged("the calling function's closure changed since its "
                          "first call was answered by this entry")
    if e is not None:
      avals = [getattr(x, "aval", None) for x in leaves]
      static = e.static
      if diagnostics.explaining():
        # the arguments' static parts, described (never held: they may hold
        # the user's functions)
        static = explain.describe_static_parts((args, kwargs))
      if e.traces:
        events.retrace(current, a.key, e.avals, avals, e.static, static)
      e.static = static
      e.avals = avals
      e.traces += 1
      e.note_argument_classes(args, kwargs)
    # The rebuilt function shares the user's cells and objects: a trace-time
    # side effect that stores a traced value there is undone; one that
    # writes to the rebuild's copy of a plain object, dict or list (which
    # stock's trace makes on the user's) is refused. Both are answered by
    # stock (the closure key's TracerLeak).
    if shares_traces(options):
      # the trace lookup's stored trace of this key, if any
      out = trace_lookup.call_shared(current, a, leaves, args, kwargs)
      if out is not None:
        if e is not None:
          e.effects = False
        return out
    effects = _UnwatchedEffects()
    out = rebuild.call_lifted(current, a.key, leaves, args, kwargs)
    if e is not None:
      e.effects = effects.made()
    return out

  trace_lookup.own_code(lifted.__code__)
  name = _compat.wrapped_name(fun)   # as stock's jit names it (fun_name)
  lifted.__name__ = name
  lifted.__qualname__ = getattr(fun, "__qualname__", name)
  lifted.__signature__ = _lifted_signature(fun)
  if code is not None:
    lifted.__wrapped__ = _SourceStub(code, name)
  jitted = _compat.STOCK_JIT(lifted, **jit_options.lifted_options(options,
                                                                  n_args))
  return _DonationChecked(jitted) if jit_options.donates(options) else jitted


#: Why a donating call whose arguments include a lifted leaf is stock's.
DONATES_A_LEAF = (
    "an argument of this donating call is an array its closure holds too: "
    "XLA refuses to donate a buffer the same call also reads (and logs the "
    "refusal), where stock's module bakes the closed-over array")


class DonatesALeaf(Exception):
  """A donating entry called with one of its lifted leaves among the
  arguments (:data:`DONATES_A_LEAF`): the call is answered by stock."""


def donated_leaf(leaves, args, kwargs) -> bool:
  """Whether an argument of a call (any leaf: donated or not, a call is
  answered by stock either way) is one of the lifted ``leaves``."""
  try:
    lifted = {id(x) for x in _compat.jax.tree_util.tree_leaves(leaves)}
    return bool(lifted) and any(
        id(x) in lifted
        for x in _compat.jax.tree_util.tree_leaves((args, kwargs)))
  except Exception:   # a flatten that fails: the call's own error
    return False


class _DonationChecked:
  """A donating entry's jitted function, called only where no argument is
  one of the lifted leaves passed with it (else :class:`DonatesALeaf`,
  raised before XLA sees the call); its other attributes are the jitted
  function's (``trace``, ``lower``)."""
  __slots__ = ("_jitted",)

  def __init__(self, jitted):
    self._jitted = jitted

  def __call__(self, leaves, *args, **kwargs):
    if donated_leaf(leaves, args, kwargs):
      raise DonatesALeaf(DONATES_A_LEAF)
    return self._jitted(leaves, *args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._jitted, name)


def tracer_leak(error):
  """The closure key's ``TracerLeak`` behind ``error``, if any."""
  return _behind(error, trace_lookup.closure_cache.TracerLeak)


