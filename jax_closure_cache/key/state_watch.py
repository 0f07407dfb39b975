"""What a function reaches that its trace may write: cells, lists, dicts and
objects' and user functions' ``__dict__`` (and a global-writing function's
module globals), reached from the function within the closure key's budget.

Invariants: :class:`StateWatch` snapshots each place's contents when made;
:meth:`StateWatch.check` undoes every change a trace made and raises
:class:`TracerLeak` if one stored a traced value; :meth:`StateWatch.run`
undoes every change of a trace that raised; places are compared by
identity of their contents, never by ``==``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import functools
import threading
import types
from typing import Any
import weakref

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache.key import closure_key


class TracerLeak(Exception):
  """A lifted trace stored a traced value in the user's own state."""


class LiftedValueAsked(TracerLeak):
  """A lifted trace asked a value computed from a lifted array whether it
  is concrete, or for its value: stock's trace, where the closed-over
  array is concrete, answers from its value, and may take another path
  (``_compat.trace.concreteness_patch_points``)."""


class ValueQuestions:
  """The concreteness questions one lifted trace asks of what it computes
  from its lifted arrays (``sources``: their tracers' ids): the first is
  kept in ``asked``. Active for the thread while :meth:`run` runs."""
  __slots__ = ("sources", "memo", "asked")

  def __init__(self, leaves):
    self.sources = {id(x) for x in _compat.jax.tree_util.tree_leaves(leaves)
                    if isinstance(x, _compat.Tracer)}
    self.memo: dict = {}   # id -> (tracer, answer): computed_from's
    self.asked: str | None = None

  @classmethod
  def run(cls, leaves, call: Callable[[], Any]) -> Any:
    """``call()``, then :class:`LiftedValueAsked` if it asked a question of
    a lifted array (nested lifted traces each watch their own)."""
    watch = cls(leaves)
    if not watch.sources:
      return call()
    if _compat.trace.eager_folding():
      # the whole trace folds what it can (a call inside
      # ``ensure_compile_time_eval``): stock's, on the array's value
      watch.asked = ("the trace runs under eager constant folding, which "
                     "stock's trace applies to the closed-over array's value")
    outer = getattr(_active, "watches", ())
    _active.watches = (*outer, watch)   # a tuple, replaced: never shared
    try:
      out = call()
    finally:
      _active.watches = outer
    if watch.asked is not None:
      raise LiftedValueAsked(watch.asked)
    return out


_active = threading.local()   # .watches: this thread's active ValueQuestions


def watching() -> bool:
  """Whether a lifted trace runs in this thread (JAX's questions are
  reported only then)."""
  return bool(getattr(_active, "watches", ()))


def asked(tracer) -> None:
  """JAX asked ``tracer`` whether it is concrete, or for its value (the
  report of ``_compat.trace.concreteness_patch_points``): noted by every
  active watch whose lifted arrays it was computed from."""
  for watch in getattr(_active, "watches", ()):
    if watch.asked is None and _compat.trace.computed_from(
        tracer, watch.sources, watch.memo):
      aval = getattr(tracer, "aval", None)
      watch.asked = (
          "the trace asked whether a value computed from a closed-over "
          f"array ({aval.str_short() if aval is not None else '?'}) is "
          "concrete, or for its value, which stock's trace answers from "
          "the array's value")


def _reached(v, with_globals: bool) -> list:   # what a trace may reach
  if isinstance(v, (type, types.ModuleType, _compat.ArrayImpl, np.ndarray)):
    return []   # from v, and write to
  if type(v) is types.FunctionType:
    return [*(v.__closure__ or ()), *(v.__defaults__ or ()),
            *(v.__kwdefaults__ or {}).values(),
            *(_globals_read(v) if with_globals else ())]
  if type(v) is types.CellType:
    return [] if not closure_key.cell_filled(v) else [v.cell_contents]
  if type(v) is functools.partial:
    return [v.func, *v.args, *v.keywords.values()]
  if type(v) is types.MethodType:
    return [v.__func__, v.__self__]
  if type(v) is weakref.ReferenceType:   # read through, as the key reads
    target = v()   # (fori_loop's body wrapper holds the body so)
    return [] if target is None else [target]
  # containers, their subclasses too (an OrderedDict, a defaultdict, a
  # NamedTuple), read by the base type's own methods: no user code runs
  # (and by the type itself, never a ``__class__`` a proxy fakes)
  t = type(v)
  if issubclass(t, dict):
    items = list(dict.values(v))
  elif issubclass(t, list):
    items = list.copy(v)
  elif issubclass(t, tuple):
    items = list(tuple.__iter__(v))
  elif issubclass(t, (set, frozenset)):
    items = list((set if issubclass(t, set) else frozenset).__iter__(v))
  else:
    items = []
  d = getattr(v, "__dict__", None)   # an object's, or a subclass's own
  return items + list(d.values()) if type(d) is dict else items


def _globals_read(f) -> list:
  """The values of the globals a user's function may read (a rebuild's
  own copy of them where ``f`` is rebuilt: a trace writes to what it
  reads there); none for library code, whose module state is its own."""
  code = f.__code__
  if _compat.library_code(code) or _compat.stdlib_code(code):
    return []
  g = f.__globals__
  return [g[n] for n in closure_key.code_names(code)[0] if n in g]


def _places(v) -> list:   # the mutable places v is: itself, its __dict__
  t = type(v)
  if t is types.CellType:
    return [v]
  out = [v] if issubclass(t, (list, dict)) else []
  d = getattr(v, "__dict__", None)
  if type(d) is dict and not isinstance(v, (type, types.ModuleType)) and (
      t is not types.FunctionType or not _compat.library_code(v.__code__)):
    out.append(d)   # a user function's too (``f.calls += 1`` in its trace)
  return out


def _base(place) -> type:
  """The type whose own methods read and write ``place`` (an OrderedDict's
  order is its own; any other mapping's, dict's)."""
  t = type(place)
  if issubclass(t, list):
    return list
  return collections.OrderedDict if issubclass(
      t, collections.OrderedDict) else dict


def _contents(place) -> dict:
  """A place's contents, in its order: a cell's, a list's by index, a
  mapping's by key."""
  if type(place) is types.CellType:
    return {0: place.cell_contents} if closure_key.cell_filled(place) else {}
  base = _base(place)
  if base is list:
    return dict(enumerate(list.copy(place)))
  return dict(base.items(place))


class StateWatch:
  """What a function reaches that a trace may change; :meth:`check` undoes
  every change and raises :class:`TracerLeak` if one holds a tracer."""

  def __init__(self, fun):
    self.places = []
    self.keyed = set()   # places restored key by key (module globals)
    self.trace = _compat.current_trace()   # the lifted function's own
    for v in _reach([fun]):
      places = _places(v)
      if (type(v) is types.FunctionType
          and closure_key.code_names(v.__code__)[1]):
        places = [v.__globals__]
        self.keyed.add(id(v.__globals__))
      for place in places:
        self.places.append((place, _contents(place)))

  def changes(self) -> list:
    """``(place, contents before, values new since)`` of each place changed."""
    out = []
    for place, before in self.places:
      now = _contents(place)
      new = [x for k, x in now.items() if before.get(k, place) is not x]
      if new or len(now) != len(before) or any(   # keys reordered too
          a is not b for a, b in zip(now, before)):
        out.append((place, before, new))
    return out

  def check(self) -> None:
    changes = self.changes()
    if any(isinstance(v, _compat.Tracer)
           for _, _, new in changes for v in _reach(list(new))):
      self.restore(changes)
      raise TracerLeak("a lifted trace stored a tracer in the closure's state")

  @classmethod
  def of_copies(cls, rebuilt, fun) -> "StateWatch":
    """The places ``rebuilt`` (``fun`` rebuilt with tracers in its lifted
    positions) reaches that ``fun`` does not: the rebuild's copies of the
    user's plain objects, dicts and lists."""
    watch, own = cls(rebuilt), {id(p) for p, _ in cls(fun).places}
    watch.places = [(p, c) for p, c in watch.places if id(p) not in own]
    return watch

  def check_unwritten(self) -> None:
    """Raise :class:`TracerLeak` if a trace wrote to a watched place: a
    write to the rebuild's copy of an object that stock's trace would make
    on the user's object (``self.last = y``, a counter)."""
    if self.changes():
      raise TracerLeak("a lifted trace wrote to its copy of an object the "
                       "closure reaches; stock's trace writes to the user's")

  @classmethod
  def run(cls, fun, call: Callable[[], Any]) -> Any:
    """``call()``, a lifted trace of ``fun``, then :meth:`check`. A call
    that raises leaves nothing of its writes behind (every failed lifted
    trace is followed by stock's, which makes them once), and its trace is
    released (``_compat.abandon_trace``)."""
    watch = cls(fun)
    try:
      out = call()
      watch.check()
    except BaseException:
      watch.restore()
      _compat.abandon_trace(watch.trace)   # (its frame would live on)
      raise
    return out

  @classmethod
  def run_lifted(cls, fun, rebuilt, call: Callable[[], Any],
                 leaves=()) -> Any:
    """``call()``, a trace of ``rebuilt`` (``fun`` rebuilt with tracers in
    its lifted positions, ``leaves``) that may write to the user's own
    objects, as stock's trace of ``fun`` would: :meth:`run`, raising
    :class:`TracerLeak` if it wrote to the rebuild's copy of one (stock's
    trace writes to the user's), :class:`LiftedValueAsked` if it asked
    whether a lifted array is concrete (:class:`ValueQuestions`). The
    front's and ``closure_convert``'s lifted traces."""
    def trace():
      copies = cls.of_copies(rebuilt, fun)
      out = ValueQuestions.run(leaves, call)
      copies.check_unwritten()
      return out
    return cls.run(fun, trace)

  @classmethod
  def run_unwritten(cls, fun, rebuilt, call: Callable[[], Any],
                    leaves=()) -> Any:
    """``call()``, a trace of ``rebuilt`` (lifted ``leaves``) whose jaxpr
    every later function of the key gets without tracing: :meth:`run`,
    raising :class:`TracerLeak` (what it wrote undone) if it wrote to
    anything ``fun`` or ``rebuilt`` reaches, :class:`LiftedValueAsked` if
    it asked whether a lifted array is concrete. The trace lookup's shared
    traces."""
    watches = cls(rebuilt), cls(fun)
    out = cls.run(fun, lambda: ValueQuestions.run(leaves, call))
    if any(w.changes() for w in watches):
      for w in watches:
        w.restore()
      _compat.abandon_trace(watches[1].trace)
      raise TracerLeak("the trace wrote to state its function reaches")
    return out

  def restore(self, changes=None) -> None:   # as it was at the snapshot
    for place, before, _ in self.changes() if changes is None else changes:
      if type(place) is types.CellType:
        if before:
          place.cell_contents = before[0]
        else:
          del place.cell_contents
        continue
      base = _base(place)   # its own methods, never a subclass's
      if base is list:
        list.__setitem__(place, slice(None), list(before.values()))
      elif id(place) in self.keyed:   # a module's globals, key by key:
        for k in [k for k in dict.keys(place) if k not in before]:
          dict.__delitem__(place, k)   # never empty meanwhile
        dict.update(place, [(k, v) for k, v in before.items()
                            if dict.get(place, k, place) is not v])
      else:   # contents and order
        base.clear(place)
        base.update(place, before)


def _reach(todo: list):
  """Each object reached from ``todo`` once: first what the closure key
  walks (cells, defaults, containers, objects; within its budget), then,
  with a budget of its own, what the globals their functions read reach
  (a large global table read by the code never hides the closure's own
  state from the watch)."""
  seen: set = set()
  functions: list = []
  for v in _walk(list(todo), seen, with_globals=False):
    if type(v) is types.FunctionType:
      functions.append(v)
    yield v
  more = [g for f in functions for g in _globals_read(f)]
  yield from _walk(more, seen, with_globals=True)


def _walk(todo: list, seen: set, with_globals: bool):
  # breadth first, cells before globals at each level: a table a global
  # holds is walked after the state the closure reaches as near
  queue, count = collections.deque(todo), 0
  while queue and count < closure_key.BUDGET:
    v = queue.popleft()
    if id(v) not in seen:
      seen.add(id(v))
      count += 1
      yield v
      queue.extend(_reached(v, with_globals))
