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
``functools.partial``) is traced every time. With ``jax_closure_cache`` on, a
function it has not answered is looked up by its *closure key*: its code and
the values its code reads (cells, defaults, globals, through the functions it
reaches), with closed-over arrays abstracted to leaves.

Invariants:

* Identity first: the first function of a key is traced as usual, and
  ``pe.trace_to_jaxpr``'s cache keeps each function's answer.
* A trace is shared only by functions whose traces read the same values but
  for their leaves: one ``Jaxpr`` taking them as its last constvars, closed
  over each function's own arrays. Anything else is traced as usual.
* Nothing a user holds is kept alive: objects whose ids are in a key are
  held weakly, and their death drops the key's traces.
"""

from __future__ import annotations

import collections
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

_BUDGET = 4096      # values walked per key
_STABLE = frozenset({"jax", "jaxlib", "numpy", "scipy", "builtins",
                     "functools", "operator", "math", "itertools"})


class Marker:
  """The head of a compound part of a key: compared by identity, never
  pickled (a key holds ids, so it never leaves the process)."""
  __slots__ = ("name",)

  def __init__(self, name: str):
    self.name = name

  def __repr__(self):
    return self.name

  def __reduce__(self):
    raise TypeError("closure-key markers are not picklable")


LIFTED = Marker("LIFTED")     # an array passed to the shared trace
MISSING = Marker("MISSING")   # a global name the globals lack
EMPTY = Marker("EMPTY")       # an unfilled cell
FN = Marker("FN")   # (FN, index, code, id(globals), cells, defaults, kwdefaults, globals, chains)
TREE = Marker("TREE")         # (TREE, treedef, leaves)
PARTIAL = Marker("PARTIAL")   # (PARTIAL, func, args, keywords)
WEAKREF = Marker("WEAKREF")   # (WEAKREF, referent or None): read through it
CYCLE = Marker("CYCLE")       # (CYCLE, index of a function reached before)
ID = Marker("ID")             # (ID, id(obj), label): obj is an anchor
NUMPY = Marker("NUMPY")       # (NUMPY, dtype, shape, digest)
WRAPPER = Marker("WRAPPER")   # (WRAPPER, type, static, inner)
ATOMS = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})


class Unkeyable(Exception):
  """A value a key cannot cover: ``reason`` is a category, ``detail`` says
  which value and why."""

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason, self.detail = reason, detail


def float_key(x: float):   # 0.0 is not -0.0, and NaN is NaN
  return (float, x) if x == x and x != 0.0 else (float, x.hex())


WRAPPERS: dict[type, tuple[Callable, Callable]] = {}   # class -> (split, join)


def register_wrapper(cls: type, split, join) -> None:
  """Key a ``cls`` by ``split(w) == (static, inner)``: ``static`` hashable,
  ``inner`` walked; ``join(static, inner)`` rebuilds it around new values."""
  WRAPPERS[cls] = (split, join)


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
  """Whether ``f`` (or module ``module``) is jax's, numpy's or the standard
  library's, whose state a program does not change: keyed by identity."""
  module = module or getattr(f, "__module__", None)
  return isinstance(module, str) and module.partition(".")[0] in _STABLE


class Walk:
  """One walk over what a function's traces read: :meth:`value` is a value's
  part of the key; the arrays it abstracts go to ``leaves``, the objects
  whose ids it holds to ``anchors``. What it cannot key raises
  :class:`Unkeyable`; a library keying more overrides the steps it changes
  in a subclass, installed with :func:`use_rules`."""
  __slots__ = ("leaves", "anchors", "memo", "budget")

  def __init__(self):
    self.leaves, self.anchors, self.memo = [], [], {}  # memo: id -> index
    self.budget = _BUDGET

  def value(self, v) -> Any:
    t = type(v)
    if t is _jax.ArrayImpl:
      return self.array(v)
    if t is int or t is float:
      return self.scalar(v, t)
    if t in ATOMS:
      return (t, v)
    if t is types.FunctionType:
      if v.__closure__ is None and self.stable(v):
        return v                  # jax, numpy, the standard library
      return self.function(v)
    if t is types.ModuleType:
      return self.module(v)
    if t is tuple or t is list or t is dict:
      return self.tree(v)
    return self.other(v, t)

  def array(self, v):
    if v._committed and len(v.sharding.device_set) == 1:
      return self.identity(v)     # as an argument it would commit the result
    self.leaves.append(v)
    return LIFTED

  def scalar(self, v, t):
    return (t, v) if t is int else float_key(v)

  stable = staticmethod(_is_stable)

  def module(self, v):
    if self.stable(v, v.__name__):
      return v
    # its attributes (``cfg.scale``) are read at trace time and may change
    raise Unkeyable("module", f"reads the user module {v.__name__}")

  def other(self, v, t):
    if t is functools.partial:
      return self.partial(v)
    if t is weakref.ReferenceType:
      return self.weakref(v)
    if isinstance(v, core.Tracer):
      raise Unkeyable("tracer", f"a {t.__name__} tracer is closed over")
    if isinstance(v, np.ndarray):
      return self.numpy(v)
    if isinstance(v, np.generic):
      return (t, v.tobytes())
    rule = WRAPPERS.get(t)
    if rule is not None:
      return self.wrapper(v, t, rule)
    if isinstance(v, type) and self.stable(v):
      return self.identity(v)   # a user class's attributes may change
    if isinstance(v, type):
      raise Unkeyable("class", f"reads the user class {v.__qualname__}")
    raise Unkeyable("unhashable", f"closes over a {t.__name__}")

  def partial(self, v):
    value = self.value
    return (PARTIAL, value(v.func), tuple([value(a) for a in v.args]),
            tuple([(k, value(a)) for k, a in v.keywords.items()]))

  def weakref(self, v):   # read through (fori_loop holds its body so)
    target = v()
    return (WEAKREF, None if target is None else self.value(target))

  @staticmethod
  def numpy(v):
    if v.dtype.hasobject:
      raise Unkeyable("unhashable", "a numpy array of dtype object")
    digest = hashlib.blake2b(np.ascontiguousarray(v).tobytes(),
                             digest_size=16).digest()
    return (NUMPY, v.dtype, v.shape, digest)

  def wrapper(self, v, t, rule):
    static, inner = rule[0](v)
    return (WRAPPER, t, static, self.value(inner))

  def tree(self, v):
    try:
      leaves, treedef = tree_util.tree_flatten(v)
    except Exception as e:   # dict keys that do not sort
      raise Unkeyable("unhashable",
                      f"flattening {type(v).__name__} raised {e!r}") from e
    return self.tree_parts(leaves, treedef)

  def tree_parts(self, leaves, treedef):
    return (TREE, treedef, tuple([self.value(x) for x in leaves]))

  def identity(self, v):
    self.anchors.append(v)
    # the label only makes explanations readable (``float32``, not an id)
    return (ID, id(v), getattr(v, "__qualname__", None) or type(v).__name__)

  def enter(self, v):   # v's index, or (CYCLE, index) if reached before
    i = self.memo.get(id(v))
    if i is not None:
      return (CYCLE, i)
    self.budget -= 1
    if self.budget < 0:
      raise Unkeyable("budget", "too many values")
    i = self.memo[id(v)] = len(self.memo)
    return i

  def function(self, f: types.FunctionType):
    index = self.enter(f)
    if type(index) is tuple:
      return index
    g = f.__globals__
    self.anchors.append(g)   # its id is in the key
    value = self.value
    cells = self.cells(f)
    d, kw = f.__defaults__, f.__kwdefaults__
    defaults = None if d is None else tuple([value(x) for x in d])
    kwdefaults = (None if kw is None else
                  tuple([(k, value(x)) for k, x in kw.items()]))
    globs, chains = self.reads(f)
    return (FN, index, f.__code__, id(g), cells, defaults, kwdefaults, globs,
            chains)

  def cells(self, f) -> tuple:
    return tuple([self.cell(c) for c in f.__closure__ or ()])

  def cell(self, c):
    return self.value(c.cell_contents) if _filled(c) else EMPTY

  def reads(self, f) -> tuple[tuple, tuple]:
    """The parts of the globals ``f``'s code reads, in ``global_names``
    order, and of the attribute chains it reads (none: JAX keys a module or
    class it names only if stable)."""
    if _code_names(f.__code__)[1]:
      raise Unkeyable("writes_globals", f"{f.__qualname__} assigns to a global")
    g = f.__globals__
    return tuple([self.value(g[n]) if n in g else MISSING
                  for n in self.global_names(f.__code__)]), ()

  global_names = staticmethod(lambda code: _code_names(code)[0])


class Rebuild:
  """Fills the leaves of a :class:`Walk`'s key in its order: :meth:`value` is
  ``v`` with the leaves of its part ``k`` replaced by new functions,
  partials and containers; the user's objects, cells included, are never
  modified. A walk that adds parts pairs with a subclass adding ``STEPS``."""
  # parts that are, or may be, leaves (a function reached before is rebuilt
  # wherever it is held, or the holder would call the original); parts
  # that never hold one
  LEAF_PARTS = frozenset({CYCLE})
  KEPT_PARTS = frozenset()
  STEPS = {FN: "function", TREE: "tree", PARTIAL: "partial",
           WEAKREF: "weakref", WRAPPER: "wrapper"}
  walk = Walk

  def __init__(self, leaves):
    self.leaves = iter(leaves)
    # walk index -> rebuilt function; rebuilt objects only weakrefs reach
    self.memo, self.keep = {}, []

  def has_leaf(self, k) -> bool:
    if k is LIFTED:
      return True
    if type(k) is not tuple or not k:
      return False
    if k[0] in self.LEAF_PARTS:
      return True
    return k[0] not in self.KEPT_PARTS and any(map(self.has_leaf, k))

  def value(self, v, k):
    if k is LIFTED:
      return next(self.leaves)
    if type(k) is not tuple or not k or type(k[0]) is not Marker:
      return v
    if k[0] is CYCLE:
      return self.memo.get(k[1], v)
    if not self.has_leaf(k):
      return v
    return getattr(self, self.STEPS[k[0]])(v, k)

  def partial(self, v, k):
    value = self.value
    return functools.partial(
        value(v.func, k[1]), *[value(a, ka) for a, ka in zip(v.args, k[2])],
        **{n: value(v.keywords[n], kn) for n, kn in k[3]})

  def tree(self, v, k):
    leaves, treedef = tree_util.tree_flatten(v)
    return tree_util.tree_unflatten(
        treedef, [self.value(x, kx) for x, kx in zip(leaves, k[2])])

  def weakref(self, v, k):
    self.keep.append(self.value(v(), k[1]))
    return weakref.ref(self.keep[-1])

  def wrapper(self, v, k):
    split, join = WRAPPERS[k[1]]
    static, inner = split(v)
    return join(static, self.value(inner, k[3]))

  def function(self, f, k):
    _, index, code, _, cells, defaults, kwdefaults, reads, chains = k
    has_leaf, value = self.has_leaf, self.value
    closure, g = f.__closure__, f.__globals__
    new_cells = None if closure is None else tuple(
        types.CellType() if has_leaf(ck) else c for c, ck in zip(closure, cells))
    if any(map(has_leaf, reads)):
      g = self.own_globals(f)   # the rebuilt function reads its own copy
    new = types.FunctionType(code, g, f.__name__, None, new_cells)
    self.memo[index] = new
    # in the walk's order: cells, defaults, keyword defaults, globals
    for c, nc, ck in zip(closure or (), new_cells or (), cells):
      if nc is not c:
        nc.cell_contents = value(c.cell_contents, ck)
    if f.__defaults__ is not None:
      new.__defaults__ = tuple(map(value, f.__defaults__, defaults))
    if f.__kwdefaults__ is not None:
      new.__kwdefaults__ = {n: value(f.__kwdefaults__[n], kn)
                            for n, kn in kwdefaults}
    if g is not f.__globals__:
      for n, rk in zip(self.walk.global_names(code), reads):
        if has_leaf(rk):
          g[n] = value(f.__globals__[n], rk)
    self.copy_metadata(f, new)
    return new

  @staticmethod
  def copy_metadata(f, new) -> None:
    """What ``FunctionType(code, ...)`` does not copy from ``f``."""
    for name in ("__qualname__", "__module__", "__doc__", "__annotations__"):
      setattr(new, name, getattr(f, name))
    new.__dict__.update(f.__dict__)

  def own_globals(self, f) -> dict:
    return dict(f.__globals__)


_rules = [Walk, Rebuild]   # the walk and rebuild in use (use_rules)


def use_rules(walk: type[Walk] = Walk, rebuild: type[Rebuild] = Rebuild):
  """Key with ``walk``, rebuild with its pair ``rebuild`` (default: JAX's)."""
  if rebuild.walk is not walk:
    raise ValueError(f"{rebuild.__name__} rebuilds {rebuild.walk.__name__}'s "
                     f"keys, not {walk.__name__}'s")
  _rules[:] = [walk, rebuild]


def closure_key(fun: Callable) -> tuple[Any, list[Any], list[Any]]:
  """``(key, leaves, anchors)``: ``key`` is equal for functions whose traces
  read equal values but for the arrays ``leaves``; ``anchors`` are the
  objects whose ids it holds. Raises :class:`Unkeyable`."""
  w = _rules[0]()
  key = w.function(fun) if type(fun) is types.FunctionType else w.value(fun)
  return key, w.leaves, w.anchors


def rebuild(fun: Callable, key, leaves, rules=None) -> Callable:
  """``fun`` with the leaves of ``key`` replaced by ``leaves``, by the
  :class:`Rebuild` ``rules`` (the one in use if None)."""
  r = (rules or _rules[1])(leaves)
  out = r.value(fun, key)
  if next(r.leaves, r) is not r:
    raise AssertionError("more leaves than the key has")
  if r.keep:
    try:   # alive as long as the rebuilt function
      out.__closure_key_keep__ = r.keep
    except AttributeError:
      raise Unkeyable("weakref", "a weak reference under an object without "
                      "attributes") from None
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
  if type(v) in (list, tuple, set, frozenset, dict):
    return list(v.values() if type(v) is dict else v)
  d = getattr(v, "__dict__", None)
  return list(d.values()) if type(d) is dict else []


def _place(v):
  """The mutable place ``v`` is (itself, or its ``__dict__``), or None."""
  if type(v) in (types.CellType, list, dict):
    return v
  d = getattr(v, "__dict__", None)
  return d if type(d) is dict and not isinstance(
      v, (type, types.ModuleType, types.FunctionType)) else None


def _contents(place) -> dict:
  if type(place) is types.CellType:
    return {0: place.cell_contents} if _filled(place) else {}
  return dict(enumerate(place)) if type(place) is list else dict(place)


class StateWatch:
  """The cells, lists, dicts, attributes (and globals, for code assigning
  them) a function reaches, before a lifted trace, which shares them as a
  stock trace does; :meth:`check` undoes every change and raises
  :class:`TracerLeak` if a new value holds a tracer (a helper made at trace
  time over a lifted array): that function is then traced as usual."""

  def __init__(self, fun):
    self.places, seen, todo = [], set(), [fun]
    while todo and len(seen) < _BUDGET:
      v = todo.pop()
      if id(v) not in seen:
        seen.add(id(v))
        place = _place(v)
        if type(v) is types.FunctionType and _code_names(v.__code__)[1]:
          place = v.__globals__
        if place is not None:
          self.places.append((place, _contents(place)))
        todo.extend(_reached(v))

  def changes(self) -> list:
    """``(place, contents before, values new since)`` of each place changed."""
    out = []
    for place, before in self.places:
      now = _contents(place)
      new = [x for k, x in now.items() if before.get(k, place) is not x]
      if new or len(now) != len(before):
        out.append((place, before, new))
    return out

  def check(self) -> None:
    changes = self.changes()
    if any(_holds_tracer(new) for _, _, new in changes):
      self.restore(changes)
      raise TracerLeak("a lifted trace stored a traced value in the "
                       "closure's state")

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

  def restore(self, changes=None) -> None:
    """Put back everything changed since the snapshot."""
    for place, before, _ in self.changes() if changes is None else changes:
      if type(place) is types.CellType:
        if before:
          place.cell_contents = before[0]
        else:
          del place.cell_contents
      elif type(place) is list:
        place[:] = before.values()
      else:
        place.clear()
        place.update(before)


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
  """A key's trace: ``jaxpr`` takes the leaves as its last constvars, after
  the trace-time ``consts`` (None while only the key's first function was
  traced); ``answer`` is a key without leaves' first trace; ``failed`` says
  why the lifted trace failed (its functions are then traced as usual)."""
  __slots__ = ("jaxpr", "consts", "out_avals", "answer", "anchors",
               "failed", "__weakref__")

  def __init__(self):
    self.jaxpr = self.out_avals = self.answer = self.failed = None
    self.consts, self.anchors = (), []


class _TraceStore:
  """A bounded mapping, least recently used first out, locked; a JAX cache
  (``util.register_cache``), so ``jax.clear_caches`` clears it."""

  def __init__(self, capacity: int):
    self.capacity, self.lock = capacity, threading.Lock()
    self.data: collections.OrderedDict = collections.OrderedDict()

  def get(self, key):
    with self.lock:
      shared = self.data.get(key)
      if shared is not None:
        self.data.move_to_end(key)
      return shared

  def put(self, key, shared: _Shared) -> None:
    with self.lock:
      self.data[key] = shared
      self.data.move_to_end(key)
      while len(self.data) > self.capacity:
        self.data.popitem(last=False)

  def discard(self, key, shared: _Shared) -> None:
    with self.lock:
      if self.data.get(key) is shared:
        del self.data[key]

  def cache_clear(self) -> None:
    with self.lock:
      self.data.clear()
    _last_key.clear()

  def cache_info(self) -> dict:
    return {"entries": len(self.data)}

  def cache_keys(self) -> list:
    with self.lock:
      return list(self.data)


_store = _TraceStore(1024)   # (closure key, leaf types, signature) -> _Shared
util.register_cache(_store, "closure-keyed traces")
# Every shared Jaxpr: pjit passes the consts of these as arguments.
_shared_jaxprs: weakref.WeakSet = weakref.WeakSet()
# Code of the lifted functions traced here, never keyed themselves.
_own_codes: set = set()


def is_shared(closed_jaxpr: core.ClosedJaxpr) -> bool:
  """Whether ``closed_jaxpr``'s constants are a shared jaxpr's arguments."""
  return closed_jaxpr.jaxpr in _shared_jaxprs


def trace_to_jaxpr(traced: Callable, fun: Callable, in_avals, debug_info,
                   *context_for_cache_key, **options):
  """For ``pe.trace_to_jaxpr``'s cache on the function object: the trace of
  ``fun`` by ``traced`` (uncached), or its closure key's shared trace."""
  if (options or type(fun) not in (types.FunctionType, functools.partial)
      or getattr(fun, "__code__", None) in _own_codes
      or (type(fun) is types.FunctionType and fun.__closure__ is None
          and _rules[0].stable(fun))):
    return traced(fun, in_avals, debug_info, *context_for_cache_key, **options)
  sig = (in_avals, debug_info, context_for_cache_key, config.trace_context())
  answer, share = _lookup(traced, fun, in_avals, debug_info,
                          context_for_cache_key, sig)
  monitoring.record_event("/jax/closure_cache/miss" if answer is None
                          else "/jax/closure_cache/hit")
  if answer is None:
    answer = traced(fun, in_avals, debug_info, *context_for_cache_key)
    if share is not None:
      _share_answer(*share, answer)
  return answer


def _lookup(traced, fun, in_avals, debug_info, ctx, sig):
  """``(answer, None)``, or ``(None, share)`` to trace ``fun`` as usual and
  share the answer by ``share = (key, leaves, anchors)`` if not None."""
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


def _find(fun, sig, found=None, rules=None):
  """``(key, leaves, anchors, stored)`` for ``fun`` and signature ``sig``,
  or None if ``fun`` has no closure key; ``found`` is ``fun``'s
  ``(key, leaves, anchors)`` if the caller has walked it with ``rules``."""
  try:
    key, leaves, anchors = found or closure_key(fun)
    _remember(fun, key)
    # the rebuild of the walk that made the key is part of it
    key = ((rules or _rules)[1], key, tuple(map(core.typeof, leaves)), sig)
    return key, leaves, anchors, _store.get(key)
  except (Unkeyable, TypeError):
    return None


def _traced(traced, shared, fun, key, leaves, anchors, in_avals, debug_info,
            ctx):
  """``shared`` if it holds a trace, else a new lifted trace (stored if it
  captured only what the key covers), or None if one failed."""
  if shared is not None and (shared.jaxpr is not None or shared.failed):
    return shared if shared.jaxpr is not None else None
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
  """Forget the traces of ``fun``'s key (``clear_cache()`` of a jitted fun)."""
  try:
    key = closure_key(fun)[0]
  except (Unkeyable, TypeError):
    return
  for k in _store.cache_keys():
    if k[1] == key:
      _store.discard(k, _store.get(k))


def _trace_lifted(traced, fun, key, leaves, in_avals, debug_info, ctx):
  """Trace ``fun`` with its leaves as leading arguments, or raise."""
  rules, key, leaf_avals, _ = key

  def lifted(leaves, *args, **kwargs):
    return StateWatch.run(
        fun, lambda: rebuild(fun, key, leaves, rules)(*args, **kwargs))
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
  # not one holding an array (kept by identity): it would outlive its function
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
  """Store ``shared`` until an object whose id is in ``key`` dies."""
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

# The last closure key looked up for each code object, for explain_miss (a
# key may hold its own code: jax.clear_caches() empties it with the store).
_last_key: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remember(fun, key) -> None:
  code = getattr(fun, "__code__", None)
  if code is not None:
    _last_key[code] = key


def explain_miss(fun) -> str:
  """For ``pe.explain``, before ``fun`` is looked up: how its closure key
  compares with the last one of the same code."""
  try:
    key, _, _ = closure_key(fun)
  except Unkeyable as e:
    return f"  jax_closure_cache: no closure key ({e})"
  last = _last_key.get(getattr(fun, "__code__", None))
  return "  jax_closure_cache: " + (
      "the first function of its closure key, traced as usual" if last is None
      else "a closure key seen before: its functions share one trace, with "
      "their arrays as arguments" if last == key
      else f"its closure differs at {_first_difference(last, key)}")


def _first_difference(a, b, path="") -> str:
  """Where keys ``a`` and ``b`` first differ, named by cells and globals."""
  if (type(a) is tuple and type(b) is tuple and len(a) == len(b)
      and not (len(a) == 2 and isinstance(a[0], type))):
    names = {}
    if a and a[0] is FN and b[0] is FN:
      names = {4: [f"cell {n!r}" for n in a[2].co_freevars],
               7: [f"global {n!r}" for n in _rules[0].global_names(a[2])]}
    for i, (x, y) in enumerate(zip(a, b)):
      if x != y and i in names:
        j = next(j for j, (p, q) in enumerate(zip(x, y)) if p != q)
        return _first_difference(x[j], y[j], f"{path}{names[i][j]} ")
      if x != y:
        return _first_difference(x, y, path)
  return f"{path.strip() or 'the function'}: {_show(a)} -> {_show(b)}"


def _show(k) -> str:
  if type(k) is tuple and len(k) == 2 and isinstance(k[0], type):
    value = float.fromhex(k[1]) if type(k[1]) is str and k[0] is float else k[1]
    return f"{k[0].__name__} {value!r}"
  return "an array" if k is LIFTED else str(k[0] if type(k) is tuple else k)
