"""The closure-aware ``jit``: the fast front and the closure-keyed lookup.

``jit(fun)`` returns either

* the very same stock jitted object for every re-creation of a closure-free
  function whose key needs no lifting (no closure, no array among the
  globals it and the helpers it reaches read): zero per-call overhead, or
* a :class:`ClosureJitted`. Its first call decides, once per function
  object (identity first): the first object of a code is stock's own; an
  object already called keeps what its first call decided; a new object
  with a stored key hits the entry's shared *lifted* function -- stock
  ``jax.jit`` of ``lifted(leaves, *args, **kwargs)`` -- with the closed-over
  arrays (and auto-dynamic scalars) as ``leaves``.

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
import inspect
import itertools
import sys
import time
import types
import weakref
from typing import Any, Callable

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache.key import auto_dynamic as _auto_dynamic
from jax_closure_cache import cache
from jax_closure_cache.key import closure
from jax_closure_cache.key import guards as key_guards
from jax_closure_cache.front import generated
from jax_closure_cache.key import matchers
from jax_closure_cache.key import rebuild
from jax_closure_cache import diagnostics
from jax_closure_cache import events
from jax_closure_cache import settings
from jax_closure_cache.lookup import trace_lookup
from jax_closure_cache.key.closure import Uncacheable

JIT_OPTIONS = frozenset({
    "in_shardings", "out_shardings", "static_argnums", "static_argnames",
    "donate_argnums", "donate_argnames", "keep_unused", "device", "backend",
    "inline", "compiler_options"})


_entries = cache.new_store()     # (options key, closure key) -> _Entry
_compat.register_cache(cache._jax_handle, "jax_closure_cache entries")
_canonical = cache.new_store()   # (options key, function key) -> _Canonical
_unliftable: "weakref.WeakSet[types.CodeType]" = weakref.WeakSet()
cache.register_clear_hook(_unliftable.clear)

# The hot path's inline cache: code object -> the last few stored entries of
# top-level functions with that code, each with a quick_matcher for its key.
# Entries are held weakly, so an entry evicted from _entries is gone here too.
_QUICK_PER_CODE = 4
_quick: dict[types.CodeType, list["_Quick"]] = {}
cache.register_clear_hook(_quick.clear)
# Code objects whose keys have non-simple parts (nested functions, objects):
# building a matcher for them fails, so it is not retried.
_no_quick: "weakref.WeakSet[types.CodeType]" = weakref.WeakSet()
cache.register_clear_hook(_no_quick.clear)


class _Quick:
  __slots__ = ("options_key", "key", "match", "entry", "source")

  def __init__(self, options_key, key, source, entry):
    self.options_key = options_key
    self.key = key
    self.source = source   # the matcher's checks, for the fast front
    self.match = matchers.compile_matcher(source)
    self.entry = weakref.ref(entry)


_quick_ids = itertools.count()


def _remember_quick(table: dict, fun, key, entry) -> bool:
  """Add a matcher for ``key`` (of plain function ``fun``) to ``table``'s
  row for ``fun.__code__``; False if ``key`` has no matcher."""
  source = matchers.match_source(fun, key[1],
                                      f"Q{next(_quick_ids)}_K")
  if source is None:
    return False
  code = fun.__code__
  quick = [q for q in table.get(code, ()) if q.key != key and q.entry() is not None]
  quick.insert(0, _Quick(key[0], key, source, entry))
  del quick[_QUICK_PER_CODE:]
  if len(table) >= 1 << 16:   # code made by exec in a loop: start over
    table.clear()
  table[code] = quick
  if table is _quick:
    _refresh_front(code, quick)
  return True


# The fast front (closure_front): code object -> the ClosureJitted subclass
# whose generated __call__ matches that code's stored keys of the hot spec
# inline. jit(fun) makes its wrapper of that class. Bounded: a code past the
# bound, or whose keys have no front, gets the generic class.
_FRONTS_MAX = 1024
_fronts: dict[types.CodeType, type] = {}
cache.register_clear_hook(_fronts.clear)


def _refresh_front(code, quick: list) -> None:
  spec = _hot_spec[0]
  mine = [(q.key, q.source, q.entry) for q in quick
          if q.options_key is spec.key]
  cls = (generated.front_class(ClosureJitted, spec, code, mine, _HIT_ENV)
         if mine else None)
  if cls is None:
    _fronts.pop(code, None)
    return
  if code not in _fronts and len(_fronts) >= _FRONTS_MAX:
    _fronts.clear()
  _fronts[code] = cls


class _Defaults:
  lift_numpy = settings.read(settings.LIFT_NUMPY)
  auto_dynamic = settings.read(settings.AUTO_DYNAMIC)


def set_auto_dynamic_default(value: bool) -> None:
  """Default of ``jit(..., auto_dynamic=...)`` (``enable(auto_dynamic=...)``)."""
  _Defaults.auto_dynamic = bool(value)
  _update_hot_spec()


def auto_dynamic_default() -> bool:
  return _Defaults.auto_dynamic


def set_lift_numpy_default(value: bool) -> None:
  """Default of ``jit(..., lift_numpy=...)`` (``enable(lift_numpy=...)``)."""
  _Defaults.lift_numpy = bool(value)
  _update_hot_spec()


def lift_numpy_default() -> bool:
  return _Defaults.lift_numpy


def _calling_function():
  """The callable whose entry is being called on this thread: ``self._fun``
  of the nearest ClosureJitted frame (``_CALLERS``) on the stack.

  The shared lifted function rebuilds *this* callable at trace time, so a
  trace reads the caller's current objects, never a stale exemplar. Read
  from the stack only when tracing, so a hit stores and clears nothing, and
  nothing of the call outlives it.
  """
  frame = sys._getframe(2)
  while frame is not None:
    code = frame.f_code
    if code in _CALLERS or code.co_filename == generated.FILENAME:
      return frame.f_locals["self"]._fun
    frame = frame.f_back
  raise AssertionError("a shared lifted function traced outside a call")


_CALLERS: set = set()   # filled below ClosureJitted
_DISABLE_JIT = _compat.DISABLE_JIT
_JaxArray = _compat.jax.Array
_analyse = closure.analyse
_counters = cache.counters
# Read as an attribute on the hot path (``clear_event_listeners`` rebinds it).
_monitoring_module = _compat.monitoring_module
_record_event = diagnostics.jax.monitoring.record_event


class _Entry(cache.Entry):
  """One shared executable: a stock jitted lifted function and its guards."""
  __slots__ = ("jitted", "anchors", "guards", "traces", "checked", "record",
               "avals", "dynamic", "static", "_used", "_swept")

  def __init__(self):
    self.record = diagnostics.Record(0.0)   # hits; replaced when stored
    super().__init__()
    self.jitted = None
    self.anchors: list = []
    self.guards: list = []
    self.traces = 0    # incremented inside every trace of the lifted function
    self.checked = 0   # value of ``traces`` when the guards were derived
    self.avals: list = []   # the lifted leaves' types at the last trace
    self.dynamic = None     # ordinals of the scalars passed as arguments
    self.static = None      # the arguments' static parts, described (explain)

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


def hold_weakly(store: cache.LRUStore, key, entry, anchors: list):
  """What ``entry`` keeps of the objects whose ids are in ``key``: weak
  references whose death drops the entry from ``store`` (so no id in a
  stored key can be reused, and the cache never extends an object's life),
  and module globals dicts, held as they are (a dict cannot be weakly
  referenced; a module's namespace lives as long as its module).

  Returns the list, or a string saying which anchor cannot be held weakly
  (then the entry must not be stored).
  """
  entry_ref = weakref.ref(entry)

  def drop(_, key=key):
    e = entry_ref()
    if e is not None:
      store.discard_entry(key, e)

  held = []
  for obj in anchors:
    if type(obj) is dict:
      held.append(obj)
      continue
    try:
      held.append(weakref.ref(obj, drop))
    except TypeError:
      if _library_object(obj):
        held.append(obj)
        continue
      return (f"a {type(obj).__name__} kept by identity cannot be weakly "
              "referenced, so storing it would keep it alive")
  return held


def _spans_processes(leaves) -> bool:
  """Whether a lifted array spans devices of other processes: stock cannot
  close over it at all (it raises), so even the first function object of a
  code takes the shared entry, which passes it as an argument."""
  for x in leaves:
    if isinstance(x, _JaxArray) and not x.is_fully_addressable:
      return True
  return False


def _library_object(obj) -> bool:
  """An instance of a JAX, NumPy or standard-library class that is not an
  array (a ``jax.default_matmul_precision`` decorator's state, reached
  through the decorated function's closure): library code's own object,
  held as module globals are; it holds none of the user's data."""
  t = type(obj)
  return (not isinstance(obj, (_JaxArray, np.ndarray))
          and closure._stable_module(getattr(t, "__module__", None)))


def _freeze(v):
  if isinstance(v, list):
    return tuple(_freeze(x) for x in v)
  if isinstance(v, dict):
    return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
  return v


_ARG_SELECTORS = frozenset({"static_argnums", "static_argnames",
                            "donate_argnums", "donate_argnames"})


def _has_static_arguments(options: dict) -> bool:
  """Whether the jit options name static arguments (their values are then
  passed as they are, not traced)."""
  return "static_argnums" in options or "static_argnames" in options


def _check_option_names(options: dict) -> None:
  """Stock's TypeError for a keyword ``jax.jit`` does not take."""
  for name in options:
    if name == "fun":
      raise TypeError("jit() got some positional-only arguments passed as "
                      "keyword arguments: 'fun'")
    if name not in JIT_OPTIONS:
      raise TypeError(f"jit() got an unexpected keyword argument {name!r}")


def _options_key(options: dict) -> tuple:
  """Options as a hashable key; ``1`` and ``(1,)`` (or ``"n"`` and
  ``("n",)``) select the same arguments, so they give the same key."""
  _check_option_names(options)
  key = tuple(sorted(
      (k, (v,) if k in _ARG_SELECTORS and isinstance(v, (int, str)) else _freeze(v))
      for k, v in options.items()))
  hash(key)   # TypeError here means the options cannot key a cache
  return key


def _shift(argnums):
  """Positional indices after prepending the leaves argument."""
  if argnums is None:
    return None
  if isinstance(argnums, int):
    return argnums + 1 if argnums >= 0 else argnums
  return tuple(i + 1 if i >= 0 else i for i in argnums)


def _code_of(fun) -> types.CodeType | None:
  while True:
    if isinstance(fun, types.FunctionType):
      return fun.__code__
    if isinstance(fun, functools.partial):
      fun = fun.func
    elif isinstance(fun, types.MethodType):
      fun = fun.__func__
    elif isinstance(fun, ClosureJitted):
      fun = fun._fun
    else:
      method = closure.as_method(fun)   # a callable object's __call__
      if method is None:
        return None
      fun = method


class _SourceStub:
  """What ``jax`` reads for source info (``__code__``, ``__name__``) without
  holding the user's function, whose closure holds arrays."""
  __slots__ = ("__code__", "__name__")

  def __init__(self, code, name):
    self.__code__ = code
    self.__name__ = name


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


def _make_lifted_jit(fun, entry: _Entry, options: dict, lift_numpy: bool,
                     n_args: int):
  """Stock ``jax.jit`` of a function that takes the lifted leaves first."""
  entry_ref = weakref.ref(entry)
  # Static arguments are passed as they are, so pjit's signature for the
  # user's function would differ: such entries trace on their own.
  shares_traces = not _has_static_arguments(options)

  def lifted(leaves, /, *args, **kwargs):
    current = _calling_function()
    e = entry_ref()
    a = closure.analyse(current, lift_numpy, True,
                        None if e is None else e.dynamic)
    if len(a.leaves) != len(leaves):
      raise AssertionError("closure layout changed between key and trace")
    if e is not None:
      avals = [getattr(x, "aval", None) for x in leaves]
      static = e.static
      if diagnostics.explaining():
        # the arguments' static parts, described (never held: they may hold
        # the user's functions)
        static = diagnostics.describe_static_parts((args, kwargs))
      if e.traces:
        events.retrace(current, a.key, e.avals, avals, e.static, static)
      e.static = static
      e.avals = avals
      e.traces += 1
    # The rebuilt function shares the user's cells and objects: a trace-time
    # side effect that stores a traced value there is undone, and the call
    # answered by stock (the closure key's TracerLeak).
    watch = closure.state_watch(current)
    try:
      out = None
      if shares_traces and not any(
          [type(x) is int or type(x) is float for x in a.leaves]):
        # through the trace lookup's store, so .trace/.lower find this trace
        # (its key bakes Python scalars: auto-dynamic ones are traced here)
        out = trace_lookup.call_shared(current, a, leaves, args, kwargs)
      if out is None:
        out = rebuild.rebuild(current, a.key, leaves)(*args, **kwargs)
    except BaseException:
      watch.check()
      raise
    watch.check()
    return out

  trace_lookup.own_code(lifted.__code__)
  name = getattr(fun, "__name__", None) or type(fun).__name__
  lifted.__name__ = name
  lifted.__qualname__ = getattr(fun, "__qualname__", name)
  lifted.__signature__ = _lifted_signature(fun)
  code = _code_of(fun)
  if code is not None:
    lifted.__wrapped__ = _SourceStub(code, name)
  shifted = dict(options)
  if "static_argnums" in shifted:
    shifted["static_argnums"] = _shift(shifted["static_argnums"])
  if "donate_argnums" in shifted:
    shifted["donate_argnums"] = _shift(shifted["donate_argnums"])
  if "in_shardings" in shifted:
    # The leaves' sharding is left unspecified (None): a committed leaf
    # keeps its own, an uncommitted one is placed as stock places the
    # constant it would have baked. One sharding for every argument is
    # spelled out for the entry's first call; a later call with another
    # number of arguments fails there and is answered by stock.
    user = shifted["in_shardings"]
    if not isinstance(user, (tuple, list)):
      user = (user,) * n_args
    shifted["in_shardings"] = (None, *user)
  return _compat.STOCK_JIT(lifted, **shifted)


#: A function object whose first call hit a shared lifted entry keeps calling
#: that entry, with the arrays it read then, as stock would keep its first
#: trace. After this many calls times arrays (a closure over 256 arrays or
#: more at its second call) it is long-lived: it gets stock's own executable
#: (arrays baked), which is faster per call when it closes over many arrays.
#: Stock pays that compile at the first call, so the total is never more
#: than stock's.
PROMOTE_AFTER_CALLS = 256


# What the first call of one function object (under one set of options)
# decided, for all its later calls; stock keys its caches on the object too.
# A row is either
#
# * a weak reference to a stock jitted object of the function ("owned":
#   stock traced it, so it is stock's from then on; when that object is
#   gone, a new stock ``jax.jit`` of the function finds stock's own trace of
#   it, as stock would), or
# * a list ``[entry, key, leaves, calls]`` ("pinned"): the shared entry its
#   first call used, the full key it was found under, the arrays it read
#   then, and how many calls it has had since.
#
# Rows refer neither to the function nor, once it dies, to anything of it.
_OWNED = weakref.ReferenceType

# options key -> {weakref(function object): row}. Each weak reference's
# callback is its table's own ``pop``, so a row goes, with no Python frame of
# ours, the moment its function object dies (a dead reference keeps its hash
# and equals only itself). Tables are emptied, never replaced.
_tables: dict[tuple, dict] = {}
_ref = weakref.ref
_getweakrefcount = weakref.getweakrefcount
# Without reference counts (not CPython), every hit records its row.
_getrefcount = getattr(sys, "getrefcount", lambda _: _LONE_REFS + 1)
# References to a function held by a wrapper alone, as counted in the hot
# path: the wrapper's slot, the local name, getrefcount's argument.
_LONE_REFS = 3


def _table(options_key) -> dict:
  table = _tables.get(options_key)
  if table is None:
    table = _tables.setdefault(options_key, {})
  return table


def _clear_tables() -> None:
  for table in list(_tables.values()):
    table.clear()


cache.register_clear_hook(_clear_tables)
# Auto-dynamic scalars, per (function code, user code, options key): the
# verified ordinals of one key structure, those that stay static, and the
# key of the last miss (``auto_dynamic``). Keys hold no arrays.
_DYNAMIC_MAX = 1 << 12   # codes made in a loop: start over past this

# Code objects that have had one function object jitted: the first object of
# a code is stock's; the second compiles the shared lifted entry.
_codes_seen: "weakref.WeakSet[types.CodeType]" = weakref.WeakSet()
cache.register_clear_hook(_codes_seen.clear)


def first_object_of_code(code: types.CodeType) -> bool:
  """Whether this is the first time a function object of ``code`` is seen
  (recording it): the first object of a code is stock's (identity first)."""
  if code in _codes_seen:
    return False
  _codes_seen.add(code)
  return True


# The package's own closures made afresh for a user's function (never a
# user's long-lived object): they take the shared entry from their first call.
ALWAYS_SHARED: set[types.CodeType] = set()


def _row_of(fun, options_key):
  table = _tables.get(options_key)
  if table is None:
    return None
  try:
    return table.get(_ref(fun))
  except TypeError:   # not weakly referenceable, or unhashable
    return None


def _remember(table: dict, fun, row) -> None:
  try:
    table[_ref(fun, table.pop)] = row
  except TypeError:   # not weakly referenceable, or unhashable: no row
    pass


def _direct(wrapper, owned) -> None:
  """Make calls of ``wrapper`` go straight to stock's ``owned``: a class of
  its own whose ``__call__`` is ``owned`` itself, so no Python frame of ours
  runs (within a few percent of calling stock's object). Done only for a
  wrapper called twice, i.e. a long-lived one."""
  cls = type(wrapper)
  direct = type(cls.__name__, (cls,), {
      "__slots__": (), "__call__": staticmethod(owned),
      "__del__": _drop_direct, "__module__": cls.__module__,
      "__qualname__": cls.__qualname__, "_direct": True})
  wrapper.__class__ = direct


def _drop_direct(self) -> None:
  # A class is freed only by the cycle collector; the stock object it names
  # (and the arrays that object's function closes over) must not wait for it.
  try:
    type(self).__call__ = ClosureJitted.__call__
  except Exception:
    pass


class _Spec:
  """The options of a jitted function, shared by every wrapper made with
  them (one lookup per ``jit()``; compared by identity on the hot path).

  ``key`` is the options key with ``lift_numpy``; ``table`` the identity
  rows for these options. Lifting adds an argument, for which a user-given
  ``in_shardings`` gains an unspecified sharding (``_make_lifted_jit``).
  """
  __slots__ = ("options", "key", "lift_numpy", "table",
               "auto_dynamic")

  def __init__(self, options, key, lift_numpy, auto_dynamic):
    self.options = options
    self.key = key
    self.lift_numpy = lift_numpy
    self.auto_dynamic = auto_dynamic
    self.table = _table(key)


_specs: dict[tuple, _Spec] = {}


def _spec(options: dict, options_key: tuple, lift_numpy: bool,
          auto_dynamic: bool) -> _Spec:
  key = (options_key, lift_numpy, auto_dynamic)
  spec = _specs.get(key)
  if spec is None:
    if len(_specs) >= 1 << 12:   # options built afresh in a loop
      _specs.clear()
    spec = _specs.setdefault(key, _Spec(options, key, lift_numpy, auto_dynamic))
  return spec


class ClosureJitted:
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
  __slots__ = ("_fun", "_code", "_spec", "_stock", "_row", "__weakref__")
  _direct = False

  def __init__(self, fun, options: dict, options_key: tuple,
               lift_numpy: bool, auto_dynamic: bool | None = None):
    self._fun = fun
    # Top-level plain functions may take the inline cache (_quick).
    self._code = fun.__code__ if type(fun) is types.FunctionType else None
    if auto_dynamic is None:
      auto_dynamic = _Defaults.auto_dynamic
    self._spec = (_specs.get((options_key, lift_numpy, auto_dynamic))
                  or _spec(options, options_key, lift_numpy, auto_dynamic))
    self._stock = None
    self._row = None   # this function object's row, once called

  # -- what jax.jit's result offers ------------------------------------------
  @property
  def __wrapped__(self):
    self._publish_row()
    return self._fun

  def _publish_row(self) -> None:
    """Record this wrapper's row in the identity table, where another
    wrapper of the same function object finds it (the hot path records it
    only when something besides this wrapper holds the function)."""
    row = self._row
    if type(row) is list:
      try:
        self._spec.table.setdefault(_ref(self._fun, self._spec.table.pop), row)
      except TypeError:
        pass

  @property
  def __name__(self):
    return getattr(self._fun, "__name__", type(self._fun).__name__)

  def __repr__(self):   # as stock's, for a drop-in
    return f"<PjitFunction of {self._fun!r}>"

  def __getstate__(self):
    """Stock's state (``function_name`` ...), for introspection."""
    return self.stock().__getstate__()

  def __reduce__(self):
    self._publish_row()
    return (_join, (self._spec.key, self._fun))

  def _cache_size(self) -> int:
    """Executables compiled for this function object."""
    row = self._row or _row_of(self._fun, self._spec.key)
    if row is None:
      return 0
    if type(row) is _OWNED:
      return self.stock()._cache_size()
    return row[0].jitted._cache_size()

  def __get__(self, obj, objtype=None):
    return self if obj is None else types.MethodType(self, obj)

  def _dynamic_key(self):
    return (_code_of(self._fun), _code_of(self._user()), self._spec.key)

  def _make_dynamic(self, key, a, args, kwargs):
    """On a miss whose key differs from the last miss of the same code only
    in Python int/float values, pass those values as arguments from now on,
    if verification shows that tracing them as arguments traces what
    baking them does (``_auto_dynamic.verify``). Returns the new (key,
    analysis), or None."""
    spec = self._spec
    if not spec.auto_dynamic:
      return None
    dk = self._dynamic_key()
    previous = _auto_dynamic.last_key(dk)
    if previous is None:
      return None
    ordinals = _auto_dynamic.candidates(dk, previous[1], key[1])
    if ordinals is None:
      return None
    try:
      dyn = _analyse(self._fun, spec.lift_numpy, True, ordinals)
    except (Uncacheable, TypeError):
      return None
    why = _auto_dynamic.verify(self._fun, dyn, key[1], previous[1], ordinals,
                              args, kwargs)
    _auto_dynamic.decide(dk, key[1], ordinals, why is None)
    if why is not None:
      diagnostics.stays_static(self._user(), previous, key, why)
      return None
    if diagnostics.explaining():
      diagnostics.became_dynamic(self._user(), previous, key)
    return (spec.key, dyn.key), dyn

  def _remember_last_key(self) -> None:
    """After a miss's call, the key of the state it left, for the next miss
    of this code to compare with. The state after the call, not before: a
    counter the trace itself bumps (``nonlocal n; n += 1``, ``count[0] +=
    1``) is then equal in both, so it never becomes dynamic, and the trace-
    time side effect keeps reaching the user's own cell, as with stock."""
    spec = self._spec
    if not spec.auto_dynamic:
      return
    try:
      after = _analyse(self._fun, spec.lift_numpy)
      _auto_dynamic.remember_last_key(self._dynamic_key(),
                                     (spec.key, after.key))
    except (Uncacheable, TypeError):
      pass

  def _user(self):
    """The user's function whose code and location diagnostics report, and
    whose code decides first-object-is-stock's (a launcher overrides it: its
    own code is shared by every loop)."""
    return self._fun

  def stock(self):
    """Stock ``jax.jit`` of the user's own function (made once)."""
    s = self._stock
    if s is None:
      s = self._stock = _compat.STOCK_JIT(self._fun, **self._spec.options)
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
    try:
      lowered = entry.jitted.lower(leaves, *args)
    except Exception:   # a new signature whose lifted trace fails: stock's
      return self.stock().lower(*args, **kwargs)
    return trace_lookup.lowered_with_leaves(lowered, leaves)

  def _entry_for_aot(self, kwargs):
    """``(entry, leaves)`` whose entry's lowering ``.lower`` may use: this
    wrapper's pinned row, or the stored, guard-free entry of its function's
    key; None for anything stock answers (a function object stock owns,
    options, keyword arguments, or no entry)."""
    if kwargs or self._spec.options or _DISABLE_JIT.value:
      return None
    row = self._row or _row_of(self._fun, self._spec.key)
    if row is not None:
      return (row[0], row[2]) if type(row) is list else None
    try:
      a, _, entry = self._stored()
    except (Uncacheable, TypeError):
      return None
    if entry is None or entry.guards:
      return None
    return entry, a.leaves

  def _stored(self):
    """``(analysis, key, stored entry or None)`` of this wrapper's function.
    Raises ``Uncacheable``, or TypeError for unhashable pytree metadata."""
    dk = self._dynamic_key() if self._spec.auto_dynamic else None
    dynamic = None if dk is None else _auto_dynamic.verified(dk)
    a = _analyse(self._fun, self._spec.lift_numpy, True, dynamic)
    if dynamic is not None and not _auto_dynamic.mask_for(dk, a.key):
      # the mask is another structure's: this key bakes its scalars
      a = _analyse(self._fun, self._spec.lift_numpy, True, None)
    key = (self._spec.key, a.key)
    return a, key, _entries.get(key)

  def trace(self, *args, **kwargs):
    return self.stock().trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self.stock().eval_shape(*args, **kwargs)

  def clear_cache(self):
    self.stock().clear_cache()

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
            if entry is not None and not entry.guards:
              return _hit(self, fun, q.key, entry, leaves, args, kwargs)
    return self._call_slow(args, kwargs)

  def _call_entry(self, entry, key, leaves, args, kwargs):
    """The shared jitted function of ``entry``, reading ``self._fun``."""
    try:
      out = entry.jitted(leaves, *args, **kwargs)
    except Exception as e:
      return self._retry_stock(key, args, kwargs, e)
    if entry.traces != entry.checked:   # traced a new signature
      self._store(key, entry, leaves, args, kwargs)
    return out

  def _call_again(self, row, args, kwargs):
    """A later call of this wrapper: its function object is long-lived."""
    if type(row) is _OWNED:
      owned = self._stock_of(row)
      _direct(self, owned)
      return owned(*args, **kwargs)
    return self._call_row(row, args, kwargs)

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
    if type(row) is not _OWNED:
      # Each call with the entry passes the leaves as arguments, about a
      # microsecond per array more than stock's baked executable: the more
      # arrays, the sooner a long-lived object is worth stock's compile.
      row[3] += len(row[2]) or 1
      if row[3] >= PROMOTE_AFTER_CALLS:
        row = self._promote(row)
    if type(row) is _OWNED:
      return self._stock_of(row)(*args, **kwargs)
    if _DISABLE_JIT.value:
      return self._fun(*args, **kwargs)
    return self._call_entry(row[0], row[1], row[2], args, kwargs)

  def _promote(self, row):
    """Give a long-lived object stock's own executable, if its closure still
    reads what its first call read (else stock's trace would differ from the
    one it has been answered by, so it stays on the entry)."""
    entry, key, leaves, _ = row
    try:
      a = _analyse(self._fun, self._spec.lift_numpy, True,
                   entry.dynamic)
      same = (a.key == key[1] and len(a.leaves) == len(leaves)
              and all(x is y for x, y in zip(a.leaves, leaves)))
    except (Uncacheable, TypeError):
      same = False
    if not same:
      row[3] = -(1 << 62)   # never ask again
      return row
    return self._own()

  def _pin(self, entry, key, leaves) -> None:
    self._row = row = [entry, key, leaves, 0]
    _remember(self._spec.table, self._fun, row)

  def _own(self):
    """Hand this function object to stock for good; returns its row."""
    self._row = row = _ref(self.stock())
    _remember(self._spec.table, self._fun, row)
    return row

  def _call_slow(self, args, kwargs):
    """First call of a function object: build the key, look it up, and hit,
    miss or fall back."""
    fun = self._fun
    if _DISABLE_JIT.value:
      return fun(*args, **kwargs)
    try:
      a, key, entry = self._stored()
    except Uncacheable as e:
      return self._fallback(e.reason, args, kwargs, e.detail)
    except TypeError as e:   # unhashable pytree metadata in the key
      return self._fallback("unhashable", args, kwargs, str(e))
    if entry is None or (entry.guards and
                         not all([g.holds() for g in entry.guards])):
      return self._miss(key, a, args, kwargs)
    if (self._code is not None and not entry.guards
        and self._code not in _no_quick
        and len(_quick.get(self._code, ())) < _QUICK_PER_CODE):
      if not _remember_quick(_quick, fun, key, entry):
        _no_quick.add(self._code)   # its keys are not simple: stop trying
    events.hit(entry.record)
    self._pin(entry, key, a.leaves)
    return self._call_entry(entry, key, a.leaves, args, kwargs)

  def _fallback(self, reason: str, args, kwargs, detail: str = ""):
    events.fallback(self._user(), _code_of(self._user()), reason, detail)
    self._own()
    return self.stock()(*args, **kwargs)

  def _retry_stock(self, key, args, kwargs, error=None):
    """Answer with stock's outcome; remember the code if only lifting failed
    (or, if it passed scalars as arguments, that those stay static)."""
    self._own()
    out = self.stock()(*args, **kwargs)   # stock's error propagates as is
    _entries.discard(key)
    code = _code_of(self._user())
    leak = _tracer_leak(error)
    if leak is not None:
      if code is not None:
        _unliftable.add(code)
      events.fallback(
          self._user(), code, "tracer_leak",
          "the lifted trace stored a traced value in state reached through "
          "the closure (a value built at trace time from a lifted array); "
          "what it overwrote was put back, and this code is traced as stock "
          "traces it from now on")
      return out
    dynamic = closure.dynamic_ordinals(key[1])
    if dynamic:
      _auto_dynamic.never(self._dynamic_key(), key[1], dynamic)
      events.fallback(
          self._user(), code, "trace_error",
          "tracing with a Python scalar passed as an argument failed (it is "
          "needed as a concrete value: a shape, a bound, a Python if); it "
          "stays static for this code")
      return out
    if code is not None:
      _unliftable.add(code)
    events.fallback(self._user(), code, "trace_error",
                    "tracing with lifted arrays failed where stock did not")
    return out

  def _miss(self, key, a, args, kwargs):
    code = _code_of(self._user())
    if (code is not None and code not in _codes_seen
        and code not in ALWAYS_SHARED and not _spans_processes(a.leaves)):
      # The first function object of this code is stock's: a long-lived
      # function keeps stock's executable and speed. Only a second object
      # of the same code (a re-created closure) compiles the shared entry.
      _codes_seen.add(code)
      started = time.perf_counter()
      self._own()
      out = self.stock()(*args, **kwargs)
      self._remember_last_key()
      events.miss(self._user(), code, key, time.perf_counter() - started,
                  first_object=True)
      return out
    if code is not None and code in _unliftable:
      return self._fallback(
          "unliftable", args, kwargs,
          "an earlier lifted trace of this code failed or stored a traced "
          "value where stock's did not, so stock traces it")
    made = self._make_dynamic(key, a, args, kwargs)
    if made is not None:
      key, a = made
      entry = _entries.get(key)
      if entry is not None and not entry.guards:   # another value's entry
        events.hit(entry.record)
        self._pin(entry, key, a.leaves)
        return self._call_entry(entry, key, a.leaves, args, kwargs)
    baked = next((x for x in a.anchors if isinstance(x, _JaxArray)), None)
    if baked is not None:
      # An array kept by identity (committed to a device, or inside an
      # object) is baked into the trace: a stored entry would keep it alive.
      return self._fallback(
          "array_by_identity", args, kwargs,
          f"a {key_guards.describe_array(baked)} array is kept by identity "
          "(committed, or inside an object) and would be baked into a shared "
          "executable that keeps it alive")
    self.stock()   # made now: validates the options as stock jit() would
    entry = _Entry()
    entry.anchors = a.anchors   # keeps the ids in ``key`` from being reused
    entry.dynamic = a.dynamic
    entry.jitted = _make_lifted_jit(self._fun, entry, self._spec.options,
                                    self._spec.lift_numpy, len(args))
    started = time.perf_counter()
    try:
      # .trace() fills JAX's _infer_params cache, so the call below compiles
      # without tracing again; the Traced object yields the captured consts.
      traced = entry.jitted.trace(a.leaves, *args, **kwargs)
      out = entry.jitted(a.leaves, *args, **kwargs)
    except Exception as e:
      return self._retry_stock(key, args, kwargs, e)
    cost = time.perf_counter() - started   # trace + compile + first run
    # a miss is counted when stored or not stored (below): a failed trace
    # counts as a fallback alone
    self._pin(entry, key, a.leaves)
    self._store(key, entry, a.leaves, args, kwargs, traced, cost)
    return out

  def _store(self, key, entry: _Entry, leaves, args, kwargs,
             traced=None, cost: float | None = None) -> None:
    """Store ``entry`` under ``key`` (the state the trace started from) with
    fresh guards, or drop it.

    The closure is analysed again after tracing, for the guard roots. A
    trace that mutated the closure (a trace counter in a list, a
    ``nonlocal``) leaves the entry under the state it started from: a fresh
    closure in that state would trace the same way. ``traced`` is the miss
    path's own trace; without it (a call that traced a new signature) the
    entry is asked for it again, which JAX answers from its cache.
    """
    _entries.discard(key)
    self._remember_last_key()   # after every trace, a miss's or a hit's
    if cost is not None:   # a miss, not a re-derivation after a retrace
      entry.record = events.miss(self._user(), _code_of(self._user()), key,
                                 cost)
    try:
      after = closure.analyse(self._fun, self._spec.lift_numpy,
                              True, entry.dynamic)
    except Uncacheable as e:
      events.not_stored(self._user(), "uncacheable_after_trace", e.detail)
      return
    if len(after.leaves) != len(leaves):
      events.not_stored(self._user(), "layout_changed",
                        "the trace changed how many arrays the closure holds")
      return
    if traced is None:
      try:
        traced = entry.jitted.trace(leaves, *args, **kwargs)
      except Exception as e:
        events.not_stored(self._user(), "retrace_failed",
                          f"tracing the new signature again failed: {e!r}")
        return
    captured = _compat.captured_constants(traced)
    covered = {id(x) for x in after.anchors}
    guards = key_guards.find_guards(captured, after.roots, covered)
    if (isinstance(guards, key_guards.Unguarded)
        and not _has_static_arguments(self._spec.options)):
      # constants the trace made itself from what the key covers
      made = key_guards.made_by_trace(self._fun, after, args, kwargs,
                                          captured, covered)
      if made:
        guards = key_guards.find_guards(captured, after.roots,
                                            covered | made)
    if isinstance(guards, key_guards.Unguarded):
      events.not_stored(self._user(), "untracked_capture", guards.detail)
      return
    held = hold_weakly(_entries, key, entry,
                        entry.anchors + after.anchors if cost is not None
                        else after.anchors)
    if isinstance(held, str):
      events.not_stored(self._user(), "unweakrefable_anchor", held)
      return
    entry.anchors = held
    entry.guards = guards
    entry.checked = entry.traces
    try:
      _entries.put(key, entry)
    except TypeError as e:
      events.not_stored(self._user(), "unhashable", str(e))
      return
    if self._code is not None and not guards and self._code not in _no_quick:
      if not _remember_quick(_quick, self._fun, key, entry):
        _no_quick.add(self._code)


def _tracer_leak(error):
  """The closure key's ``TracerLeak`` behind ``error``, if any (JAX may
  re-raise an exception from inside a trace with it as the cause)."""
  seen = 0
  while error is not None and seen < 8:
    if isinstance(error, trace_lookup.closure_key.TracerLeak):
      return error
    error = error.__cause__ or error.__context__
    seen += 1
  return None


_HIT_ENV = {"MONITORING": _monitoring_module,
            "RECORD_EVENT": _record_event, "getrefcount": _getrefcount,
            "getweakrefcount": _getweakrefcount, "REF": _ref,
            "LONE_REFS": _LONE_REFS}
_hit = generated.hit_function(_HIT_ENV)

# The frames in which a shared lifted function may trace; each has ``self``
# (the fast front's and _hit's are recognised by their filename).
_CALLERS.update({ClosureJitted.__call__.__code__,
                 ClosureJitted._call_entry.__code__,
                 ClosureJitted.lower.__code__,
                 ClosureJitted._miss.__code__, ClosureJitted._store.__code__})


def _split(w: ClosureJitted):
  w._publish_row()   # the walk may hand its function to a new wrapper
  return w._spec.key, w._fun


def _join(static, fun) -> ClosureJitted:
  options_key, lift_numpy, auto_dynamic = static
  options = dict(options_key)
  if "compiler_options" in options:   # frozen to pairs by _options_key
    options["compiler_options"] = dict(options["compiler_options"])
  cls = (static_args.StaticArgsJitted if "static_argnums" in options
         or "static_argnames" in options else ClosureJitted)
  return cls(fun, options, options_key, lift_numpy, auto_dynamic)


closure.register_wrapper(ClosureJitted, _split, _join)


# -- canonical stock objects for closure-free functions --------------------

class _Canonical(cache.Entry):
  """A canonical stock jitted object and the anchors of its key."""
  __slots__ = ("jitted", "anchors", "record")

  def __init__(self, jitted, anchors, record):
    super().__init__()
    self.jitted = jitted
    self.anchors = anchors
    self.record = record


_canonical_quick: dict[types.CodeType, list[_Quick]] = {}
cache.register_clear_hook(_canonical_quick.clear)
_canonical_functions: "weakref.WeakSet[types.FunctionType]" = weakref.WeakSet()
cache.register_clear_hook(_canonical_functions.clear)


_canonical_last: dict[tuple, tuple] = {}   # (code, options) -> last key
cache.register_clear_hook(_canonical_last.clear)


def _scalars_keep_changing(fun, fun_key, options, options_key,
                           lift_numpy) -> bool:
  """Whether a closure-free function's key differs from the last one of its
  code only in Python int/float globals (a schedule read from a module
  global). Then its code is handed to ClosureJitted, which passes them as
  arguments: the code counts as seen (its first object was stock's) and the
  last key is where ClosureJitted's comparison finds it."""
  code = fun.__code__
  if closure.code_plan(code).writes_globals:
    return False   # a trace that assigns globals changes its own key
  ck = (code, options_key, lift_numpy)
  previous = _canonical_last.get(ck)
  if len(_canonical_last) >= _DYNAMIC_MAX:
    _canonical_last.clear()
  _canonical_last[ck] = fun_key
  if previous is None or previous == fun_key:
    return False
  changed = closure.scalars_that_differ(previous, fun_key)
  spec = _spec(options, options_key, lift_numpy, True)
  if not changed or changed <= _auto_dynamic.never_for((code, code, spec.key),
                                                      fun_key):
    return False
  _codes_seen.add(code)
  if _auto_dynamic.last_key((code, code, spec.key)) is None:
    _auto_dynamic.remember_last_key((code, code, spec.key), (spec.key, previous))
  return True


def _canonical_jitted(fun: types.FunctionType, options: dict,
                      options_key: tuple, lift_numpy: bool,
                      auto_dynamic: bool = False):
  """The shared stock jitted object for ``fun``, or None if it needs lifting."""
  full_options_key = (options_key, lift_numpy)
  row = _row_of(fun, full_options_key)
  if type(row) is _OWNED:
    owned = row()
    if owned is not None:   # identity first: the object it had before
      return owned
  code = fun.__code__
  for q in _canonical_quick.get(code, ()):
    if q.options_key == full_options_key and q.match(fun) is not None:
      found = q.entry()
      if found is not None:
        found.used = True
        events.hit(found.record)
        _remember(_table(full_options_key), fun, _ref(found.jitted))
        return found.jitted
  try:
    a = closure.analyse(fun, lift_numpy)
  except Uncacheable:
    return None
  # Lifting needed; an object kept by identity, whose contents the key does
  # not cover (module-level helpers are walked, so only objects are roots);
  # or an array a shared object would keep alive.
  if (a.leaves or a.roots
      or any(isinstance(x, _JaxArray) for x in a.anchors)):
    return None
  if auto_dynamic and _scalars_keep_changing(fun, a.key, options, options_key,
                                             lift_numpy):
    return None   # a ClosureJitted passes them as arguments
  key = (full_options_key, a.key)
  try:
    found = _canonical.get(key)
  except TypeError:
    return None
  if found is None:
    # Stock caches are keyed on the function object, so a function object
    # that already backs an entry (its globals changed since) gets a private
    # copy; otherwise the user's own function, as stock would hold it.
    own = fun not in _canonical_functions
    _canonical_functions.add(fun)
    jitted = _compat.STOCK_JIT(fun if own else _copy_function(fun), **options)
    # Its compile happens at its first call, inside stock: cost unknown here.
    found = _Canonical(jitted, [], events.miss(fun, code, key, 0.0))
    diagnostics.measure_later(found.record)   # stock compiles at its first call
    held = hold_weakly(_canonical, key, found, a.anchors)
    if isinstance(held, str):
      events.not_stored(fun, "unweakrefable_anchor", held)
    else:
      found.anchors = held
      _canonical.put(key, found)
  else:
    events.hit(found.record)
  # The inline cache skips the helper scan, so only functions that read no
  # module-level helper take it.
  if not a.roots and len(_canonical_quick.get(code, ())) < _QUICK_PER_CODE:
    _remember_quick(_canonical_quick, fun, key, found)
  _remember(_table(full_options_key), fun, _ref(found.jitted))
  return found.jitted


def _copy_function(f: types.FunctionType) -> types.FunctionType:
  g = types.FunctionType(f.__code__, f.__globals__, f.__name__,
                         f.__defaults__, f.__closure__)
  g.__kwdefaults__ = f.__kwdefaults__
  rebuild.copy_function_metadata(f, g)
  return g


_new_wrapper = object.__new__
_FunctionType = types.FunctionType
_HOT_SPECS = {(n, d): _spec({}, (), n, d) for n in (False, True)
              for d in (False, True)}


# The spec of ``jit(fun)`` without options, for the current defaults.
_hot_spec = [_HOT_SPECS[_Defaults.lift_numpy, _Defaults.auto_dynamic]]


def _update_hot_spec() -> None:
  _hot_spec[0] = _HOT_SPECS[_Defaults.lift_numpy, _Defaults.auto_dynamic]
  _fronts.clear()   # each front is of one spec (its class attribute)


def jit(fun: Callable | None = None, /, **options) -> Any:
  """Closure-aware drop-in for ``jax.jit``.

  Takes every keyword of ``jax.jit`` plus ``lift_numpy`` (default: the value
  given to ``enable(lift_numpy=...)`` or ``JAX_CLOSURE_CACHE_LIFT_NUMPY``,
  else False), which passes closed-over numpy arrays as arguments instead of
  baking them, and ``auto_dynamic`` (default: ``enable(auto_dynamic=...)``
  or ``JAX_CLOSURE_CACHE_AUTO_DYNAMIC``, else True), which passes a closed-
  over Python int or float that keeps changing as a weakly typed argument.
  Without ``fun`` it returns a decorator.

  Example::

      >>> import jax.numpy as jnp
      >>> from jax_closure_cache import jit
      >>> def outer(a):
      ...   def inner(x):
      ...     return x * a
      ...   return jit(inner)(2.0)   # one compile for every a of this shape
      >>> float(outer(jnp.float32(3.0))), float(outer(jnp.float32(4.0)))
      (6.0, 8.0)
  """
  if not options and type(fun) is _FunctionType and fun.__closure__:
    # The hot case (a re-created closure, every call): what __init__ does,
    # without its frame.
    cls = _fronts.get(fun.__code__)
    if cls is not None:
      # A front carries its code and the hot spec as class attributes.
      w = _new_wrapper(cls)
      w._fun = fun
      w._stock = w._row = None
      return w
    w = _new_wrapper(ClosureJitted)
    w._fun = fun
    w._code = fun.__code__
    w._spec = _hot_spec[0]
    w._stock = w._row = None
    return w
  lift_numpy = options.pop("lift_numpy", None)
  auto_dynamic = options.pop("auto_dynamic", None)
  if fun is None:
    # stock's keyword-only signature rejects a wrong name at once
    _check_option_names(options)
    return functools.partial(jit, lift_numpy=lift_numpy,
                             auto_dynamic=auto_dynamic, **options)
  if lift_numpy is None:
    lift_numpy = _Defaults.lift_numpy
  if auto_dynamic is None:
    auto_dynamic = _Defaults.auto_dynamic
  try:
    options_key = _options_key(options) if options else ()
  except TypeError as e:
    if "unexpected keyword" in str(e):
      raise
    events.fallback(fun, _code_of(fun), "unhashable_jit_options",
                    f"the jit options cannot key a cache: {e}")
    return _compat.STOCK_JIT(fun, **options)
  if not callable(fun):
    return _compat.STOCK_JIT(fun, **options)   # stock's error
  if _has_static_arguments(options):
    if isinstance(fun, (types.FunctionType, functools.partial,
                        types.MethodType, ClosureJitted)):
      # Functions among the static arguments are keyed by closure key.
      return static_args.StaticArgsJitted(fun, options, options_key,
                                          lift_numpy, auto_dynamic)
  if type(fun) is types.FunctionType and fun.__closure__ is None:
    if not (auto_dynamic and _auto_dynamic.verified(
        (fun.__code__, fun.__code__, (options_key, lift_numpy, True)))):
      jitted = _canonical_jitted(fun, options, options_key, lift_numpy,
                                 auto_dynamic)
      if jitted is not None:
        return jitted
  elif not (isinstance(fun, (types.FunctionType, functools.partial,
                             types.MethodType, ClosureJitted))
            or closure.as_method(fun) is not None):
    return _compat.STOCK_JIT(fun, **options)   # opaque callables: stock
  return ClosureJitted(fun, options, options_key, lift_numpy, auto_dynamic)


# Imported last: it subclasses ClosureJitted.
from jax_closure_cache.front import static_args  # noqa: E402


# The fast front's entrance: ``jit`` itself, or the same in C where the
# extension is built (it makes a front's wrapper without jit's Python frame).
_python_jit = jit
jit = generated.entrance(_python_jit, _fronts, ClosureJitted)


def entrance_built() -> bool:
  """Whether ``jit`` is the C entrance (the extension is optional)."""
  return jit is not _python_jit
