"""Traces shared by closure key (``closure_key.py``): a key's function, past
its code's first, is traced once with its arrays as arguments, and every
later one gets that ``Jaxpr`` closed over its own arrays.

Invariants: a code's first function object is traced as usual, every time
(:func:`first_object`); a trace that
captured what the key does not cover, failed, or stored a tracer in the
closure's state (undone) is not shared; the stored traces are one of the
store's bounded tables (``cache.LRUStore``), which holds the objects whose
ids are in a key weakly (``LRUStore.hold``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
import functools
import os
import sys
import threading
import types
import warnings
import weakref

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache._compat import trace as _trace
from jax_closure_cache._compat.trace import flat_trees as ft
from jax_closure_cache.key import closure
from jax_closure_cache.key import closure_key
from jax_closure_cache.key import trees
from jax_closure_cache.key import state_watch


TracerLeak = state_watch.TracerLeak
StateWatch = state_watch.StateWatch


# -- the closure-keyed trace lookup --------------------------------------------

class _Shared(cache.Entry):
  """A key's lifted trace, its answer if it lifts nothing, or why it failed;
  ``nbytes``: what it keeps alive of its constants, nested jaxprs'
  included (the store's bound)."""
  jaxpr = out_avals = answer = failed = None
  consts, anchors = (), ()

  def __init__(self, **fields):
    super().__init__()
    for name, value in fields.items():   # (``nbytes`` is the base's slot)
      setattr(self, name, value)


_STORE = cache.STORE
# (rebuild rules, closure key, leaf types, signature) -> _Shared; its length
# is counted, never iterated here
traces = _STORE.bounded("closure_cache.traces", counted="shared_traces")
# what first_object and met_before record, taken together
_records_lock = threading.Lock()
# closed jaxpr -> the shared one (weakly: as long as JAX holds the jaxpr)
_closings = _STORE.table("closure_cache.closings", cache.Store.FACTS,
                         weakref.WeakKeyDictionary)
# of the lifted functions traced here, never keyed
own_codes: set = _STORE.table("closure_cache.own_codes", cache.Store.FACTS, set)
# each code's first function, weakly (emptied with ``traces``)
_first = _STORE.table("closure_cache.first", cache.Store.TRACES,
                      weakref.WeakKeyDictionary)
# hashes of keys met, oldest first: no trace stored before (emptied with
# ``traces``)
_met: dict = _STORE.table("closure_cache.met", cache.Store.TRACES)
# function object -> the closure key its last looked-up trace read (weakly)
_answered_keys = _STORE.table("closure_cache.answered_keys", cache.Store.TRACES,
                              weakref.WeakKeyDictionary)
class TracedApart:
  """Codes each object of which is traced by its own stock object (no
  shared stock object of theirs is handed out, ``front/canonical.py``),
  each with why (:attr:`REASONS`, one or more)."""

  #: ``wrote``: a trace wrote to state its function reaches (an attribute
  #: of a global object set, a list appended to), which a shared object's
  #: later calls would skip; ``callable``: a stock trace held a user's
  #: callable JAX runs after the trace (a callback, a custom rule:
  #: ``runtime_callable``), whose cached trace would run the first
  #: object's callable (its log, its state, its static arguments) for
  #: later objects, and JAX memoizes a transformation of the trace by the
  #: jaxpr object, so a rule (a ``custom_vjp``'s ``bwd``, even a
  #: module-level one) would run once where stock runs it for every
  #: object; ``argument_node_data``: traced with arguments whose pytree node
  #: data JAX's caches compare by ``==`` (``trees.conflated_node_data``),
  #: so its cache would answer one call from another's trace;
  #: ``argument_class``: traced with arguments of the user's pytree classes
  #: (``argument_classes_key``), which its cache keys by identity, so it
  #: would answer a call after the class's code reads other values from an
  #: earlier trace.
  #: ``output_node_data``: a trace's outputs' pytree nodes held the trace's
  #: own objects (``trees.output_node_data``), which a shared object's
  #: cache would hand to later objects' callers.
  #: ``raised``: a stock trace raised, so the object's stock cache holds
  #: no trace of the state its key was taken in, and its next call traces
  #: whatever state it meets then (a global rebound after the error): a
  #: shared object would answer later objects of the first state from it.
  REASONS = ("wrote", "callable", "argument_node_data", "argument_class",
             "output_node_data", "raised")

  def __init__(self):
    self._why: "weakref.WeakKeyDictionary[types.CodeType, frozenset]" = (
        _STORE.table("closure_cache.traced_apart", cache.Store.TRACES,
                     weakref.WeakKeyDictionary))

  def note(self, code: types.CodeType, reason: str) -> None:
    assert reason in self.REASONS, reason
    self._why[code] = self._why.get(code, frozenset()) | {reason}

  def __contains__(self, code) -> bool:
    return code in self._why

  def why(self, code) -> frozenset:
    """The reasons ``code`` is traced apart (empty: it is not)."""
    return self._why.get(code, frozenset())


traced_apart = TracedApart()

#: Codes whose functions are traced as usual from now on, never answered by
#: a shared trace: verify mode found an answer of theirs that was not
#: stock's (here or at the front's hit).
unshared_codes: "weakref.WeakSet[types.CodeType]" = _STORE.table(
    "closure_cache.unshared_codes", cache.Store.TRACES, weakref.WeakSet)
#: Verify mode's check of a shared answer, set by the front (which owns the
#: oracle): ``check(traced, fun, in_avals, debug_info, context, answer)``
#: gives the answer to use (stock's own trace on a mismatch).
shared_answer_checks: list = _STORE.table(
    "closure_cache.shared_answer_checks", cache.Store.REGISTRY, list)


def is_shared(closed_jaxpr: _trace.ClosedJaxpr) -> bool:
  """Whether ``closed_jaxpr``'s constants are a shared jaxpr's arguments."""
  return shared_jaxpr(closed_jaxpr) is not None


def shared_jaxpr(closed_jaxpr: _trace.ClosedJaxpr) -> _trace.Jaxpr | None:
  """The jaxpr that ``closed_jaxpr`` closes, shared by its key's closures."""
  return _closings.get(closed_jaxpr)


def trace_to_jaxpr(traced: Callable, fun: Callable, in_avals, debug_info,
                   *context_for_cache_key, **options):
  """``traced(fun, ...)`` (uncached), or ``fun``'s key's shared trace."""
  if (options or type(fun) not in (types.FunctionType, functools.partial)
      or getattr(fun, "__code__", None) in own_codes
      or (type(fun) is types.FunctionType and fun.__closure__ is None
          and closure_key.active_rules[0].stable(fun))):
    return traced(fun, in_avals, debug_info, *context_for_cache_key, **options)
  if (_lowering.transfers_guarded()   # a shared trace's arrays are
      # arguments: transfers stock never makes
      or _lowering.reports_per_trace()   # each trace reports for itself
      or traced_code(fun) in unshared_codes):
    _note_class_arguments(fun, _trace.tree_of(in_avals))
    return _noting_callables(fun, traced(fun, in_avals, debug_info,
                                         *context_for_cache_key))
  try:
    sig = signature(in_avals, debug_info, context_for_cache_key)
  except (closure_key.Unkeyable, _trace.UnknownStatics, TypeError) as e:
    reason = getattr(e, "reason", None)
    if reason in ("argument_node_data", "argument_class"):
      code = traced_code(fun)
      if code is not None:
        traced_apart.note(code, reason)
    sig = None
  if sig is None:   # (traced outside the block: an error of the user's
    # trace carries no refusal of ours as its context)
    return _noting_callables(fun, traced(fun, in_avals, debug_info,
                                         *context_for_cache_key))
  if sig[-1]:   # the user's classes among the arguments
    _note_class_arguments(fun, _trace.tree_of(in_avals))
  answer, share, stored = _lookup(traced, fun, in_avals, debug_info,
                                  context_for_cache_key, sig)
  if stored and shared_answer_checks and cache.verifying():
    # verify mode: a stored answer skips stock's trace of ``fun`` (one
    # traced lifted just now ran its body: it is this call's trace)
    answer = shared_answer_checks[0](traced, fun, in_avals, debug_info,
                                     context_for_cache_key, answer)
  _compat.monitoring_module.record_event("/jax/closure_cache/miss" if answer is None
                          else "/jax/closure_cache/hit")
  if answer is None:
    # every trace of a user's function is watched: a code whose trace
    # wrote is remembered (JAX's cache of this object may answer its next
    # trace without running it: ``note_cached_answer``)
    watch = StateWatch(fun)
    effects = UnwatchedEffects()
    try:
      with watching():
        answer = traced(fun, in_avals, debug_info, *context_for_cache_key)
    except BaseException:
      code = traced_code(fun)
      if code is not None:
        traced_apart.note(code, "raised")
      raise
    # a write is not shared, nor its code's canonical object: one to what
    # the watch sees, or to anything else the key covers (a class attribute
    # a property's getter counts its reads in), or one an inner trace
    # answered from JAX's cache skipped
    if (watch.changes() or effects.made()
        or share is not None and not unchanged_by_trace(fun, share[0])):
      code = traced_code(fun)
      if code is not None:
        traced_apart.note(code, "wrote")
    elif share is not None:
      _share_answer(*share, answer)
    _noting_callables(fun, answer)
  return answer


def _note_class_arguments(fun, tree) -> None:
  """``fun``'s code noted as traced apart (:data:`traced_apart`) where
  ``tree`` (its arguments') has a node of the user's class."""
  if tree is not None and closure.argument_classes(tree):
    code = traced_code(fun)
    if code is not None:
      traced_apart.note(code, "argument_class")


def _noting_callables(fun, answer):
  """``answer``, a stock trace of ``fun``, its code noted as traced apart
  where its outputs' nodes hold the trace's own objects
  (``output_node_data``), or (``callable``) where it holds a user's callable JAX runs later
  (asked of closure-free functions alone, the ones a canonical object
  serves)."""
  if type(fun) is types.FunctionType and fun.__closure__ is None:
    if _lowering.runtime_callable(answer[0]) is not None:
      traced_apart.note(fun.__code__, "callable")
    out_tree = _trace.tree_of(answer[1])
    if (out_tree is not None
        and trees.output_node_data(out_tree, ()) is not None):
      traced_apart.note(fun.__code__, "output_node_data")
  return answer


_skipped = threading.local()


class UnwatchedEffects:
  """Whether this thread made an effect no watch sees since this object
  was made: a trace JAX's own cache answered stale
  (:func:`note_cached_answer`), a warning (:func:`note_trace_effect`), a
  change to the process's settings (``_compat.settings_now``), or
  ``jax.clear_caches()`` (the store's ``clears``). A trace during which one was made (``made()``)
  is not shared or stored, since a later function object of its key
  would trace afresh and make it, as stock's would."""

  __slots__ = ("_at", "_settings", "_cleared")

  def __init__(self):
    self._at = getattr(_skipped, "n", 0)
    self._settings = _compat.settings_now()
    self._cleared = cache.STORE.clears

  def made(self) -> bool:
    return (getattr(_skipped, "n", 0) != self._at
            or cache.STORE.clears != self._cleared
            or _compat.settings_now() != self._settings)


@contextlib.contextmanager
def watching():
  """A trace whose :class:`UnwatchedEffects` are compared: JAX's cache
  answers inside it are checked (:func:`note_cached_answer`); those
  outside any (an eager loop's long-lived body, launched again) cost
  nothing."""
  _skipped.watching = getattr(_skipped, "watching", 0) + 1
  try:
    yield
  finally:
    _skipped.watching -= 1


def note_cached_answer(fun) -> None:
  """JAX's cache answered a trace of ``fun`` without running it (its
  answer from the first trace of this object): counted where its code is a
  trace writer, or where ``fun``'s closure key now is not the one that
  trace read (a cell, list or global changed since), or is unknown: a
  trace holding that answer is not what a later object of its key would
  trace, as stock's would. Only inside a trace being watched
  (:func:`watching`)."""
  if not getattr(_skipped, "watching", 0):
    return
  code = traced_code(fun)
  if code is None:
    return
  stale = "wrote" in traced_apart.why(code)
  if not stale and not (type(fun) is types.FunctionType
                        and fun.__closure__ is None
                        and closure_key.active_rules[0].stable(fun)):
    try:
      stale = _answered_keys.get(fun) != closure_key.closure_key(fun)[0]
    except (closure_key.Unkeyable, TypeError):
      stale = True
  if stale:
    _skipped.n = getattr(_skipped, "n", 0) + 1


def note_trace_effect(warning=None) -> None:
  """An effect no watch sees was made on this thread (a warning issued,
  :data:`WARNING_REPLACEMENTS`): a trace during which one was made is
  neither shared nor stored, and its code is a trace writer, as for a
  stale answer (:class:`UnwatchedEffects`), since stock makes it again at
  every trace of a new function object. ``warning``: its ``(message,
  category)``, for :func:`warnings_issued`."""
  _skipped.n = getattr(_skipped, "n", 0) + 1
  issued = getattr(_skipped, "issued", None)
  if issued is not None and warning is not None:
    issued.append(warning)


@contextlib.contextmanager
def warnings_issued():
  """The warnings issued on this thread inside the block, as ``(message,
  category)`` pairs (:func:`warning_text`), each left to ``warnings`` as
  issued: it is shown, ignored or raised as the user's filters say, and
  Python's registry of warnings shown once is kept
  (``warnings.catch_warnings`` would reset it). None where ``warnings``
  is not patched (:data:`WARNING_REPLACEMENTS`)."""
  if warnings.warn is not _warn:
    yield None
    return
  outer = getattr(_skipped, "issued", None)
  issued = _skipped.issued = []
  try:
    yield issued
  finally:
    _skipped.issued = outer
    if outer is not None:
      outer.extend(issued)


def _warning_of(args, kwargs) -> tuple:
  """``(message, category)`` of ``warnings.warn``'s or ``warn_explicit``'s
  arguments, whatever they are (the original raises its own errors)."""
  return (args[0] if args else kwargs.get("message"),
          args[1] if len(args) > 1 else kwargs.get("category"))


def warning_text(warning: tuple) -> str:
  """``"Category: message"`` of a :func:`warnings_issued` item (a message
  whose ``str`` fails is named by its type)."""
  message, category = warning
  if isinstance(message, Warning):
    category = type(message)
  try:
    text = str(message)
  except Exception:
    text = f"<a {type(message).__name__}>"
  return f"{getattr(category, '__name__', 'UserWarning')}: {text}"


_WARN = warnings.warn
_WARN_EXPLICIT = warnings.warn_explicit
_SHOW = getattr(warnings, "_showwarnmsg", None)


def _warn(*args, **kwargs):
  note_trace_effect(_warning_of(args, kwargs))
  # the same arguments, so the same errors; a stack level counted as stock
  # counts it, past this frame and the package's own
  if len(args) >= 3:
    if isinstance(args[2], int):
      args = (*args[:2], _external_level(args[2]), *args[3:])
  else:
    level = kwargs.get("stacklevel", 1)
    if isinstance(level, int):
      kwargs["stacklevel"] = _external_level(level)
  return _WARN(*args, **kwargs)


def _external_level(level: int) -> int:
  """The stack level for ``warnings.warn`` called from :func:`_warn` that
  names the frame ``level`` would name without the package: its caller
  for 1 (or less), then up, not counting the package's own frames (its
  replacements of JAX's functions, interposed between JAX's)."""
  frame = sys._getframe(2)   # the caller of ``warnings.warn``
  steps, seen = 0, 1
  while seen < level and frame is not None:
    frame = frame.f_back
    steps += 1
    if frame is None or not frame.f_code.co_filename.startswith(_PACKAGE):
      seen += 1
  return steps + 2   # this frame, then the caller's


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _warn_explicit(*args, **kwargs):
  note_trace_effect(_warning_of(args, kwargs))
  return _WARN_EXPLICIT(*args, **kwargs)


def _show(*args, **kwargs):   # a warning issued in C (NumPy's), as shown
  m = args[0] if args else kwargs.get("msg")
  note_trace_effect((getattr(m, "message", m), getattr(m, "category", None)))
  return _SHOW(*args, **kwargs)


_warn.__doc__ = _WARN.__doc__
_warn_explicit.__doc__ = _WARN_EXPLICIT.__doc__

#: ``warnings``' functions replaced while the closure key is on, each
#: counting (:func:`note_trace_effect`) and calling the original: a
#: warning a trace issues (JAX's own, or the user's through a library) is
#: an effect stock makes at every trace, whatever the filters say now.
WARNING_REPLACEMENTS = types.MappingProxyType({
    "warn": _warn, "warn_explicit": _warn_explicit,
    **({"_showwarnmsg": _show} if _SHOW is not None else {})})


def signature(in_avals, debug_info, ctx) -> tuple:
  """What a trace's key holds besides the closure's: the arguments' types,
  their static values by exact type and bits (the flat tree's own
  comparison of them is ``==``; a value with no such key raises
  Unkeyable), the debug info, pjit's context, the trace context and the
  PRNG options (which JAX's trace context leaves out)."""
  statics = tuple(map(closure_key.active_rules[0].static_key,
                      _trace.static_values(in_avals)))
  tree = _trace.tree_of(in_avals)
  conflated = None if tree is None else trees.conflated_node_data(tree)
  if conflated is not None:   # the flat tree's own comparison is ``==``
    raise closure_key.Unkeyable("argument_node_data", conflated)
  return (in_avals, statics, debug_info, ctx, _trace.trace_context(),
          _lowering.prng_options(), argument_classes_key(tree))


def argument_classes_key(tree) -> tuple:
  """What a trace can read of the user's classes among the arguments'
  pytree nodes (``closure.argument_classes``), which the flat tree keys by
  identity alone: each class's key (``closure.class_key``). Raises
  Unkeyable for a class the walk cannot key, or one whose key holds an
  object by identity that may die (its id could come back)."""
  classes = () if tree is None else closure.argument_classes(tree)
  if not classes:
    return ()
  keys = []
  for cls in classes:
    try:
      key, anchors = closure.class_key(cls)
    except Exception as e:   # (a user's code may raise anything)
      raise closure_key.Unkeyable(
          "argument_class", f"an argument's {cls.__name__} class: "
          f"{getattr(e, 'detail', None) or type(e).__name__}") from None
    # (JAX's registry holds a class's registered functions for good)
    registered = _compat.pytree_node_functions(cls) or ()
    if not all(isinstance(x, _LASTING) or any(x is f for f in registered)
               for x in anchors):
      raise closure_key.Unkeyable(
          "argument_class", f"an argument's {cls.__name__} class holds an "
          "object its key keeps by identity")
    keys.append(key)
  return tuple(keys)


#: Objects a class key may keep by identity in a stored signature: they
#: live as long as the class or module that holds them.
_LASTING = (dict, type, types.ModuleType, types.BuiltinFunctionType,
            types.CodeType)


def _lookup(traced, fun, in_avals, debug_info, ctx, sig):
  """``(answer, None, stored)``, or ``(None, share, False)``: trace as
  usual, then share. ``stored``: the answer was stored before this call
  (else it was traced, lifted, by this call)."""
  found = find(fun, sig)
  if found is None:
    return None, None, False
  key, leaves, anchors, shared = found
  if shared is not None and _warned(shared, leaves):
    return None, None, False
  try:   # what this answer reads, for a later answer of JAX's own cache
    _answered_keys[fun] = key[1]
  except TypeError:
    pass
  if not leaves:
    if shared is not None:
      return shared.answer, None, True
    # stored only for a key met again: a key met once keeps nothing (its
    # values, a class or bytes it holds, live as long as stock keeps them)
    return None, ((key, leaves, anchors) if met_before(key) else None), False
  if shared is None and (first_object(fun, traced_code(fun))   # as usual
      | (not met_before(key))):   # lifted only for a key met again
    return None, None, False
  if shared is None and _lowering.captured_constants_warning(leaves):
    # stock's lowering warns of the arrays it closes over, once for each
    # function whose own constants reach the threshold (a nested jit's
    # apart); lifted, they would all be this trace's: traced as usual
    return None, None, False
  stored = shared is not None
  shared = trace_shared(traced, shared, fun, key, leaves, anchors, in_avals,
                        debug_info, ctx)
  if shared is None:
    return None, None, False
  closed = _trace.ClosedJaxpr(shared.jaxpr, [*shared.consts, *leaves])
  _closings[closed] = shared.jaxpr
  return (closed, shared.out_avals), None, stored


def _warned(shared: _Shared, leaves) -> bool:
  """Whether stock's lowering of this object's trace would warn of its
  captured constants now, where ``shared`` (stored below the threshold)
  would lower nothing: ``jax_captured_constants_warn_bytes`` lowered since.
  Then the object traces as usual."""
  if shared.jaxpr is not None:
    consts = (*shared.consts, *leaves)
  elif shared.answer is not None:
    consts = shared.answer[0].consts
  else:
    return False
  return _lowering.captured_constants_warning(consts) is not None


def traced_code(fun):
  """The code the lookup files ``fun`` under: a function's, or its
  partial's function's (None for anything else)."""
  return getattr(getattr(fun, "func", fun), "__code__", None)


def first_object(fun, code) -> bool:
  """Records ``code``'s first function object; whether it is ``fun``."""
  with _records_lock:
    first = _first.setdefault(code, weakref.ref(fun)) if code else None
  return first is None or first() is fun


def met_before(key) -> bool:
  """Whether ``key`` was met before (recording it, of the last 4096)."""
  with _records_lock:
    met = _met.pop(hash(key), False)
    _met[hash(key)] = True
    if len(_met) > 4096:
      del _met[next(iter(_met))]
  return met


def forget_met(key) -> None:
  """Forget that ``key`` was met: its next meeting is a first one again."""
  with _records_lock:
    _met.pop(hash(key), None)


def find(fun, sig, found=None, rules=None):
  """``(key, leaves, anchors, stored)`` for ``fun`` and ``sig``, or None;
  ``found``: ``fun``'s ``closure_key`` if the caller walked it (``rules``)."""
  try:
    key, leaves, anchors = found or closure_key.closure_key(fun)
    _remember(fun, key)
    # the rebuild of the walk that made the key is part of it
    key = ((rules or closure_key.active_rules)[1], key,
           tuple(map(_trace.typeof, leaves)), sig)
    return key, leaves, anchors, traces.get(key)
  except Exception:   # Unkeyable, unhashable, or a walk that raised: as usual
    return None


def trace_shared(traced, shared, fun, key, leaves, anchors, in_avals,
                 debug_info, ctx, checked_after=False):
  """``shared``'s trace, a new lifted trace (stored if the key covers what it
  captured and the trace left it unchanged: ``checked_after``, the caller
  took the key again after its own trace), or None if one failed."""
  if shared is not None:
    return None if shared.failed else shared
  effects = UnwatchedEffects()
  try:
    shared = _trace_lifted(traced, fun, key, leaves, in_avals, debug_info,
                           ctx)
  except Exception as e:   # it needs a leaf's value, or leaked a tracer:
    # remembered, so the key's functions trace as usual
    _put(key, _Shared(failed=f"{type(e).__name__}: {e}"[:200]), anchors)
    return None
  called = _lowering.runtime_callable(shared.jaxpr)
  if called is not None:
    # its callback was made over the lifted trace's values (a closed-over
    # array is a tracer there) and the rebuilt closure's state: never run,
    # and the key's functions trace as usual
    _put(key, _Shared(failed=f"its {called} is the trace's own (a function "
                             "JAX calls later, or a numbered check)"),
         anchors)
    return None
  try:
    passed = _lowering.call_operand(
        shared.jaxpr, set(shared.jaxpr.constvars[len(shared.consts):]))
  except Exception as e:   # (a jaxpr this cannot read: never shared)
    passed = f"unread ({type(e).__name__})"
  if passed is not None:
    # a lifted array passed to an inner jit as an operand, where stock's
    # trace keeps it inside as the callee's constant, which XLA folds
    # there (``jax.jit(lambda: d * 1e-10)()``: a subnormal kept)
    _put(key, _Shared(failed=f"its {passed} takes a closed-over array as "
                             "an operand, a constant of stock's callee"),
         anchors)
    return None
  held = _lowering.param_tracer(shared.jaxpr)
  if held is not None:
    # a lifted value became a closed jaxpr's constant in a parameter (a
    # primitive bound with its jaxpr, as JAX's ``apply_primitive`` does):
    # a tracer of the lifted trace, dead once it ends
    _put(key, _Shared(failed=f"its {held}'s parameters hold a tracer of "
                             "the lifted trace"), anchors)
    return None
  if effects.made():
    # an effect no watch sees (a warning JAX's trace issues): made once, for
    # this call; a later object's answer would skip it, so the code's
    # objects trace as usual
    code = traced_code(fun)
    if code is not None:
      traced_apart.note(code, "wrote")
  elif (_covers(shared.consts, leaves, anchors)
      and _lowering.captured_constants_warning((*shared.consts, *leaves)) is None
      and not _holds_own_output_data(shared.out_avals, anchors)
      and (checked_after or unchanged_by_trace(fun, key))):
    _put(key, shared, anchors)
  return shared


def unchanged_by_trace(fun, key) -> bool:
  """Whether ``fun``'s closure key, taken again after a trace, is the one
  ``key`` (a lookup key) holds: a trace that changed what the key covers
  (a class attribute, a global, a cache filled lazily) is never shared, as
  a later function's hit would skip that change."""
  try:
    return closure_key.closure_key(fun)[0] == key[1]
  except (closure_key.Unkeyable, TypeError):
    return False


def evict(fun: Callable) -> None:   # clear_cache() of a jitted function
  try:
    key = closure_key.closure_key(fun)[0]
  except (closure_key.Unkeyable, TypeError):
    return
  for k in traces.keys():
    if k[1] == key:
      traces.discard(k)


def _trace_lifted(traced, fun, key, leaves, in_avals, debug_info, ctx):
  # fun traced with its leaves as leading arguments, or raises
  rules, key, leaf_avals, _ = key

  def lifted(leaves, *args, **kwargs):
    # a trace that writes what it reaches (a cell its caller reads after)
    # is traced as usual, every time, its writes once
    new = closure_key.rebuild(fun, key, leaves, rules)
    return StateWatch.run_unwritten(fun, new, lambda: new(*args, **kwargs),
                                    leaves)
  own_codes.add(lifted.__code__)
  args, kwargs = in_avals.unpack()
  lifted_in = ft.pack(((ft.flatten(list(leaf_avals)), *args.unpack()), kwargs))
  names = debug_info.arg_names
  lifted_debug = debug_info._replace(
      arg_names=None if names is None else ("",) * len(leaves) + names)
  closed, out_avals = traced(lifted, lifted_in, lifted_debug, *ctx)
  _compat.own_constants_in_place(closed)   # its own; copies of nested ones
  jaxpr, n = closed.jaxpr, len(leaves)
  jaxpr = jaxpr.replace(
      constvars=[*jaxpr.constvars, *jaxpr.invars[:n]], invars=jaxpr.invars[n:],
      debug_info=debug_info._replace(
          result_paths=jaxpr.debug_info.result_paths))
  return _Shared(jaxpr=jaxpr, consts=tuple(closed.consts), out_avals=out_avals,
                 nbytes=_compat.constants_nbytes(closed))


def _share_answer(key, leaves, anchors, answer) -> None:
  closed, _ = answer
  # not one holding an array (kept by identity): it would outlive its function
  if (_covers(closed.consts, leaves, anchors)
      and _lowering.captured_constants_warning((*closed.consts, *leaves)) is None
      and not any(isinstance(c, _compat.ArrayImpl) for c in closed.consts)
      # a callback's function is this trace's object (its log, its state)
      and _lowering.runtime_callable(closed) is None
      # an output's node holding this trace's own object (``out.meta is
      # meta``): stock's trace of each function object holds that object's
      and not _holds_own_output_data(answer[1], anchors)):
    # the stored answer owns its NumPy constants; stock's (which pjit's
    # caches hold for ``fun``) keeps JAX's conversions, as without the cache
    owned = _compat.owned_copy(closed)
    _put(key, _Shared(answer=(owned, answer[1]),
                      nbytes=_compat.constants_nbytes(owned)), anchors)


def _holds_own_output_data(out, anchors) -> bool:
  out_tree = _trace.tree_of(out)
  return out_tree is None or trees.output_node_data(
      out_tree, {id(x) for x in anchors}) is not None


def _covers(consts, leaves, anchors) -> bool:   # every captured array
  covered = {id(x) for x in (*leaves, *anchors)}
  return not any(isinstance(c, _compat.Tracer) or (
      isinstance(c, _compat.ArrayImpl) and id(c) not in covered) for c in consts)


def _put(key, shared: _Shared, anchors) -> None:   # until an anchor dies
  # (not stored where it would keep an anchor alive)
  traces.keep(key, shared, anchors)


# -- explanations --------------------------------------------------------------

# Each code's last closure key, for explain_miss (emptied with ``traces``).
_last_key: weakref.WeakKeyDictionary = _STORE.table(
    "closure_cache.last_key", cache.Store.TRACES, weakref.WeakKeyDictionary)


def _remember(fun, key) -> None:
  code = traced_code(fun)
  if code is not None:
    _last_key[code] = key


def explain_miss(fun) -> str:
  """For ``pe.explain``: ``fun``'s key against its code's last one."""
  try:
    key, _, _ = closure_key.closure_key(fun)
  except closure_key.Unkeyable as e:
    return f"  jax_closure_cache: no closure key ({e})"
  code = traced_code(fun)
  last = _last_key.get(code) if code is not None else None
  return "  jax_closure_cache: " + (
      "the first function of its code, traced as usual" if last is None
      else "a closure key seen before: its functions share one trace, with "
      "their arrays as arguments" if last == key
      else "its closure differs at "
      + closure_key.active_rules[0].difference(last, key))
