"""The first call of a function object: look up, miss, store, fall back.

These are the wrapper's slow paths, methods of its base class
:class:`MissStages`, in the order a first call meets them.

Invariants: whatever goes wrong here, the call is answered by stock jit of
the user's own function, so its result or error is stock's; every outcome
is one ``events`` call (counted and explained together).
"""

from __future__ import annotations

import contextlib
import time
import types
import warnings

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache import events
from jax_closure_cache.front import entries
from jax_closure_cache.front.entries import code_of
from jax_closure_cache.front import identity
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.front import verify
from jax_closure_cache.lowering import folding
from jax_closure_cache.lowering import structure as _structure
from jax_closure_cache.key import closure
from jax_closure_cache.key import guards as key_guards
from jax_closure_cache.key.closure import Uncacheable
from jax_closure_cache.key import trees as key_trees
from jax_closure_cache.lookup import trace_lookup

_JaxArray = _compat.jax.Array


@contextlib.contextmanager
def _compile_warnings(record: bool):
  """The warnings a donating entry's trace and compile issue (XLA's
  unusable donated buffers), each shown, ignored or raised as issued, as
  the user's filters say; nothing is recorded, and the warning machinery
  left alone, for other options. Where ``warnings`` is not patched (the
  package's ``jit`` called without ``enable()``), the warnings that pass
  the filters are recorded by ``catch_warnings`` and shown after
  (Python's registry of those shown once is reset then)."""
  if not record:
    yield ()
    return
  with trace_lookup.closure_cache.warnings_issued() as issued:
    if issued is not None:
      yield issued
      return
  with warnings.catch_warnings(record=True) as warned:
    yield warned


def _warning_text(m) -> str:
  """A :func:`_compile_warnings` item's text: an issued warning's
  ``(message, category)``, or a recorded ``WarningMessage``."""
  return (trace_lookup.closure_cache.warning_text(m) if type(m) is tuple
          else f"{m.category.__name__}: {m.message}")


class MissStages:
  """The wrapper's slow paths, as methods of its base class, in the order a
  first call meets them: ``_stored`` (the key and its stored entry),
  ``_miss`` (stock's own trace for the first object of a code; else one
  trace of the shared lifted function), ``_store`` (keep the entry if the
  key covers what its trace captured, with guards for the rest), and
  ``_fallback`` / ``_retry_stock`` (stock answers, and says why).

  What they read of the wrapper is declared below (``ClosureJitted``
  defines each): its slots ``_fun`` and ``_spec``, a class attribute, and
  the methods a wrapper class provides (``stock()`` is public)."""

  #: the wrapper's slots they read: ``_fun`` (the user's function) and
  #: ``_spec`` (its options' ``JitSpec``; a slot, or a front's class
  #: attribute). Names, not annotations: a class annotation would show in
  #: the wrapper's ``__annotations__``, which must be the user's, as stock's.
  _WRAPPER_SLOTS = ("_fun", "_spec", "_row")
  #: whether stock takes the trace's constants as operands (a launcher)
  _constants_are_operands = False

  def _user(self):
    """The function diagnostics name and first-object-is-stock's reads."""
    raise NotImplementedError

  def _presented(self):
    """What the shared trace is named after, or None."""
    raise NotImplementedError

  def _own(self):
    """Make this function object stock's for good; stock's answer."""
    raise NotImplementedError

  def _pin(self, entry, key, leaves) -> None:
    """Pin this function object to ``entry`` (its identity row)."""
    raise NotImplementedError

  def _remember_matcher(self, key, entry) -> None:
    """File ``key``'s generated matcher under the function's code."""
    raise NotImplementedError

  def _verified(self, f, key, entry, leaves, args, kwargs, result):
    """``result`` of a hit of ``entry`` for ``f`` where verify mode finds
    that stock's trace of ``f`` is the computation the hit ran; else
    stock's own answer."""
    if entry.effects and entries.entries.get(key) is not entry:
      # this call traced a new signature, whose effect it made (stock's
      # trace of it would make it once more): its own trace answered
      return result
    if verify.check_hit(f, key, entry, leaves, args, kwargs,
                        self._spec.options):
      return result
    code = code_of(self._user())
    if code is not None:   # its later objects are stock's, never stored again
      entries.unliftable.add(code)   # nor answered by a shared trace
      trace_lookup.closure_cache.unshared_codes.add(code)
    self._own()
    with trace_lookup.unshared():
      return self.stock()(*args, **kwargs)

  def _stored(self):
    """``(analysis, key, stored entry or None)`` of this wrapper's function.
    Raises ``Uncacheable``, or TypeError for unhashable pytree metadata."""
    a = closure.analyse(self._fun, self._spec.lift_numpy)
    key = (self._spec.key, a.key)
    return a, key, entries.entries.get(key)


  def _fallback(self, reason: str, args, kwargs, detail: str = ""):
    events.fallback(self._user(), code_of(self._user()), reason, detail)
    self._own()
    return self.stock()(*args, **kwargs)


  def _staged_call(self, args, kwargs):
    """A call staged into a jaxpr being built (``generated.STAGED``):
    stock's, so that jaxpr is stock's (the closed-over arrays inside the
    inner computation, not operands passed to it), as eager control flow
    under a trace is stock's; not counted. The function object keeps its
    row: its eager calls still hit."""
    return self.stock()(*args, **kwargs)

  def _retry_stock(self, key, args, kwargs, error=None):
    """Answer with stock's outcome; remember the code if only lifting
    failed. Not where this function object ran its entry's executable
    for a signature it had run before (no new trace) and that failed on
    an array it read at its first call, deleted (or donated) since
    (stock's executable of it holds its own copy of it, and a trace now
    would read the state as it is now, a rebound global), or, at a later
    call of the object, on an argument deleted since (stock's object runs
    its executable of the signature on it, as the entry did): JAX's error
    stands."""
    if self._ran_on_deleted_array(error, args, kwargs):
      raise error
    if isinstance(error, entries.LiftedValueRefused):
      # this object's leaves (fixed for it): its calls are stock's; the
      # entry stays, for objects whose leaves hold other values
      return self._fallback("lifted_value", args, kwargs, str(error))
    if isinstance(error, entries.DonatesALeaf):
      # this call's (stock bakes the closed-over array); the entry and the
      # object's row stay, for its calls that pass no such argument
      events.fallback(self._user(), code_of(self._user()),
                      "donated_lifted_array", entries.DONATES_A_LEAF)
      return self.stock()(*args, **kwargs)
    if entries.caller_changed(error):
      # this object's new signature, as stock traces it: over its state
      # now; the entry and the object's row stay as they are
      events.fallback(self._user(), code_of(self._user()), "caller_changed",
                      "the function's closure changed since its first call, "
                      "and this call's argument signature is new: stock "
                      "traces it over the closure as it is now")
      return self.stock()(*args, **kwargs)
    self._own()
    out = self.stock()(*args, **kwargs)   # stock's error propagates as is
    entries.entries.discard(key)
    code = code_of(self._user())
    leak = entries.tracer_leak(error)
    if isinstance(leak, trace_lookup.closure_cache.state_watch.LiftedValueAsked):
      reason, detail = "asks_lifted_value", (
          f"{leak}; this code is traced as stock traces it from now on "
          "(tier A shares its executable)")
    elif leak is not None:
      reason, detail = "tracer_leak", (
          f"{leak} (a value built at trace time, written where stock's trace "
          "writes to the user's state); what it overwrote was put back, and "
          "this code is traced as stock traces it from now on")
    else:
      reason, detail = ("trace_error", "tracing with lifted arrays failed "
                        "where stock did not")
    if code is not None:
      entries.unliftable.add(code)
    events.fallback(self._user(), code, reason, detail)
    return out


  def _ran_on_deleted_array(self, error, args, kwargs) -> bool:
    row = self._row
    if (error is None or type(row) is not identity.Pinned
        or entries.tracer_leak(error) is not None
        or "deleted" not in str(error)):
      return False
    entry = row.entry
    if entry.traces != entry.checked:   # a new signature: stock traces too
      return False
    arrays = _compat.jax.tree_util.tree_leaves(row.leaves)
    if row.calls:
      # a later call of this object (its first call's hit made the row
      # with none counted): its arguments too. (A signature this object
      # meets first, whose executable another object of the entry made,
      # raises so too, where stock's object would trace it and raise
      # JAX's error of a deleted array.)
      arrays += _compat.jax.tree_util.tree_leaves((args, kwargs))
    return any(type(x) is _compat.ArrayImpl and x.is_deleted()
               for x in arrays)   # (a tracer's is_deleted raises)


  def _miss(self, key, a, args, kwargs):
    code = code_of(self._user())
    if (code is not None and code not in entries.ALWAYS_SHARED
        and entries.first_object(self._fun, code)):
      # The first function object of this code is stock's: a long-lived
      # function keeps stock's executable and speed. Only a second object
      # of the same code (a re-created closure) compiles the shared entry.
      # (The object is the wrapper's own function: the user's, or the
      # package's closure made afresh around it for static arguments or a
      # loop, so those count per call, as the code of the user's function.)
      entries.met_before(key)   # recorded: the next object of it shares
      started = time.perf_counter()
      self._own()
      with self._stock_traces() as traced, self._read_if_stock_raises(
          code, key):
        out = self.stock()(*args, **kwargs)
      events.miss(self._user(), code, key, time.perf_counter() - started,
                  first_object=True)
      self._note_stock_trace(code, key, a, args, kwargs, traced)
      try:   # and the key of the state the call left (a mesh's attributes
        # filled lazily, say): the next object is met in that state
        after = self._stored()[1]
        entries.met_before(after)
        read = entries.leaf_reads.get(key)
        if after != key and read is not None:
          entries.leaf_reads.put(after, entries.LeafReadsRead(read.reads))
        answered = entries.stock_answered.get(key)
        if after != key and answered is not None:
          # (what stock's trace showed holds for the code in the state the
          # call left: a lifted trace of the next object, refused after it
          # ran, would make its trace-time writes a second time)
          entries.stock_answered.put(after, entries.StockAnswered(
              answered.reason, answered.detail))
      except (Uncacheable, TypeError):
        pass
      return out
    if code is not None and code in entries.unliftable:
      return self._fallback("unliftable", args, kwargs,
          "an earlier lifted trace of this code failed or stored a traced "
          "value where stock's did not, so stock traces it")
    if (code not in entries.ALWAYS_SHARED
        and not entries.met_before(key)):
      # A key met once is stock's: one that never repeats (a new Python
      # float each step) keeps no entry, executable or array alive.
      events.met_once(self._user(), code, key, "its closure key is new; a "
                      "function met again with the same key shares one "
                      "executable")
      self._own()
      with self._stock_traces() as traced, self._read_if_stock_raises(
          code, key):
        out = self.stock()(*args, **kwargs)
      if code is not None and code in entries.stock_codes:
        self._note_stock_trace(code, key, a, args, kwargs, traced)
      else:
        self._read_stock_trace(key, a, args, kwargs)
      return out
    answered = entries.stock_answered.get(key)
    if answered is not None:
      return self._fallback(answered.reason, args, kwargs, answered.detail)
    arguments_tree = _compat.jax.tree_util.tree_structure((args, kwargs))
    conflated = key_trees.conflated_node_data(arguments_tree)
    if conflated is not None:
      # the entry's jitted function would answer a later call whose
      # pytree JAX's cache finds equal from this one's trace
      return self._fallback("argument_node_data", args, kwargs, conflated)
    reported = _lowering.stock_reports()
    if reported is not None:
      # (NaN checks: JAX re-runs a computation that gave a NaN op by op,
      # reporting as it goes; a lifted entry's failure and stock's retry
      # would report twice)
      return self._fallback(reported[0], args, kwargs, reported[1])
    baked = next((x for x in a.anchors if isinstance(x, _JaxArray)), None)
    if baked is not None:
      # An array kept by identity (committed to a device, or inside an
      # object) is baked into the trace: a stored entry would keep it alive.
      return self._fallback("array_by_identity", args, kwargs,
          f"a {key_guards.describe_array(baked)} array is kept by identity "
          "(committed, or inside an object) and would be baked into a shared "
          "executable that keeps it alive")
    if (jit_options.donates(self._spec.options)
        and entries.donated_leaf(a.leaves, args, kwargs)):
      return self._fallback("donated_lifted_array", args, kwargs,
                            entries.DONATES_A_LEAF)
    if not self._constants_are_operands:
      # (what stock's trace of the key's first meeting read by value, if
      # read; else zeros, 1, -1 or an infinity refused wherever they are)
      read = entries.leaf_reads.get(key)
      refused = _structure.lifted_refusal(
          a.leaves, None if read is None else read.reads)
      if refused is not None:
        out = self._fallback("lifted_value", args, kwargs, refused)
        if read is None:
          # (a key met without a first meeting's reads: an always-shared
          # code's) stock's trace of this call says them, for the next;
          # never an error of ours after stock's answer
          try:
            self._read_stock_trace(key, a, args, kwargs)
          except Exception:
            pass
        return out
    self.stock()   # made now: validates the options as stock jit() would
    # what the arguments' classes hold before the call: a trace (or an
    # unflatten) that writes there is not stored (``_store``)
    classes_before = key_guards.ArgumentClasses.of(
        closure.argument_classes(arguments_tree))
    entry = entries.Entry()
    entry.closure_key = a.key
    entry.anchors = a.anchors   # keeps the ids in ``key`` from being reused
    presented = self._presented()
    entry.jitted = entries.make_lifted_jit(
        self._fun if presented is None else presented,
        code_of(self._fun if presented is None else presented.fun), entry,
        self._spec.options, self._spec.lift_numpy, len(args))
    started = time.perf_counter()
    donating = jit_options.donates(self._spec.options)
    effects = _UnwatchedEffects()
    failed = None
    try:
      # .trace() fills JAX's _infer_params cache, so the call below compiles
      # without tracing again; the Traced object yields the captured consts.
      with entries.calling(entry, self._fun, a), _watching(), \
           _compile_warnings(donating) as warned:
        traced = entry.jitted.trace(a.leaves, *args, **kwargs)
        entry.note_trace(
            traced.jaxpr, len(_compat.jax.tree_util.tree_leaves(a.leaves)),
            args, kwargs)
        called = self._runtime_callable(traced)
        weak = self._eager_weak_types(traced)
        baked = None if called or weak else self._baked_operand(traced)
        folds = self._folds(traced, a.leaves)
        # (a leaf read by value as stock's first trace did not: rare)
        valued = None if self._note_values_read(entry, traced, a.leaves) \
            else _structure.lifted_refusal(a.leaves, entry.values)
        captured = self._captured_constants(traced, a.leaves)
        if called is not None:
          pass   # never run: its callback would read the lifted trace's values
        elif weak is not None:
          pass   # stock's eager call answers: its outputs' types are its own
        elif baked is not None:
          out = _compat.trace.run_traced_eagerly(traced, (a.leaves, *args),
                                                 kwargs)
        elif folds is None and captured is None and valued is None:
          out = entry.jitted(a.leaves, *args, **kwargs)
    except Exception as e:
      failed = e
    if failed is not None:   # (stock's error carries no context of ours)
      return self._retry_stock(key, args, kwargs, failed)
    if valued is not None and (called, weak, baked, folds, captured) == (
        None, None, None, None, None):
      # this call's (the entry's trace stands, for other values): stock's
      # trace of it makes the trace's effects a second time, where its
      # first meeting's trace read the leaves otherwise (a signature
      # since, reading them by value)
      return self._fallback("lifted_value", args, kwargs, valued)
    for reason, detail in (("runtime_callable", called),
                           ("eager_weak_type", weak),
                           folds or (None, None),
                           ("captured_constants", captured)):
      if detail is not None and baked is None:
        # stock answers (its module bakes the closed-over arrays), and this
        # key's later objects, and the code's, are traced as stock traces
        # them (with no lifted trace first, whose effects stock's trace
        # would make again)
        answered = entries.StockAnswered(reason, detail)
        entries.stock_answered.put(key, answered)
        if code is not None:
          entries.stock_codes.add(code)
        return self._fallback(reason, args, kwargs, detail)
    if baked is not None:
      entry.record = events.miss(self._user(), code_of(self._user()), key,
                                 time.perf_counter() - started)
      events.not_stored(self._user(), "operand_zero", baked)
      return out
    cost = time.perf_counter() - started   # trace + compile + first run
    self._pin(entry, key, a.leaves)
    if warned:
      # XLA warns of unusable donated buffers at every compile, which stock
      # makes per function object: such an entry is not shared. Those
      # recorded (``warnings`` not patched) passed the user's filters
      # already; they are shown now.
      entry.record = events.miss(self._user(), code_of(self._user()), key, cost)
      events.not_stored(self._user(), "warned", "; ".join(
          dict.fromkeys(map(_warning_text, warned)))[:300])
      for m in warned:
        if type(m) is not tuple:
          warnings.showwarning(m.message, m.category, m.filename, m.lineno,
                               m.file, m.line)
      return out
    # a miss is counted when stored or not stored (below): a failed trace
    # counts as a fallback alone
    self._store(key, entry, a.leaves, args, kwargs, traced, cost, effects,
                classes_before)
    return out


  @staticmethod
  @contextlib.contextmanager
  def _read_if_stock_raises(code, key):
    """A block in which stock answers a meeting of ``key`` whose trace is
    read after (:meth:`_note_stock_trace`): where stock raises, nothing
    can be read, so the key's next meeting is stock's again and read (the
    key forgotten, its code filed as read), not traced lifted first, whose
    trace-time effects stock's trace would make a second time where it
    holds a callback."""
    try:
      yield
    except BaseException:
      entries.forget_met(key)
      if code is not None:
        entries.stock_codes.add(code)
      raise

  def _stock_traces(self):
    """A block in which stock answers this wrapper's call, yielding what
    it traced to read after: for a launcher, whose stock is eager control
    flow (no jitted object whose trace JAX's cache could give back), the
    jaxprs the trace lookup returned meanwhile (its functions' traces);
    else None."""
    if self._constants_are_operands:
      return trace_lookup.collecting()
    return contextlib.nullcontext()

  def _note_stock_trace(self, code, key, a, args, kwargs,
                        traced_by_stock=None) -> None:
    """After stock answered the first meeting of ``key`` (the first object
    of ``code``, or, for a code filed in ``entries.stock_codes``, a key met
    once): where stock's trace of it (read from JAX's cache, never traced
    again) is one a later object's lifted trace would be answered by stock
    for (a runtime callable, a zero XLA folds in stock's module, constants
    stock warns of), the key goes to stock from now on with no lifted
    trace, whose trace-time effects (a write, a log line) stock's trace
    would make a second time; and the code is filed, so that its other
    keys' first meetings are read too. A launcher's stock is no jitted
    object: the traces stock's control flow made of its functions (and
    any other trace made meanwhile: ``traced_by_stock``, from
    :meth:`_stock_traces`) are read for a runtime callable, and the key's
    lifted arrays alone for a size a lifted trace's constants would be
    warned of. (The traces' own constants are not counted: JAX's traces
    of the eager primitive hold copies of the closed-over arrays, where a
    lifted trace passes them once. Constants a body makes at trace time,
    which add to them in a lifted trace, are seen there.)"""
    if code is None:
      return
    if self._constants_are_operands:
      for jaxpr in traced_by_stock or ():
        called = _lowering.runtime_callable(jaxpr)
        if called is not None:
          self._note_stock_answers(code, key, "runtime_callable",
              f"stock's trace of its {called} is its own (a function JAX "
              "calls later over the closure's own values and state): stock "
              "traces every object")
          return
      captured = _lowering.captured_constants_warning(
          _compat.jax.tree_util.tree_leaves(a.leaves))
      if captured is not None:
        self._note_stock_answers(code, key, "captured_constants", captured)
      return
    traced = self._cached_stock_trace(args, kwargs)
    if traced is None:
      return
    if (type(self._fun) is types.FunctionType
        and self._fun.__closure__ is None and key_trees.output_node_data(
            traced.out_tree, {id(x) for x in a.anchors}) is not None):
      # no canonical stock object: its cache would hand its outputs' node
      # data (the trace's own objects) to later objects' callers
      trace_lookup.closure_cache.traced_apart.note(code, "output_node_data")
    leaves = _compat.jax.tree_util.tree_leaves(a.leaves)
    lifted = {id(x) for x in leaves}
    consts = _lowering.closed_parts(traced.jaxpr)[1]
    reads = _structure.constant_reads(traced.jaxpr)
    folds = (folding.difference(traced.jaxpr, lifted_constants=lifted)
             or values_read(reads, None, (lifted, consts)))
    if folds is None:
      _note_leaf_reads(key, leaves, consts, reads)
    for reason, detail in (
        ("runtime_callable", self._runtime_callable(traced)),
        folds or (None, None),
        ("captured_constants", _lowering.captured_constants_warning(
            _compat.captured_constants(traced)))):
      if detail is not None:
        self._note_stock_answers(code, key, reason, detail)
        return

  def _cached_stock_trace(self, args, kwargs):
    """Stock's trace of this call, read from JAX's cache (never traced
    again), or None where it is not there (or not traceable)."""
    try:
      with _compat.NO_TRACING(True):
        return self.stock().trace(*args, **kwargs)
    except Exception:
      return None

  def _read_stock_trace(self, key, a, args, kwargs) -> None:
    """After stock answered a key met once: which of its leaves stock's
    trace (read from JAX's cache, never traced again) reads by value, for
    the key's next meeting (``_note_leaf_reads``)."""
    leaves = _compat.jax.tree_util.tree_leaves(a.leaves)
    if self._constants_are_operands or not leaves:
      return
    traced = self._cached_stock_trace(args, kwargs)
    if traced is None:
      return
    _note_leaf_reads(key, leaves, _lowering.closed_parts(traced.jaxpr)[1],
                     _structure.constant_reads(traced.jaxpr))

  @staticmethod
  def _note_stock_answers(code, key, reason: str, detail: str) -> None:
    """``key`` goes to stock from now on (``reason``, ``detail``), and its
    code's other keys' first meetings are read (``stock_codes``)."""
    entries.stock_answered.put(key, entries.StockAnswered(reason, detail))
    entries.stock_codes.add(code)


  def _baked_operand(self, traced) -> str | None:
    """Why ``traced`` runs as eager JAX runs it, not compiled as one module:
    where stock passes the trace's constants as operands (an eager
    ``lax.cond`` or loop binds its primitive to them) and it has one, which
    a compiled launcher would bake and XLA fold: by value (``-0.0 ==
    0.0``: ``[-0.0, 1.0]`` becomes an iota, ``x + zeros`` is ``x``, ``x *
    mask`` a product where an operand mask makes it a select), and into
    what it computes (``y + (ones - 1.0)`` is ``y``)."""
    if not self._constants_are_operands:
      return None
    if _compat.captured_constants(traced):
      return ("its trace has constants, which stock's eager primitive takes "
              "as operands and a compiled launcher would bake (XLA folds a "
              "baked constant, and the sign of a zero can differ): it runs "
              "as stock's eager primitive does, every call")
    return None


  def _new_signature(self, key, entry, leaves, args, kwargs, out):
    """``out``, from a stored ``entry`` that traced and compiled a new
    argument signature, and the entry stored again with fresh guards; or,
    where that trace is one a miss would not have compiled (constants a
    launcher's stock takes as operands, an addition XLA folds in stock's
    module only), stock's answer, with the key answered by stock from now
    on. A new signature whose trace made an effect no watch sees (a
    warning JAX issues for that signature: ``entry.effects``, of the
    call's own trace) made it once, for this call, as stock's trace would:
    ``out`` where no check above answers with stock, with the key answered
    by stock from now on (a hit of its later objects would skip it)."""
    made_effect = entry.effects
    try:
      with entries.calling(entry, self._fun):
        traced = entry.jitted.trace(leaves, *args, **kwargs)
    except Exception:   # store() reports it
      traced = None
    if traced is not None:
      entry.note_trace(
          traced.jaxpr, len(_compat.jax.tree_util.tree_leaves(leaves)),
          args, kwargs)
      if not self._note_values_read(entry, traced, leaves):
        # a leaf this signature's trace reads by its value holds it (1, -1
        # or an infinity; zeros): this call is stock's (the entry stays);
        # where the call donated its arguments (consumed: no stock retry
        # can follow), its answer stands, and the key is stock's from now
        refused = _structure.lifted_refusal(leaves, entry.values)
        if jit_options.donates(self._spec.options):
          entries.entries.discard(key)
          entries.stock_answered.put(key, entries.StockAnswered(
              "lifted_value", refused))
          events.not_stored(self._user(), "lifted_value", refused)
          return out
        return self._fallback("lifted_value", args, kwargs, refused)
      for reason, detail in (
          ("argument_node_data", key_trees.conflated_node_data(
              _compat.jax.tree_util.tree_structure((args, kwargs)))),
          ("runtime_callable", self._runtime_callable(traced)),
          ("eager_weak_type", self._eager_weak_types(traced)),
          ("operand_zero", self._baked_operand(traced)),
          self._folds(traced, leaves) or (None, None),
          ("captured_constants", self._captured_constants(traced, leaves))):
        if detail is not None:
          entries.entries.discard(key)
          entries.stock_answered.put(key, entries.StockAnswered(reason, detail))
          return self._fallback(reason, args, kwargs, detail)
    if made_effect:
      entries.entries.discard(key)
      entries.stock_answered.put(key, entries.StockAnswered(
          "trace_effect", _NEW_SIGNATURE_EFFECT))
      events.not_stored(self._user(), "trace_effect", _NEW_SIGNATURE_EFFECT)
      return out
    self._store(key, entry, leaves, args, kwargs, traced)
    return out


  def _runtime_callable(self, traced) -> str | None:
    """Why the lifted trace must not run nor be kept: its jaxpr calls a
    Python function of the trace's own when it runs (a callback), which
    was made over the lifted trace's values (a closed-over array is a
    tracer there) and this object's state (a write would land on the
    rebuilt copy); or None."""
    called = _lowering.runtime_callable(traced.jaxpr)
    if called is None:
      return None
    return (f"its {called} is its own trace's (a function JAX calls later, "
            "over the closure's own values and state, a user's object it "
            "keeps for when it runs, or a check JAX numbers per trace): "
            "stock traces every object")


  def _eager_weak_types(self, traced) -> str | None:
    """For a launcher (whose stock runs its primitive eagerly), where its
    trace gives other weak types than stock's eager call
    (``_compat.lowering.eager_weak_types``), or None."""
    if not self._constants_are_operands:
      return None
    return _lowering.eager_weak_types(traced.jaxpr)

  def _captured_constants(self, traced, leaves) -> str | None:
    """Why stock's own lowering of this call warns of the constants its
    trace captures (the closed-over arrays, lifted here, and the baked
    ones), which a stored entry's hit would not, or None."""
    return _lowering.captured_constants_warning((
        *_compat.jax.tree_util.tree_leaves(leaves),
        *_compat.captured_constants(traced)))


  def _folds(self, traced, leaves):
    """Where ``traced``, its lifted arrays passed as arguments, computes
    otherwise than stock's module, which bakes them and folds them with its
    other constants (``lowering/folding.py``: a zero added, scalars
    reassociated), for a wrapper whose stock bakes those arrays (a
    launcher's stock takes them as operands): a ``folding.Finding``, or
    None."""
    if self._constants_are_operands:
      return None
    n = len(_compat.jax.tree_util.tree_leaves(leaves))
    return (folding.difference(traced.jaxpr, lifted_inputs=n)
            or values_read(_structure.constant_reads(traced.jaxpr, n),
                            _compat.jax.tree_util.tree_leaves(leaves)))

  def _note_values_read(self, entry, traced, leaves) -> bool:
    """At a trace of ``entry`` whose stock bakes the lifted leaves: note
    which leaves an operation XLA removes by their value reads; whether
    ``leaves`` may be passed to its executable (``check_values``)."""
    if self._constants_are_operands or not leaves:
      return True
    n = len(_compat.jax.tree_util.tree_leaves(leaves))
    reads = _structure.constant_reads(traced.jaxpr, n)
    entry.note_values_read(reads)
    return _structure.lifted_refusal(leaves, entry.values) is None


  def _guards(self, after, traced, args, kwargs):
    """The guards of a trace's captured constants that ``after`` (the
    closure analysed after the trace) does not cover, or ``Unguarded``."""
    captured = _compat.captured_constants(traced)
    covered = {id(x) for x in after.anchors}
    guards = key_guards.find_guards(captured, after.roots, covered)
    if (isinstance(guards, key_guards.Unguarded)
        and not jit_options.has_static_arguments(self._spec.options)):
      # constants the trace made itself from what the key covers
      made = key_guards.made_by_trace(self._fun, after, args, kwargs,
                                      captured, covered)
      if made:
        guards = key_guards.find_guards(captured, after.roots, covered | made)
    return guards


  def _store(self, key, entry: entries.Entry, leaves, args, kwargs,
            traced=None, cost: float | None = None,
            effects=None, classes_before=None) -> None:
    """Store ``entry`` under ``key`` (the state the trace started from) with
    fresh guards, or drop it.

    The closure is analysed again after tracing, for the guard roots. A
    trace that changed what the closure holds (a trace counter in a list)
    is not stored: a hit would skip its write; nor is one in which JAX's
    own cache answered a function whose code wrote at trace time before
    (``effects``: the trace's :class:`UnwatchedEffects`), which a later
    object of the key would run, as stock's trace would. ``traced`` is the
    miss path's own trace; without it (a call that traced a new signature)
    the entry is asked for it again, which JAX answers from its cache.
    """
    entries.entries.discard(key)
    if cost is not None:   # a miss, not a re-derivation after a retrace
      entry.record = events.miss(self._user(), code_of(self._user()), key, cost)
    try:
      after = closure.analyse(self._fun, self._spec.lift_numpy)
    except Uncacheable as e:
      events.not_stored(self._user(), "uncacheable_after_trace", e.detail)
      return
    if len(after.leaves) != len(leaves):
      events.not_stored(self._user(), "layout_changed",
                        "the trace changed how many arrays the closure holds")
      return
    if effects is not None and effects.made():
      events.not_stored(self._user(), "cached_trace_writer",
                        "JAX's own cache answered a function of this trace "
                        "whose trace writes state, so the write was skipped; "
                        "a later object would make it, so every object "
                        "traces")
      return
    if after.key != key[1]:
      # a trace-time write (a counter in a list, a cache filled lazily): a
      # hit would skip it where stock's trace makes it
      events.not_stored(self._user(), "trace_wrote_state",
                        "the trace changed what the closure holds; a hit "
                        "would skip that change, so every object traces")
      return
    if traced is None:
      try:
        with entries.calling(entry, self._fun):
          traced = entry.jitted.trace(leaves, *args, **kwargs)
      except Exception as e:
        events.not_stored(self._user(), "retrace_failed",
                          f"tracing the new signature again failed: {e!r}")
        return
    called = _lowering.runtime_callable(traced.jaxpr)
    if called is not None:
      # the callback is this object's (its log, its state): a hit would call
      # it from later objects; every object traces (tier A shares no
      # executable either, as it keys the callback by identity)
      events.not_stored(self._user(), "runtime_callable",
                        f"its {called} is this trace's own (a function JAX "
                        "calls later, or a numbered check); a hit would run "
                        "it for later objects")
      return
    output = key_trees.output_node_data(
        traced.out_tree, {id(x) for x in (*entry.anchors, *after.anchors)})
    if output is not None:
      # a hit returns the trace's outputs' treedef: its objects, not the
      # calling function's (tier A shares the executable, after stock's
      # trace of each object)
      events.not_stored(self._user(), "output_node_data", output)
      return
    # the trace took a NumPy array as a view: the stored trace keeps a copy
    # (a change in place would reach a later .trace() or verify's comparison)
    _compat.own_constants_in_place(traced.jaxpr)
    guards = self._guards(after, traced, args, kwargs)
    if isinstance(guards, key_guards.Unguarded):
      events.not_stored(self._user(), "untracked_capture", guards.detail)
      return
    if not entry.classes_hold():
      events.not_stored(self._user(), "argument_class",
                        "an argument's pytree class cannot be keyed (what "
                        "its code reads is in no key), so every object "
                        "traces")
      return
    if classes_before is not None and (
        entry.classes is None or not entry.classes.read_as(classes_before)):
      events.not_stored(self._user(), "trace_wrote_state",
                        "the call changed what an argument's pytree class "
                        "holds (its unflatten or a method wrote there); a "
                        "hit would skip that change, so every object traces")
      return
    held = entries.entries.hold(key, entry,
                                entry.anchors + after.anchors
                                if cost is not None else after.anchors,
                                keep=entries.library_object)
    if isinstance(held, str):
      events.not_stored(self._user(), "unweakrefable_anchor", held)
      return
    entry.anchors = held
    entry.guards = guards
    entry.checked = entry.traces
    # what the entry keeps alive of its trace's constants (the store's
    # bound), its nested jaxprs' included
    entry.nbytes = _compat.constants_nbytes(traced.jaxpr) + sum(
        int(getattr(c, "nbytes", 0) or 0)
        for c in _compat.separated_constants(traced))
    entry.constant_bytes = max(entry.constant_bytes, _lowering.constants_bytes(
        (*_compat.jax.tree_util.tree_leaves(leaves),
         *_compat.captured_constants(traced))))
    try:
      entries.entries.put(key, entry)
    except TypeError as e:
      events.not_stored(self._user(), "unhashable", str(e))
      return
    if not entry.guards:
      self._remember_matcher(key, entry)
    if (after.key == key[1]   # the walk the trace took, unchanged by it
        and entries.shares_traces(self._spec.options)):
      trace_lookup.publish(self._fun, after, traced, args, kwargs)


_UnwatchedEffects = trace_lookup.closure_cache.UnwatchedEffects


def _note_leaf_reads(key, leaves, consts, reads) -> None:
  """Which of ``key``'s lifted ``leaves`` stock's trace of it reads by
  value (``reads``, its ``constant_reads`` over its ``consts``, which hold
  the leaves by identity): the key's next meeting checks them before its
  lifted trace (``MissStages._miss``)."""
  if not leaves:
    return
  at = {id(x): i for i, x in enumerate(leaves)}
  # each constant's leaf: itself, or the NumPy array JAX's typed copy of a
  # NumPy leaf views
  of = [at.get(id(c), at.get(id(getattr(c, "base", None)))
               if isinstance(c, np.ndarray) else None) for c in consts]
  # a leaf not among the trace's constants (an inner jit's) is checked as
  # multiplied and added whole; a part of it read so is seen by the lifted
  # trace's own reads alone (after it: a known limit), and so is one all
  # one value in a chain (``folding.uniform_reads`` follows it into the
  # inner jit there)
  unseen = frozenset(range(len(leaves))) - set(of)
  entries.leaf_reads.put(key, entries.LeafReadsRead(_structure.LeafReads(
      *(extra | {of[j] for j in found if of[j] is not None}
        for extra, found in ((unseen, reads.by_identity),
                             (unseen, reads.by_zero),
                             (frozenset(), reads.partly),
                             (frozenset(), reads.by_uniform))))))


def values_read(reads, leaves, lifted=None) -> folding.Finding | None:
  """Where a trace's ``structure.constant_reads`` read a lifted array as
  a value (for stock's trace, whose constants are the closure's arrays:
  one of ``lifted``, its constants' ids), which stock's module folds
  (``sqrt(c)``, ``sign(c)``, a comparison: XLA's arithmetic at compile
  time, the runtime's in the shared executable): a ``folding.Finding``,
  or None. ``leaves``: the lifted leaves a lifted trace's reads index. An
  array of floating or complex values alone is refused so, or one of any
  type from which a value is computed that an operation XLA removes by 1
  or 0 reads (``derived``: ``x * (i // 2)``)."""
  found = reads.by_value
  if lifted is not None:
    found = [i for i in found if id(lifted[1][i]) in lifted[0]]
  # (an integer array read so, an index or a label, is folded exactly,
  # unless what is computed from it decides an operation XLA removes)
  found = [i for i in found if i in reads.derived or _lowering.inexact_dtype(
      getattr(lifted[1][i] if lifted is not None else leaves[i], "dtype",
              None))]
  if not found:
    return None
  return folding.Finding("folds_constants", (
      "a closed-over array is read as a value (a function of it, a "
      "comparison, a remainder's operand), which stock's module computes "
      "at compile time with XLA's arithmetic and the shared executable at "
      "run time"))

#: Why a key whose entry traced a new signature with an effect is stock's.
_NEW_SIGNATURE_EFFECT = (
    "a new argument signature's trace made an effect no watch sees (a "
    "warning JAX issues for it); a hit of a later object would skip it, so "
    "every object traces")
_watching = trace_lookup.closure_cache.watching


#: The stages the generated hit (``generated.HIT``, ``CALL``) calls by name:
#: a new signature's trace, stock's answer after a failed one, and verify
#: mode's check.
HIT_STAGES = types.MappingProxyType({
    "STAGED_CALL": MissStages._staged_call,
    "RETRY_STOCK": MissStages._retry_stock,
    "NEW_SIGNATURE": MissStages._new_signature,
    "VERIFIED": MissStages._verified})
