"""``ClosureJitted``: the jit wrapper a call goes through.

This module owns the wrapper and its per-call path: identity rows first
(``identity``), then the inline cache (``inline``), then the slow path
(``miss``). ``jit`` (``entrance``) returns either

* the very same stock jitted object for every re-creation of a closure-free
  function whose key needs no lifting (no closure, no array among the
  globals it and the helpers it reaches read): zero per-call overhead, or
* a :class:`ClosureJitted`. Its first call decides, once per function
  object (identity first): the first object of a code is stock's own; an
  object already called keeps what its first call decided; a new object
  with a stored key hits the entry's shared *lifted* function -- stock
  ``jax.jit`` of ``lifted(leaves, *args, **kwargs)`` -- with the closed-over
  arrays as ``leaves``.

Invariants:
* A function object that has been called is answered as stock answers it:
  by stock's jitted object of it, or by the entry its first call used with
  the arrays it read then.
* A stored entry's trace captured no array that the key does not cover,
  unless a :class:`~jax_closure_cache.key.guards.Guard` records where it
  was found; guards are checked on every hit and re-derived after every new
  trace of the entry.
* Whatever goes wrong on the cached path, the call is answered by stock
  ``jax.jit`` of the user's own function, so its result or error is stock's.
* The cache never extends an object's life: an entry holds the objects its
  key names by identity through weak references (module globals dicts
  excepted), no lifted array, and the shared jitted function; identity rows
  die with their function objects.
"""

from __future__ import annotations

import functools
import operator
import types
import weakref
from typing import NamedTuple

from jax_closure_cache import _compat
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache import cache
from jax_closure_cache import events
from jax_closure_cache.front import entries
from jax_closure_cache.lowering import structure as _structure
from jax_closure_cache.front import generated
from jax_closure_cache.front import identity
from jax_closure_cache.front import inline
from jax_closure_cache.front import miss
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.key import closure
from jax_closure_cache.key import values
from jax_closure_cache.key.closure import Uncacheable
from jax_closure_cache.lookup import trace_lookup

# The hot path reads these as globals.
_DISABLE_JIT = _compat.DISABLE_JIT
_OWNED = identity.OWNED
_ref = identity.ref
_getweakrefcount = identity.getweakrefcount
_FunctionType = types.FunctionType
_quick = inline.quick
_hot_spec = jit_options.hot_spec_cell()
code_of = entries.code_of


# A direct wrapper's ``__call__`` (``ClosureJitted._go_direct``): its stock
# object.
_STOCK_OF_WRAPPER = operator.attrgetter("_stock")

_UNSET = object()     # an attribute never set on the wrapper itself
_DELETED = object()   # an attribute deleted from a wrapper (``del w.__wrapped__``)


class _FromFun:
  """A wrapper's attribute as stock's jitted object has it: what was set on
  the wrapper (``functools.wraps`` writes every one of these), else the
  user's function's own, read when asked (a hit never pays for it). On the
  class, the class's own value (its docstring, its module)."""
  __slots__ = ("name", "class_value")

  def __init__(self, name, class_value=None):
    self.name, self.class_value = name, class_value

  def __get__(self, w, cls=None):
    if w is None:
      return self.class_value
    value = w.__dict__.get(self.name, _UNSET)
    if value is _UNSET:
      return self.of_function(w)
    if value is _DELETED:
      raise AttributeError(self.name)
    return value

  def of_function(self, w):
    return getattr(w._fun, self.name, self.class_value)

  def __set__(self, w, value):
    w.__dict__[self.name] = value

  def __delete__(self, w):
    if w.__dict__.get(self.name, None) is _DELETED:
      raise AttributeError(self.name)
    w.__dict__[self.name] = _DELETED


class _Wrapped(_FromFun):
  """``__wrapped__``: the user's function, whose identity row is published
  first (another wrapper of it may be made from it)."""
  __slots__ = ()

  def of_function(self, w):
    w._publish_row()
    return w._fun


class _Doc(_FromFun):
  """``__doc__``: the function's, or ``""`` where it has none, as JAX's
  ``util.wraps`` gives stock's jitted object."""
  __slots__ = ()

  def of_function(self, w):
    return getattr(w._fun, "__doc__", "") or ""


class _Module(_FromFun):
  """``__module__``: the function's, or ``"<unknown module>"`` where it
  has none, as JAX's ``util.wraps`` gives stock's jitted object."""
  __slots__ = ()

  def of_function(self, w):
    return getattr(w._fun, "__module__", "<unknown module>")


class _Name(_FromFun):
  """``__name__``: as stock's jitted object names its function (JAX's
  ``fun_name``: a ``functools.partial`` by its function, a callable object
  without a name ``<unnamed function>``)."""
  __slots__ = ()

  def of_function(self, w):
    return _compat.wrapped_name(w._fun)


#: What ``__getattr__`` takes from the user's function besides its own
#: ``__dict__`` (what ``functools.wraps`` copies onto stock's object and is
#: not a class attribute here).
_WRAPPED_ONLY = frozenset(("__qualname__", "__annotations__",
                           "__type_params__"))

def _wraps_default(w, name: str):
  """What JAX's ``util.wraps`` gives stock's object for ``name`` where the
  function has none (a partial, a callable object): its name, empty
  annotations."""
  return w.__name__ if name == "__qualname__" else {}


class _WrapperType(type):
  """The wrappers' metaclass: each class's ``__doc__`` and ``__module__``
  become :class:`_FromFun` (a wrapper reads the user's function's, as
  stock's jitted object does), while the class itself still reports its
  own (``type.__doc__`` asks the descriptor; ``__module__`` is answered
  here)."""

  def __new__(mcs, name, bases, ns, **kwargs):
    for attr, kind in (("__doc__", _Doc), ("__module__", _Module)):
      value = ns.get(attr)
      if not isinstance(value, _FromFun):
        ns[attr] = kind(attr, value)
    return super().__new__(mcs, name, bases, ns, **kwargs)

  @property
  def __module__(cls):
    return cls.__dict__["__module__"].class_value


# What the generated hit reads (``generated.HIT``); the monitoring module is
# read as an attribute on the hot path (``clear_event_listeners`` rebinds it).
_HIT_ENV = types.MappingProxyType({"MONITORING": _compat.monitoring_module,
            "RECORD_EVENT": _compat.jax.monitoring.record_event,
            "getrefcount": identity.getrefcount,
            "getweakrefcount": identity.getweakrefcount, "REF": identity.ref,
            "LONE_REFS": identity.LONE_REFS, "PINNED": identity.Pinned,
            "GUARDED_LEAVES": entries.guarded_leaves,
            "CHECK_VALUES": entries.check_values,
            "LEAF_ANSWERS": _structure.LEAF_ANSWERS,
            "LEAVES_KNOWN": generated.leaves_known_check(),
            "TRACE_STATE": _compat.TRACE_NOW[0],
            "EVAL_TRACE": _compat.TRACE_NOW[1], "STAGING": _compat.staging,
            **entries.REFUSES_NEW_OBJECT_NAMES,
            **miss.HIT_STAGES})


class ClosureJitted(entries.JitWrapper, miss.MissStages,
                    metaclass=_WrapperType):
  """A jitted callable: stock's ``jax.jit`` for a function object already
  traced, one shared executable for re-created closures with equal keys.

  Behaves as the object ``jax.jit`` returns: call it, ``.lower``, ``.trace``,
  ``.eval_shape`` (these three ahead-of-time entry points are stock's),
  ``__wrapped__``, ``__name__``; it composes with ``jax.grad``, ``jax.vmap``,
  ``jax.jvp`` and an outer ``jax.jit``.

  Invariant (identity first): after its first call, a function object is
  answered as stock answers it -- by stock's own jitted object of it, or by
  the entry its first call used, with the arrays it read then -- whatever
  its closure holds later.
  """
  __slots__ = ("_fun", "_code", "_spec", "_stock", "_row", "__weakref__",
               "__dict__")
  _direct = False
  #: whether stock takes the trace's constants as operands, not baked
  #: into a module: a launcher's eager primitive (``control_flow``)
  _constants_are_operands = False

  def __init__(self, fun, options: dict, options_key: tuple,
               lift_numpy: bool):
    # Top-level plain functions may take the inline cache (_quick).
    spec = (jit_options.find_spec((options_key, lift_numpy))
            or jit_options.spec(options, options_key, lift_numpy))
    fill(self, fun, (_code_of(fun), spec))

  # -- what jax.jit's result offers ------------------------------------------
  __wrapped__ = _Wrapped("__wrapped__")
  __name__ = _Name("__name__")

  def __getattr__(self, name):
    """The user's function's attributes that ``functools.wraps`` copies
    onto stock's jitted object (``__qualname__``, ``__annotations__``, its
    own ``__dict__``), read from the function; anything else is missing,
    as on stock's."""
    if name in _WRAPPED_ONLY or not name.startswith("_"):
      try:
        fun = object.__getattribute__(self, "_fun")
      except AttributeError:
        pass
      else:
        if name in _WRAPPED_ONLY:
          if name != "__type_params__":   # (which util.wraps does not set)
            return getattr(fun, name, _wraps_default(self, name))
          return getattr(fun, name)
        own = getattr(fun, "__dict__", None)
        if type(own) is dict and name in own:
          return own[name]
    raise AttributeError(
        f"{type(self).__name__!r} object has no attribute {name!r}")

  def _publish_row(self) -> None:
    """Record this wrapper's row in the identity table, where another
    wrapper of the same function object finds it (the hot path records it
    only when something besides this wrapper holds the function)."""
    row = self._row
    if type(row) is identity.Pinned:
      try:
        self._spec.table.setdefault(
            identity.ref(self._fun, self._spec.table.pop), row)
      except TypeError:
        pass

  def _split(self):
    """``(options key, function)``: how the closure walk keys this wrapper
    (``WALK_RULE``)."""
    self._publish_row()   # the walk may hand its function to a new wrapper
    return self._spec.key, self._fun

  def __repr__(self):   # as stock's, for a drop-in
    try:
      return f"<PjitFunction of {self.__wrapped__!r}>"
    except Exception:   # the function's repr raised, or it was deleted
      return "<PjitFunction>"

  def __getstate__(self):
    """Stock's state (``function_name`` ...), for introspection."""
    return self.stock().__getstate__()

  def __reduce__(self):
    self._publish_row()
    return (join, (self._spec.key, self._fun))

  def _cache_size(self) -> int:
    """Executables compiled for this function object."""
    row = self._row or identity.row_of(self._fun, self._spec.key)
    if row is None:
      return 0
    if type(row) is identity.OWNED:
      return _compat.cache_size(self.stock())
    return _compat.cache_size(row.entry.jitted)

  def __get__(self, obj, objtype=None):
    return self if obj is None else types.MethodType(self, obj)

  def _user(self):
    """The user's function whose code and location diagnostics report, and
    whose code decides first-object-is-stock's (a launcher overrides it: its
    own code is shared by every loop)."""
    return self._fun

  def _presented(self):
    """What the shared trace is named after (``entries.Presented``), or
    None for the traced function itself."""
    return None

  def stock(self):
    """Stock ``jax.jit`` of the user's own function (made once)."""
    s = self._stock
    if s is None:
      s = self._stock = stock_jit(self._fun, self._spec)
    return s

  def lower(self, *args, **kwargs):
    """Stock's ``.lower``, except for a re-created closure whose key has a
    stored entry: then the entry's own lowering, with this closure's leaves
    as the ``Lowered``'s constant arguments, so ``.lower(...).compile()``
    finds the executable the calls compiled (no compile) and the lowered
    text takes the leaves as parameters."""
    found = self._entry_for_aot(kwargs)
    if found is None:
      return self.stock().lower(*args, **kwargs)
    entry, leaves = found
    lowered = None
    try:
      with entries.calling(entry, self._fun):
        traced = entry.jitted.trace(leaves, *args)
      reads = None if self._constants_are_operands or not leaves else (
          _structure.constant_reads(traced.jaxpr, len(leaves)))
      if reads is None or (_structure.lifted_refusal(leaves, reads) is None
                           and miss.values_read(reads, leaves) is None):
        lowered = traced.lower()
      # (else leaves this signature's trace reads by a value stock's module
      # folds: stock's lowering)
    except Exception:   # a new signature whose lifted trace fails: stock's
      pass   # (lowered after the block: its error carries no context of ours)
    if lowered is None:
      return self.stock().lower(*args, **kwargs)
    return trace_lookup.lowered_with_leaves(lowered, leaves)

  def _entry_for_aot(self, kwargs):
    """``(entry, leaves)`` whose entry's lowering ``.lower`` may use: this
    wrapper's pinned row, or the stored, guard-free entry of its function's
    key; None for anything stock answers (a function object stock owns,
    options, keyword arguments, or no entry)."""
    if kwargs or self._spec.options or _DISABLE_JIT.value:
      return None
    row = self._row or identity.row_of(self._fun, self._spec.key)
    if row is not None:
      found = ((row.entry, row.leaves) if type(row) is identity.Pinned
               else None)
    else:
      try:
        a, _, entry = self._stored()
      except (Uncacheable, TypeError):
        return None
      if entries.refuses_new_object(entry):
        return None
      found = entry, a.leaves
    return found

  def trace(self, *args, **kwargs):
    return self.stock().trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self.stock().eval_shape(*args, **kwargs)

  def clear_cache(self):
    """Stock's ``clear_cache()``: its next call traces again. A function
    object pinned to a shared entry (identity first) is unpinned, so its
    next call takes its key again and reads what its closure holds now."""
    self.stock().clear_cache()
    row = self._row or identity.row_of(self._fun, self._spec.key)
    if type(row) is identity.Pinned:
      self._row = None
      identity.forget(self._spec.table, self._fun)

  # -- the cached call --------------------------------------------------------
  def __call__(self, *args, **kwargs):
    row = self._row
    if row is not None:   # this wrapper was called before
      return self._call_again(row, args, kwargs)
    fun = self._fun
    # No disable_jit check before a hit: the entry's stock jitted object
    # honours it (running the lifted function, rebuilt with these leaves,
    # eagerly), and every other path checks it in _call_slow.
    spec = self._spec
    # A row is keyed by a weak reference to the function: an object nothing
    # refers to weakly has none (a fresh closure, every call), so the lookup
    # is skipped for it.
    if _getweakrefcount(fun):
      try:
        row = spec.table.get(_ref(fun))
      except TypeError:   # unhashable
        row = None
      if row is not None:   # called before, through another wrapper
        self._row = row
        if type(row) is identity.Pinned:
          # (counted as a later call of the object; promoted only from a
          # wrapper called twice, ``_call_again``)
          row.calls += 1
        return self._call_row(row, args, kwargs)
    # Hot path, kept to this frame plus the generated match: the inline
    # cache for this code object, then the shared jitted function.
    quick = _quick.get(self._code)
    if quick is not None:
      spec_key = spec.key
      for q in quick:
        if q.options_key is spec_key:
          leaves = q.match(fun)
          if leaves is not None:
            entry = q.entry()
            if not entries.refuses_new_object(entry):
              if spec is _hot_spec[0]:
                self._restore_front(quick)
              return _hit(self, fun, q.key, entry, leaves, args, kwargs)
    return self._call_slow(args, kwargs)

  def _restore_front(self, quick: list) -> None:
    """A hit of the hot spec through the generic path: where this code's
    front is gone (dropped when verify mode or a default changed, or when
    the table of fronts was full), make it again from the matchers the
    code still has, so that its next wrappers take the front's path;
    not while the table is full."""
    base, table = self._front_home()
    if (type(self) is base and self._code not in table
        and len(table) < inline.FRONTS_MAX):
      # (a full table is not cleared for it: with more codes in turn
      # than it holds, every hit would make a front)
      inline.refresh_front(self._code, quick, base, _HIT_ENV, table)

  #: ``_call_entry(entry, key, leaves, args, kwargs)``: the shared jitted
  #: function of ``entry`` called for ``self._fun``, from the hit's own text
  #: (``generated.CALL``)
  _call_entry = generated.call_entry_function(_HIT_ENV)

  def _call_again(self, row, args, kwargs):
    """A later call of this wrapper: it and its function are long-lived.

    Each call with the entry passes the leaves as arguments, about a
    microsecond per array more than stock's baked executable: the more
    arrays, the sooner a long-lived wrapper is worth stock's compile.
    Counted here only: a function wrapped anew for each call (``jax.jit(
    f)(x)`` in a loop) keeps no stock object alive, and stock's path for a
    new wrapper costs several times the entry's."""
    if type(row) is not _OWNED:
      row.calls += len(row.leaves) or 1
      if row.calls >= identity.PROMOTE_AFTER_CALLS:
        row = self._promote(row)
    if type(row) is _OWNED:
      owned = self._stock_of(row)
      self._go_direct(owned)
      return owned(*args, **kwargs)
    return self._call_row(row, args, kwargs)

  def _go_direct(self, owned) -> None:
    """Make calls of this wrapper go straight to stock's ``owned``, with no
    Python frame of ours (within a few percent of calling stock's object).
    Done only for a wrapper called twice, i.e. a long-lived one.

    The wrapper moves to its class's *direct* subclass, made once per
    class: its ``__call__`` is a property that returns the wrapper's
    ``_stock``, so the interpreter calls that object (C all the way). The
    class holds nothing of the user's; the wrapper holds ``owned`` as
    before."""
    self._stock = owned
    cls = type(self)
    if cls._direct:
      return
    made = cls.__dict__.get("_direct_class")
    if made is None:
      made = type(cls.__name__, (cls,), {
          "__slots__": (), "__call__": property(_STOCK_OF_WRAPPER),
          "__module__": cls.__module__, "__qualname__": cls.__qualname__,
          "_direct": True})
      cls._direct_class = made
    self.__class__ = made

  def _stock_of(self, row):
    """Stock's jitted object for an owned function: the one made before if
    it is alive, else this wrapper's (stock's trace cache, keyed on the
    function, makes the two equivalent)."""
    owned = row()
    if owned is None:
      owned = self.stock()
      self._own()
    elif self._stock is None:
      self._stock = owned
    return owned

  def _call_row(self, row, args, kwargs):
    """A function object called before: as its first call decided."""
    if type(row) is _OWNED:
      return self._stock_of(row)(*args, **kwargs)
    if _DISABLE_JIT.value:
      return self._fun(*args, **kwargs)
    if _compat.staging():   # (generated.STAGED)
      return self._staged_call(args, kwargs)
    return self._call_entry(row.entry, row.key, row.leaves, args, kwargs)

  def _promote(self, row):
    """Give a long-lived object stock's own executable, if its closure still
    reads what its first call read (else stock's trace would differ from the
    one it has been answered by, so it stays on the entry)."""
    key, leaves = row.key, row.leaves
    try:
      a = closure.analyse(self._fun, self._spec.lift_numpy)
      same = (a.key == key[1] and len(a.leaves) == len(leaves)
              and all(x is y for x, y in zip(a.leaves, leaves)))
    except (Uncacheable, TypeError):
      same = False
    if not same:
      row.calls = -(1 << 62)   # never ask again
      return row
    if row.entry.warned():
      # stock's object would lower now and warn of its constants, where
      # stock's own lowered once, at the first call: ask again later
      row.calls = 0
      return row
    return self._own()

  def _pin(self, entry, key, leaves) -> None:
    self._row = row = identity.Pinned(entry, key, leaves)
    identity.remember(self._spec.table, self._fun, row)

  def _own(self):
    """Hand this function object to stock for good; returns its row."""
    self._row = row = _ref(self.stock())
    identity.remember(self._spec.table, self._fun, row)
    return row

  def _call_slow(self, args, kwargs):
    """First call of a function object: build the key, look it up, and hit,
    miss or fall back."""
    fun = self._fun
    if _DISABLE_JIT.value:
      return fun(*args, **kwargs)
    if _compat.staging():   # (generated.STAGED)
      return self._staged_call(args, kwargs)
    # (stock is called after the ``except`` block: an error of the user's
    # raised there would carry the refusal as its ``__context__``)
    refused = None
    try:
      a, key, entry = self._stored()
    except Uncacheable as e:
      refused = e.reason, e.detail
    except TypeError as e:   # unhashable pytree metadata in the key
      refused = "unhashable", str(e)
    if refused is not None:
      return self._fallback(refused[0], args, kwargs, refused[1])
    reported = None if entry is None else _lowering.stock_reports()
    if reported is not None:
      # (as ``refuses_new_object``: stock's first call of a new object
      # reports as it goes, which a stored entry's would not)
      return self._fallback(reported[0], args, kwargs, reported[1])
    if entry is not None and entry.warned():
      # stock's lowering of this object warns of its constants now (the
      # threshold was lowered since the entry was stored): stock's, with no
      # lifted trace first, whose effects stock's trace would make again
      return self._fallback("captured_constants", args, kwargs,
                            _lowering.captured_constants_warning(
                                nbytes=entry.constant_bytes))
    if (entry is None or (entry.guards and
                          not all([g.holds() for g in entry.guards]))
        or not entry.classes_hold()
        # traced under other PRNG options: this object's trace is of these
        or entry.prng != _lowering.prng_options()):
      return self._miss(key, a, args, kwargs)
    if (not entry.guards
        and len(_quick.get(self._code, ())) < inline.PER_CODE):
      self._remember_matcher(key, entry)
    events.hit(entry.record)
    self._pin(entry, key, a.leaves)
    out = self._call_entry(entry, key, a.leaves, args, kwargs)
    if cache.verifying():
      return self._verified(self._fun, key, entry, a.leaves, args, kwargs,
                            out)
    return out

  def _remember_matcher(self, key, entry) -> None:
    """Give the inline cache, and this code's front, a matcher for ``key``
    (a code whose keys have none is not asked again)."""
    code = self._code
    if code is None or code in inline.no_quick:
      return
    row = inline.remember(_quick, self._fun, key, entry)
    if row is None:
      # its keys are not simple: stop trying, but for jax's own wrappers,
      # whose one code (``jax.grad``'s and ``jax.vmap``'s api_boundary)
      # serves functions with keys of every shape
      if not _compat.library_code(code):
        inline.no_quick.add(code)
    else:
      base, table = self._front_home()
      inline.refresh_front(code, row, base, _HIT_ENV, table)

  @staticmethod
  def _front_home():
    """The class a front of this wrapper's code extends, and the table it
    is filed in (``jit`` makes a front's wrapper from ``inline.fronts``)."""
    return ClosureJitted, inline.fronts


_hit = generated.hit_function(_HIT_ENV, cache.verifying())


def _verify_changed(on: bool) -> None:
  """Verify mode turned on or off: the hit and the fronts are made anew."""
  global _hit
  _hit = generated.hit_function(_HIT_ENV, on)
  inline.fronts.clear()
  inline.client_fronts.clear()


cache.STORE.on_verify_changed(_verify_changed)



def _code_of(fun):
  """The code the inline cache files ``fun``'s matchers under: a plain
  function's, or a ``functools.partial``'s function's; None otherwise."""
  if type(fun) is types.FunctionType:
    return fun.__code__
  if type(fun) is functools.partial and type(fun.func) is types.FunctionType:
    return fun.func.__code__
  return None


def stock_jit(fun, spec):
  """Stock ``jax.jit(fun, **spec.options)``. For a plain function wrapped
  anew for each call (``jax.jit(f)(x)`` in a loop over a long-lived
  ``f``), the options ``jit()`` parsed for it the first time are kept
  beside it while it lives (:func:`parsed_options`), and later objects are
  made from them as ``jit()`` makes its own (``_compat.jit_with_info``):
  parsing them reads the function's signature, three quarters of stock's
  cost of a new jitted object. Not where ``jit()`` warns (``device``,
  ``backend``), nor once what it parsed of the function changed
  (:attr:`Face.parsed`).

  A bare function (no defaults, annotations or attributes: a nested
  ``def`` or a lambda, made afresh for each call) is parsed once per code
  and name: its signature and source information are its code's
  (``Face.bare``)."""
  info = parsed_options(fun, spec)
  if info is not None:
    made = _compat.jit_with_info(fun, info)
    if made is not None:
      return made
  made = _compat.STOCK_JIT(fun, **spec.options)
  if _reusable(fun, spec.options):
    info = _compat.jit_info(made)
    if info is not None:
      face = Face.of(fun)
      _jit_infos.setdefault(fun, {})[spec.key] = (info, face.parsed)
      if face.bare:
        _code_infos.setdefault(face.code, {})[spec.key] = (info, face.name)
  return made


def parsed_options(fun, spec):
  """The options ``jit()`` parsed for ``fun`` with ``spec``'s, kept from
  an earlier stock object of them (:func:`stock_jit`) while what parsing
  read of the function is unchanged; None where none is kept."""
  if not _reusable(fun, spec.options):
    return None
  face = Face.of(fun)
  known = _jit_infos.get(fun)
  found = None if known is None else known.get(spec.key)
  if found is not None and all(map(operator.is_, found[1], face.parsed)):
    return found[0]
  if face.bare:
    known = _code_infos.get(face.code)
    found = None if known is None else known.get(spec.key)
    if found is not None and found[1] is face.name:
      return found[0]
  return None


class Face(NamedTuple):
  """What ``jax.jit`` reads of a plain function, read once: the one place
  that says it. Its parse of the options reads the code, defaults,
  keyword defaults, annotations and name, and a ``__wrapped__`` or
  ``__signature__`` among its attributes (``inspect.signature``, the
  source information); the object it makes shows the name, qualified
  name, module, documentation and every attribute (``functools.wraps``)."""
  code: types.CodeType
  defaults: tuple | None
  kwdefaults: dict | None
  annotations: dict
  name: str
  qualname: str
  module: str | None
  doc: str | None
  attributes: tuple   # (name, value) pairs, in order

  @classmethod
  def of(cls, fun) -> Face:
    return cls(fun.__code__, fun.__defaults__, fun.__kwdefaults__,
               fun.__annotations__, fun.__name__, fun.__qualname__,
               fun.__module__, fun.__doc__, tuple(fun.__dict__.items()))

  @property
  def bare(self) -> bool:
    """Whether all that parsing reads is the code and name (a nested
    ``def`` or a lambda made afresh for each call): no defaults,
    annotations or attributes."""
    return (self.defaults is None and self.kwdefaults is None
            and not self.annotations and not self.attributes)

  @property
  def parsed(self) -> tuple:
    """What ``jit()``'s parse reads of the function, the objects themselves
    (kept beside its parse, and compared part for part by identity: a
    function renamed or given new defaults since is not the same); not its
    other attributes, one of which may hold the function itself."""
    own = dict(self.attributes)
    return (self.code, self.defaults, self.kwdefaults, self.annotations,
            self.name, own.get("__wrapped__"), own.get("__signature__"))

  def shown_by(self, jitted) -> bool:
    """Whether the stock object ``jitted`` shows this face as
    ``jax.jit(fun)`` made now would: its name, qualified name, module and
    documentation, and each attribute (the same objects)."""
    try:
      if (jitted.__name__ != self.name or jitted.__qualname__ != self.qualname
          or jitted.__module__ != self.module
          # JAX's wraps gives a function without documentation ""
          or (jitted.__doc__ or "") != (self.doc or "")):
        return False
      own = jitted.__dict__
      return all(k in own and own[k] is v for k, v in self.attributes)
    except Exception:   # an attribute a wrapper does not show: not the face
      return False


def _reusable(fun, options) -> bool:
  return (type(fun) is _FunctionType and options.get("device") is None
          and options.get("backend") is None)


# function -> {options key: (the options jit() parsed for it, what that
# read of it)}, weakly: nothing of the function's but what it holds itself
_jit_infos = cache.STORE.table("wrapper.jit_infos", cache.Store.CALLS,
                               weakref.WeakKeyDictionary)
# code -> {options key: (the options jit() parsed for a bare function of
# it, its name)}, weakly: they hold the code's parameter names and location,
# and the options (which the specs' table holds too)
_code_infos = cache.STORE.table("wrapper.code_infos", cache.Store.CALLS,
                                weakref.WeakKeyDictionary)


def fill(w, fun, code_and_spec=None):
  """The one way a wrapper's slots are set: ``w`` (allocated, not
  initialised) wraps ``fun`` and has not been called (no stock object, no
  row). ``code_and_spec``: its ``_code`` (for the inline cache; None for
  anything but a plain function) and its options' ``_spec``; None for a
  code's front class, which carries both as class attributes.

  ``__init__`` computes the spec from the options and calls this; ``jit``'s
  hot case calls it on an object it allocates; the C entrance
  (``front/_entrance.c``) is this for a front class, compiled
  (``tests/test_front_entrance.py`` checks they make the same wrapper).
  Returns ``w``."""
  w._fun = fun
  if code_and_spec is not None:
    w._code, w._spec = code_and_spec
  w._stock = None
  w._row = None   # this function object's row, once called
  return w


def of_front(fronts: dict, fun):
  """The wrapper of ``fun`` made of its code's front class in ``fronts``
  (a generated ``__call__``, without ``__init__``, as ``jit``'s hot case
  makes one), its own slots left for its class to set; None where its
  code has no front class there. The launchers' and binders' one way in,
  through :func:`front_maker`."""
  front = fronts.get(fun.__code__)
  if front is None:
    return None
  return fill(object.__new__(front), fun)


#: The slot descriptors ``fill`` sets, in the order the C entrance takes
#: them (``generated.entrance``).
FILLED_SLOTS = (ClosureJitted._fun, ClosureJitted._stock, ClosureJitted._row)


def front_maker(fronts: dict, base: type):
  """``lambda fun: of_front(fronts, fun)`` for a client whose front classes
  are subclasses of ``base``, made in C where the extension is built
  (``generated.entrance``): a launcher's or a binder's wrapper per call
  without a Python frame."""
  return generated.entrance(functools.partial(of_front, fronts), fronts,
                            base, FILLED_SLOTS)


# -- the wrapper as a walkable value (a jitted function in a closure) --------

_kinds = cache.STORE.own("wrapper.kinds", {False: ClosureJitted},
                         cache.Store.REGISTRY)


def register_static_arguments_kind(cls: type) -> None:
  """The wrapper class for options with static arguments (``static_args``),
  which ``join`` rebuilds such a wrapper as."""
  _kinds[True] = cls


def join(static, fun) -> ClosureJitted:
  options_key, lift_numpy = static
  options = dict(options_key)
  if "compiler_options" in options:   # frozen to pairs by options_key
    options["compiler_options"] = dict(options["compiler_options"])
  cls = _kinds[jit_options.has_static_arguments(options)]
  return cls(fun, options, options_key, lift_numpy)


#: How the closure walk keys a wrapper (``values.register_wrapper``): by its
#: options and its function, rebuilt by ``join`` around a new function.
WALK_RULE = (ClosureJitted._split, join)
values.register_wrapper(ClosureJitted, *WALK_RULE, label="jitted")
