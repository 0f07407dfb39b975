# Copyright 2026 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Closure keys: trace re-created closures once.

``pe.trace_to_jaxpr`` memoizes on the function object, so a closure created
anew on every call (a nested ``def``, a ``lambda`` in a loop, a
``functools.partial``) is traced again every time. With the
``jax_closure_cache`` option on, :func:`trace_to_jaxpr` looks such a function
up by its *closure key* instead: its code, and the values its code reads
(cells, defaults, the globals it names, recursively through the functions
it reaches), with closed-over arrays abstracted to "a leaf".

Invariants:

* Identity first. A function object is answered as the cache on the object
  would answer it: the first object of a key is traced as usual, and an
  object answered once keeps its answer for that signature.
* A trace is shared only between functions whose traces would read the same
  values. Arrays are the exception by design: the shared trace takes them as
  its last constvars (the "leaves"), and each function gets a
  ``ClosedJaxpr`` of that one ``Jaxpr`` closed over its own arrays.
* A function whose key cannot be computed (it closes over a tracer, or over
  an object whose contents the key does not cover), or whose trace with its
  arrays abstracted fails (it needs their values), is traced as usual.
* The cache never keeps a user's array or function alive: it holds shared
  jaxprs and their trace-time constants, and weak references to everything
  whose identity is part of a key.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
import hashlib
import threading
import types
from typing import Any
import weakref

import numpy as np

from jax._src import config
from jax._src import core
from jax._src import monitoring
from jax._src import tree_util
from jax._src import util
from jax._src.lib import _jax

_LEAF = "leaf"      # an array passed to the shared trace
_CYCLE = "cycle"    # a function reached before: (_CYCLE, index)
_EMPTY = "empty"    # an unfilled cell
_MISSING = "missing"  # a name the code reads that the globals lack
_BUDGET = 4096      # values walked per key
_STABLE = frozenset({"jax", "jaxlib", "numpy", "scipy", "builtins",
                     "functools", "operator", "math", "itertools"})


class Unkeyable(Exception):
  """The function's traces may read something a key cannot cover."""


class _Walk:
  """The key of a function and its leaves, in walk order."""

  def __init__(self):
    self.leaves: list[Any] = []
    self.anchors: list[Any] = []   # objects whose id is in the key
    self.memo: dict[int, int] = {}
    self.budget = _BUDGET

  def value(self, v) -> Any:
    self.budget -= 1
    if self.budget < 0:
      raise Unkeyable("too many values")
    t = type(v)
    if t is _jax.ArrayImpl:
      if v._committed and len(v.sharding.device_set) == 1:
        return self.identity(v)   # as an argument it would commit the result
      self.leaves.append(v)
      return _LEAF
    if v is None or t in (bool, int, str, bytes):
      return (t, v)
    if t is float:
      return (t, v.hex())         # 0.0 and -0.0 differ; NaN equals itself
    if t is types.FunctionType:
      if v.__closure__ is None and _is_stable(v):
        return v                  # jax, numpy, the standard library
      return self.function(v)
    if t is functools.partial:
      return ("partial", self.value(v.func), self.values(v.args),
              tuple((k, self.value(a)) for k, a in v.keywords.items()))
    if t is types.ModuleType:
      if _is_stable(v, v.__name__):
        return v
      # its attributes (``cfg.scale``) are read at trace time and may change
      raise Unkeyable(f"reads the user module {v.__name__}")
    if t is weakref.ReferenceType:   # read through: fori_loop holds its body so
      target = v()
      return ("weakref", None if target is None else self.value(target))
    if isinstance(v, core.Tracer):
      raise Unkeyable("closes over a tracer")
    if isinstance(v, np.ndarray) and not v.dtype.hasobject:
      return (np.ndarray, v.dtype.str, v.shape,
              hashlib.sha256(np.ascontiguousarray(v).tobytes()).digest())
    if isinstance(v, np.generic):
      return (t, v.tobytes())
    if t in (tuple, list, dict):
      try:
        leaves, treedef = tree_util.tree_flatten(v)
      except ValueError as e:   # dict keys that do not sort
        raise Unkeyable(f"a {t.__name__} that does not flatten") from e
      return ("tree", treedef, self.values(leaves))
    if isinstance(v, type):
      if _is_stable(v):
        return self.identity(v)
      # class attributes and methods are read at trace time and may change
      raise Unkeyable(f"reads the user class {v.__qualname__}")
    raise Unkeyable(f"closes over a {t.__name__}")

  def values(self, vs) -> tuple:
    return tuple(self.value(v) for v in vs)

  def identity(self, v):
    self.anchors.append(v)
    return ("id", id(v))

  def function(self, f: types.FunctionType):
    index = self.memo.get(id(f))
    if index is not None:
      return (_CYCLE, index)
    index = self.memo[id(f)] = len(self.memo)
    code = f.__code__
    names, writes = _code_names(code)
    if writes:
      raise Unkeyable("assigns to a global")
    cells = tuple(self.value(c.cell_contents) if _filled(c) else _EMPTY
                  for c in f.__closure__ or ())
    defaults = self.values(f.__defaults__ or ())
    kwdefaults = tuple((k, self.value(a))
                       for k, a in (f.__kwdefaults__ or {}).items())
    g = f.__globals__
    self.anchors.append(g)   # its id is in the key
    reads = tuple(self.value(g[n]) if n in g else _MISSING for n in names)
    return ("fn", index, code, id(g), cells, defaults, kwdefaults, reads)


@util.weakref_lru_cache
def _code_names(code: types.CodeType) -> tuple[tuple[str, ...], bool]:
  """The global names ``code`` (and the code it nests) may read, and whether
  it assigns to a global."""
  import dis
  names, writes, pending = [], False, [code]
  while pending:
    c = pending.pop()
    names.extend(c.co_names)
    writes |= any(i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
                  for i in dis.get_instructions(c))
    pending.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
  return tuple(dict.fromkeys(names)), writes


def _filled(cell) -> bool:
  try:
    cell.cell_contents
  except ValueError:
    return False
  return True


def _is_stable(f, module=None) -> bool:
  """Whether ``f`` (a function, class or module named ``module``) belongs
  to jax, numpy or the standard library, whose state a program does not
  change: keyed by identity."""
  module = module or getattr(f, "__module__", None)
  return isinstance(module, str) and module.partition(".")[0] in _STABLE


def closure_key(fun: Callable) -> tuple[Any, list[Any], list[Any]]:
  """``(key, leaves, anchors)`` of ``fun``: ``key`` is hashable and equal for
  two functions whose traces read equal values (arrays aside); ``leaves`` are
  the arrays, in the order :func:`rebuild` takes them; ``anchors`` the
  objects whose ids the key holds. Raises :class:`Unkeyable`."""
  w = _Walk()
  key = w.value(fun)
  return key, w.leaves, w.anchors


def rebuild(fun: Callable, key, leaves) -> Callable:
  """``fun`` with the leaves of ``key`` replaced by ``leaves`` (new
  functions and partials where needed; ``fun`` itself is never modified)."""
  it = iter(leaves)
  memo: dict[int, Any] = {}
  keep: list[Any] = []   # rebuilt objects only weak references reach

  def has_leaf(k) -> bool:
    # A function reached a second time is rebuilt wherever it is held, or
    # that holder would call the original, with its arrays as constants.
    return k == _LEAF or (type(k) is tuple and bool(k) and (
        k[0] == _CYCLE or any(map(has_leaf, k))))

  def value(v, k):
    if k == _LEAF:
      return next(it)
    if type(k) is not tuple or not has_leaf(k):
      return v
    if k[0] == _CYCLE:
      return memo.get(k[1], v)
    if k[0] == "partial":
      return functools.partial(value(v.func, k[1]),
                               *map(value, v.args, k[2]),
                               **{n: value(v.keywords[n], kn)
                                  for n, kn in k[3]})
    if k[0] == "tree":
      leaves_, treedef = tree_util.tree_flatten(v)
      return tree_util.tree_unflatten(treedef, list(map(value, leaves_, k[2])))
    if k[0] == "weakref":
      keep.append(value(v(), k[1]))
      return weakref.ref(keep[-1])
    return function(v, k)

  def function(f, k):
    _, index, code, _, cells, defaults, kwdefaults, reads = k
    new_cells = tuple(types.CellType() if has_leaf(ck) else c
                      for c, ck in zip(f.__closure__ or (), cells))
    g = f.__globals__
    if any(map(has_leaf, reads)):
      g = dict(g)                 # the rebuilt function reads its own copy
      for n, rk in zip(_code_names(code)[0], reads):
        if has_leaf(rk):
          g[n] = value(f.__globals__[n], rk)
    new = types.FunctionType(code, g, f.__name__, None, new_cells or None)
    memo[index] = new
    if f.__defaults__:
      new.__defaults__ = tuple(map(value, f.__defaults__, defaults))
    for c, nc, ck in zip(f.__closure__ or (), new_cells, cells):
      if nc is not c:
        nc.cell_contents = value(c.cell_contents, ck)
    if f.__kwdefaults__:
      new.__kwdefaults__ = {n: value(f.__kwdefaults__[n], kn)
                            for n, kn in kwdefaults}
    new.__qualname__ = f.__qualname__
    new.__module__ = f.__module__
    return new

  out = value(fun, key)
  if next(it, None) is not None:
    raise AssertionError("more leaves than the key has")
  if keep:
    out.__closure_key_keep__ = keep   # alive as long as the rebuilt function
  return out


# -- trace-time side effects ----------------------------------------------------

class TracerLeak(Exception):
  """A lifted trace stored a traced value in the user's own state."""


def _reached(v) -> list:
  """What a function's trace may reach from ``v`` and write to."""
  if isinstance(v, (type, types.ModuleType, _jax.ArrayImpl, np.ndarray)):
    return []
  if type(v) is types.FunctionType:
    return [*(v.__closure__ or ()), *(v.__defaults__ or ()),
            *(v.__kwdefaults__ or {}).values()]
  if type(v) is types.CellType:
    return [] if not _filled(v) else [v.cell_contents]
  if type(v) is functools.partial:
    return [v.func, *v.args, *v.keywords.values()]
  if type(v) is types.MethodType:
    return [v.__func__, v.__self__]
  if type(v) in (list, tuple, set, frozenset):
    return list(v)
  if type(v) is dict:
    return list(v.values())
  d = getattr(v, "__dict__", None)
  return list(d.values()) if type(d) is dict else []


def _state(v):
  """The mutable place ``v`` is, as (object, its contents now), or None."""
  if type(v) is types.CellType:
    return v, [v.cell_contents] if _filled(v) else []
  if type(v) is list:
    return v, list(v)
  if type(v) is dict:
    return v, dict(v)
  d = getattr(v, "__dict__", None)
  if type(d) is dict and not isinstance(v, (type, types.ModuleType,
                                            types.FunctionType)):
    return d, dict(d)
  return None


class StateWatch:
  """The cells, lists, dicts and attributes (and, for code that assigns
  globals, the module globals) a function reaches, as they were before a
  lifted trace. The rebuilt function shares them with the user's function,
  so a trace-time side effect reaches them as under stock; :meth:`check`
  undoes every change and raises :class:`TracerLeak` if a new value holds a
  tracer (a helper built at trace time over a lifted array), so that call
  is traced as usual instead."""

  def __init__(self, fun):
    self.places, seen, todo = [], set(), [fun]
    while todo and len(seen) < _BUDGET:
      v = todo.pop()
      if id(v) not in seen:
        seen.add(id(v))
        place = _state(v)
        if place is not None:
          self.places.append(place)
        if type(v) is types.FunctionType and _code_names(v.__code__)[1]:
          self.places.append((v.__globals__, dict(v.__globals__)))
        todo.extend(_reached(v))

  def check(self) -> None:
    if any(_holds_tracer(_new_values(obj, before))
           for obj, before in self._changed()):
      self.restore()
      raise TracerLeak("a lifted trace stored a traced value in the "
                       "closure's state")

  def _changed(self):
    return [(obj, before) for obj, before in self.places
            if _contents(obj) != _ids(before)]

  @classmethod
  def run(cls, fun, call: Callable[[], Any]) -> Any:
    """``call()`` (a lifted trace of ``fun``) with ``fun``'s state watched:
    :meth:`check` after it returns or raises."""
    watch = cls(fun)
    try:
      out = call()
    except BaseException:
      watch.check()
      raise
    watch.check()
    return out

  def restore(self) -> None:
    """Put back everything changed since the snapshot."""
    for obj, before in self._changed():
      if type(obj) is types.CellType:
        if before:
          obj.cell_contents = before[0]
        else:
          del obj.cell_contents
      elif type(obj) is list:
        obj[:] = before
      else:
        obj.clear()
        obj.update(before)


def _ids(contents):
  items = contents.items() if type(contents) is dict else enumerate(contents)
  return {k: id(x) for k, x in items}


def _contents(obj):
  if type(obj) is types.CellType:
    return _ids([obj.cell_contents] if _filled(obj) else [])
  return _ids(obj)


def _new_values(obj, before) -> list:
  now = [obj.cell_contents] if type(obj) is types.CellType and _filled(obj) \
      else ([] if type(obj) is types.CellType else obj)
  old = _ids(before)
  items = now.items() if type(now) is dict else enumerate(now)
  return [x for k, x in items if old.get(k) != id(x)]


def _holds_tracer(values) -> bool:
  seen, todo = set(), list(values)
  while todo and len(seen) < _BUDGET:
    v = todo.pop()
    if isinstance(v, core.Tracer):
      return True
    if id(v) not in seen:
      seen.add(id(v))
      todo.extend(_reached(v))
  return False


# -- the closure-keyed trace lookup ----------------------------------------------

class _Shared:
  """A stored trace of a key: ``jaxpr`` takes the leaves as its last
  constvars, after the trace-time ``consts``; ``answer``, for a key without
  leaves, is the first trace itself. ``jaxpr`` is None while only the first
  object of the key has been traced; ``failed`` holds why a lifted trace
  of the key failed (its functions are then traced as usual)."""
  __slots__ = ("jaxpr", "consts", "out_avals", "answer", "anchors",
               "failed", "__weakref__")

  def __init__(self):
    self.jaxpr = self.out_avals = self.answer = self.failed = None
    self.consts, self.anchors = (), []


class _TraceStore:
  """A bounded mapping, least recently used first out; ``jax.clear_caches``
  clears it (``util.register_cache``)."""

  def __init__(self, capacity: int):
    import collections
    import threading
    self.capacity = capacity
    self._data: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def get(self, key):
    with self._lock:
      shared = self._data.get(key)
      if shared is not None:
        self._data.move_to_end(key)
      return shared

  def put(self, key, shared: _Shared) -> None:
    with self._lock:
      self._data[key] = shared
      self._data.move_to_end(key)
      while len(self._data) > self.capacity:
        self._data.popitem(last=False)

  def discard(self, key, shared: _Shared) -> None:
    with self._lock:
      if self._data.get(key) is shared:
        del self._data[key]

  def cache_clear(self) -> None:
    with self._lock:
      self._data.clear()
    _answered.clear()

  def cache_info(self):
    with self._lock:
      return {"entries": len(self._data)}

  def cache_keys(self):
    with self._lock:
      return list(self._data)


_store = _TraceStore(1024)   # (closure key, leaf types, signature) -> _Shared
# Guards the tables below where a read and a write must go together.
_lock = threading.Lock()
util.register_cache(_store, "closure-keyed traces")
# Functions traced as usual (the first object of a key, or unkeyable), and
# the answers given to the others, per signature: identity first.
_traced_as_usual: weakref.WeakSet = weakref.WeakSet()
_answered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Every shared Jaxpr: pjit passes the consts of these as arguments.
_shared_jaxprs: weakref.WeakSet = weakref.WeakSet()
# Code of the lifted functions traced here, never keyed themselves.
_own_codes: set = set()


def is_shared(closed_jaxpr: core.ClosedJaxpr) -> bool:
  """Whether ``closed_jaxpr`` is one of many closures of a shared jaxpr, so
  its constants should be passed as arguments rather than baked."""
  return closed_jaxpr.jaxpr in _shared_jaxprs


def trace_to_jaxpr(traced: Callable, fun: Callable, in_avals, debug_info,
                   *context_for_cache_key, **options):
  """``traced(fun, in_avals, debug_info, ...)`` (the function-keyed
  ``pe.trace_to_jaxpr``), looked up by closure key first."""
  if (options or type(fun) not in (types.FunctionType, functools.partial)
      or getattr(fun, "__code__", None) in _own_codes
      or (type(fun) is types.FunctionType and fun.__closure__ is None
          and _is_stable(fun))):
    return traced(fun, in_avals, debug_info, *context_for_cache_key, **options)
  try:
    if fun in _traced_as_usual:
      return traced(fun, in_avals, debug_info, *context_for_cache_key)
    sig = (in_avals, debug_info, context_for_cache_key, config.trace_context())
    answer = _answered.get(fun, {}).get(sig)
  except TypeError:   # unhashable static arguments: as usual
    return traced(fun, in_avals, debug_info, *context_for_cache_key)
  if answer is not None:
    return answer
  answer, share = _lookup(traced, fun, in_avals, debug_info,
                          context_for_cache_key, sig)
  monitoring.record_event("/jax/closure_cache/miss" if answer is None
                          else "/jax/closure_cache/hit")
  if answer is None:
    _traced_as_usual.add(fun)
    answer = traced(fun, in_avals, debug_info, *context_for_cache_key)
    if share is not None:
      _share_answer(*share, answer)
    return answer
  with _lock:
    _answered.setdefault(fun, {})[sig] = answer
  return answer


def _lookup(traced, fun, in_avals, debug_info, ctx, sig):
  """``(answer, None)`` from the store, or ``(None, share)`` to trace ``fun``
  as usual; ``share`` is ``(key, leaves, anchors)`` when that answer may be
  shared as it is (a key without leaves)."""
  found = _find(fun, sig)
  if found is None:
    return None, None
  key, leaves, anchors, shared = found
  if not leaves:
    return (None, (key, leaves, anchors)) if shared is None else (
        shared.answer, None)
  if shared is None:           # the first object of the key: as usual
    _put(key, _Shared(), anchors)
    return None, None
  shared = _traced(traced, shared, fun, key, leaves, anchors, in_avals,
                   debug_info, ctx)
  if shared is None:
    return None, None
  return (core.ClosedJaxpr(shared.jaxpr, [*shared.consts, *leaves]),
          shared.out_avals), None


def _find(fun, sig):
  """``(key, leaves, anchors, stored)`` for ``fun`` and signature ``sig``,
  or None if ``fun`` has no closure key."""
  try:
    key, leaves, anchors = closure_key(fun)
    _remember(fun, key)
    key = (key, tuple(map(core.typeof, leaves)), sig)
    return key, leaves, anchors, _store.get(key)
  except (Unkeyable, TypeError):
    return None


def _traced(traced, shared, fun, key, leaves, anchors, in_avals, debug_info,
            ctx):
  """``shared`` if it holds a trace, else a new lifted trace (stored when
  it read only what the key covers), or None if that trace fails."""
  if shared is not None and shared.jaxpr is not None:
    return shared
  if shared is not None and shared.failed is not None:
    return None   # remembered: traced as usual, once per function
  try:
    shared = _trace_lifted(traced, fun, key, leaves, in_avals, debug_info,
                           ctx)
  except Exception as e:   # it needs a leaf's value, or leaked a tracer
    # (state restored): remembered, so the key's functions trace as usual
    failed = _Shared()
    failed.failed = f"{type(e).__name__}: {e}"[:200]
    _put(key, failed, anchors)
    return None
  if _covers(shared.consts, leaves, anchors):
    _shared_jaxprs.add(shared.jaxpr)
    _put(key, shared, anchors)
  return shared


def evict(fun: Callable) -> None:
  """Forget ``fun``'s answers and its key's traces (``clear_cache()`` of a
  jitted ``fun``): other functions of the key just trace again."""
  _answered.pop(fun, None)
  _traced_as_usual.discard(fun)
  try:
    key = closure_key(fun)[0]
  except (Unkeyable, TypeError):
    return
  for k in _store.cache_keys():
    if k[0] == key:
      _store.discard(k, _store.get(k))


def _trace_lifted(traced, fun, key, leaves, in_avals, debug_info, ctx):
  """Trace ``fun`` with its leaves abstracted, as leading arguments; raises
  what the trace raised if it fails (it needs their values)."""
  leaf_avals = key[1]

  def lifted(leaves, *args, **kwargs):
    return StateWatch.run(
        fun, lambda: rebuild(fun, key[0], leaves)(*args, **kwargs))
  _own_codes.add(lifted.__code__)
  args, kwargs = in_avals.unpack()
  lifted_in = tree_util.FlatTree.pack(
      ((tree_util.FlatTree.flatten(list(leaf_avals)), *args.unpack()), kwargs))
  names = debug_info.arg_names
  lifted_debug = debug_info._replace(
      arg_names=None if names is None else ("",) * len(leaves) + names)
  closed, out_avals = traced(lifted, lifted_in, lifted_debug, *ctx)
  jaxpr, n = closed.jaxpr, len(leaves)
  shared = _Shared()
  shared.consts, shared.out_avals = tuple(closed.consts), out_avals
  shared.jaxpr = jaxpr.replace(
      constvars=[*jaxpr.constvars, *jaxpr.invars[:n]], invars=jaxpr.invars[n:],
      debug_info=debug_info._replace(
          result_paths=jaxpr.debug_info.result_paths))
  return shared


def _share_answer(key, leaves, anchors, answer) -> None:
  closed, _ = answer
  # An answer that holds an array (one kept by identity: committed to a
  # device) would keep it alive after its function dies: not shared.
  if (_covers(closed.consts, leaves, anchors)
      and not any(isinstance(c, _jax.ArrayImpl) for c in closed.consts)):
    shared = _Shared()
    shared.answer = answer
    _put(key, shared, anchors)


def _covers(consts, leaves, anchors) -> bool:
  """Whether every array a trace captured is one the key covers."""
  covered = {id(x) for x in (*leaves, *anchors)}
  return not any(isinstance(c, core.Tracer) or (
      isinstance(c, _jax.ArrayImpl) and id(c) not in covered) for c in consts)


def _put(key, shared: _Shared, anchors) -> None:
  """Store ``shared``, dropped again when any object whose id is in ``key``
  dies (so no id in a stored key is ever reused)."""
  ref = weakref.ref(shared)

  def drop(_):
    s = ref()
    if s is not None:
      _store.discard(key, s)
  try:   # a globals dict cannot be held weakly; it lives with its module
    shared.anchors = [a if type(a) is dict else weakref.ref(a, drop)
                      for a in anchors]
  except TypeError:
    return   # an anchor that cannot be held weakly: not stored
  _store.put(key, shared)


# -- explanations ------------------------------------------------------------------

class _LastKeys:
  """The last closure key seen for each code object, for explain_miss (a
  key may hold its own code, so ``jax.clear_caches()`` empties it)."""

  def __init__(self):
    self.by_code: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

  def cache_clear(self) -> None:
    self.by_code.clear()

  def cache_info(self):
    return {"entries": len(self.by_code)}

  def cache_keys(self):
    return list(self.by_code)


_last_key = _LastKeys()
util.register_cache(_last_key, "closure keys last seen, for explanations")


def _remember(fun, key) -> None:
  code = getattr(fun, "__code__", None)
  if code is not None:
    with _lock:
      previous = _last_key.by_code.get(code)
      _last_key.by_code[code] = (key, previous[0] if previous else None)


def explain_miss(fun) -> str:
  """For ``pe.explain``: why ``fun`` did not share a trace with an earlier
  function of the same code."""
  if getattr(fun, "__code__", None) in _own_codes:
    # the lifted trace made for the user's function JAX names above
    return ("  jax_closure_cache: a second function of a closure key: traced "
            "once with its arrays as arguments, a trace that later functions "
            "of the key share")
  try:
    key, _, _ = closure_key(fun)
  except Unkeyable as e:
    return f"  jax_closure_cache: no closure key ({e})"
  code = getattr(fun, "__code__", None)
  last = _last_key.by_code.get(code) if code is not None else None
  before = None if last is None else (last[1] if last[0] == key else last[0])
  if before is None or before == key:
    return ("  jax_closure_cache: the first function of its closure key, "
            "traced as usual")
  where = _first_difference(before, key, fun)
  return f"  jax_closure_cache: its closure differs at {where}"


def _first_difference(a, b, fun, path="") -> str:
  """Where keys ``a`` and ``b`` first differ, named by cell, default and
  global names, with both values."""
  value = type(a) is tuple and len(a) == 2 and isinstance(a[0], type)
  if type(a) is tuple and type(b) is tuple and len(a) == len(b) and not value:
    if a and a[0] == "fn" and b[0] == "fn":
      code = a[2]
      names = ([f"cell {n!r}" for n in code.co_freevars],
               [f"default {i}" for i in range(len(a[5]))], [],
               [f"global {n!r}" for n in _code_names(code)[0]])
      for part, labels in zip((4, 5, 6, 7), names):
        for i, (x, y) in enumerate(zip(a[part], b[part])):
          if x != y:
            label = labels[i] if i < len(labels) else f"part {i}"
            return _first_difference(x, y, fun, f"{path}{label} ")
    for x, y in zip(a, b):
      if x != y:
        return _first_difference(x, y, fun, path)
  return f"{path.strip() or 'the function'}: {_show(a)} -> {_show(b)}"


def _show(k) -> str:
  if type(k) is tuple and len(k) == 2 and isinstance(k[0], type):
    value = float.fromhex(k[1]) if k[0] is float else k[1]
    return f"{k[0].__name__} {value!r}"
  return "an array" if k == _LEAF else str(k[0] if type(k) is tuple else k)
