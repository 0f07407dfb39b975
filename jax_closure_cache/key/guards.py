"""Guards: where an array a trace captured, but the key does not cover, was
found, so a hit can check it is still there.

Guards hold their root and the array through weak references: a stored
guard keeps nothing alive, and a dead one no longer holds.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache.key import closure
from jax_closure_cache.key import state_watch
from jax_closure_cache.key.code_plan import code_plan, is_module_level
from jax_closure_cache.key.parts import ATOMS

_FunctionType = types.FunctionType
_ModuleType = types.ModuleType
_Tracer = _compat.Tracer


class Guard(NamedTuple):
  """``root`` reached through ``path`` must still be ``expected``.

  Both are held through weak references (``root_ref``, ``expected_ref``), so
  a stored guard keeps neither alive; a dead one no longer holds.
  """
  root_ref: Any
  path: tuple
  expected_ref: Any

  @classmethod
  def make(cls, root, path, expected) -> "Guard | None":
    try:
      return cls(_strong_or_weak(root), path, weakref.ref(expected))
    except TypeError:
      return None

  def holds(self) -> bool:
    obj = self.root_ref()
    expected = self.expected_ref()
    if obj is None or expected is None:
      return False
    try:
      for kind, k in self.path:
        if kind == "attr":
          obj = getattr(obj, k)
        elif kind == "item":
          obj = obj[k]
        elif kind == "global":
          obj = obj.__globals__[k]
        elif kind == "cell":
          obj = obj.__closure__[k].cell_contents
        else:  # "default"
          obj = obj.__defaults__[k]
    except Exception:
      return False
    return obj is expected


def _strong_or_weak(obj):
  """A weak reference, or for a module-level function (the key holds it
  anyway) a callable returning it."""
  if type(obj) is _FunctionType and is_module_level(obj):
    return lambda: obj
  return weakref.ref(obj)


_GUARD_SEARCH_NODES = 4096


class ArgumentClasses:
  """Guard of an entry's traces: the classes of its arguments' pytree
  nodes whose code a trace may run (``closure.argument_classes``), each
  with what a trace could read of it (``closure.class_key``) when a trace
  of the entry first met it. JAX's cache of the entry's jitted function
  keys an argument's class by identity, so a trace that read a global
  through the class's method is answered again after the global changed;
  stock traces each new function object anew.

  Holds while every class still keys as then, the objects whose ids the
  keys hold alive. A class the walk cannot key, or one two traces met in
  different states, never holds again (its entry's later objects miss and
  trace), nor does one that met more than :data:`MAX_CLASSES` classes (a
  class made per call: every hit would walk them all). The classes are
  held strongly, as the entry's jitted function's own cache holds them;
  the anchors weakly where they can be. Traces on several threads note
  under a lock; a hit reads a snapshot of the table.
  """
  __slots__ = ("keys", "_lock")

  #: Classes an entry's traces may meet before it never holds again.
  MAX_CLASSES = 8

  def __init__(self):
    self.keys: dict = {}   # class -> (key, anchor references) or None
    self._lock = threading.Lock()

  @classmethod
  def of(cls, classes) -> "ArgumentClasses | None":
    """The state of ``classes`` now (None if there are none)."""
    if not classes:
      return None
    made = cls()
    made.note(classes)
    return made

  def read_as(self, other: "ArgumentClasses") -> bool:
    """Whether every class of ``other`` (a state taken before the trace)
    keys here as there: a trace that wrote to a class's state does not."""
    for cls, then in other.keys.items():
      now = self.keys.get(cls)
      if then is None or now is None or now[0] != then[0]:
        return False
    return True

  def note(self, classes) -> None:
    """At a trace of the entry: the state of each of ``classes`` it read."""
    states = [(cls, _class_state(cls)) for cls in classes]
    with self._lock:
      for cls, now in states:
        then = self.keys.get(cls, _UNMET)
        if then is not _UNMET and (now is None or then is None
                                   or then[0] != now[0]):
          now = None   # two traces answered for two states: neither holds
        self.keys[cls] = now
      if len(self.keys) > self.MAX_CLASSES:
        self.keys[_TOO_MANY] = None

  def holds(self) -> bool:
    for cls, then in list(self.keys.items()):
      if then is None or not all(r() is not None for r in then[1]):
        return False
      now = _class_state(cls)
      if now is None or now[0] != then[0]:
        return False
    return True


_UNMET = object()


class _TOO_MANY:
  """The table's mark of an entry that met too many classes."""


def _class_state(cls):
  """``(class key, references to its anchors)``, or None if unkeyable."""
  try:
    key, anchors = closure.class_key(cls)
  except Exception:   # Uncacheable, or a user's __hash__ or property raising
    return None
  return key, tuple(map(_reference, anchors))


def _reference(obj):
  """A weak reference to ``obj``, or a strong one where it takes none (a
  namespace dict, which lives with its class or module)."""
  try:
    return weakref.ref(obj)
  except TypeError:
    return functools.partial(_itself, obj)


def _itself(obj):
  return obj


class Unguarded(NamedTuple):
  """Why a trace's captured value could not be guarded: ``detail`` names it
  (shape and dtype of an array, and where it was looked for)."""
  detail: str


def describe_array(x) -> str:
  aval = getattr(x, "aval", None)
  if aval is not None and hasattr(aval, "str_short"):
    return aval.str_short()
  return f"{type(x).__name__}"


def find_guards(captured: list, roots: list, covered_ids: set):
  """Guards for every array in ``captured`` that the key does not cover.

  Returns a list of :class:`Guard`, or an :class:`Unguarded` when some
  captured value cannot be guarded: a tracer (it would outlive its trace),
  or an array found under no root (its source is unknown, so no check could
  catch a change). Arrays are looked for breadth-first under ``roots``,
  through attributes, container items, and functions' cells, defaults and
  read globals.
  """
  wanted = {}
  for c in captured:
    if isinstance(c, _Tracer):
      return Unguarded(f"the trace captured a tracer ({type(c).__name__})")
    if isinstance(c, jax.Array) and id(c) not in covered_ids:
      wanted[id(c)] = c
  if not wanted:
    return []
  guards = []
  seen = set()
  queue = [(r, r, ()) for r in roots]
  head = 0
  while head < len(queue) and wanted and head < _GUARD_SEARCH_NODES:
    root, obj, path = queue[head]
    head += 1
    if id(obj) in seen:
      continue
    seen.add(id(obj))
    if id(obj) in wanted:
      guard = Guard.make(root, path, obj)
      if guard is None:
        return Unguarded(f"{_root_name(root)} cannot be weakly referenced")
      guards.append(guard)
      del wanted[id(obj)]
      continue
    for step, child in _children(obj):
      queue.append((root, child, path + (step,)))
  if not wanted:
    return guards
  where = ", ".join(_root_name(r) for r in roots[:4])
  arrays = ", ".join(describe_array(x) for x in list(wanted.values())[:3])
  return Unguarded(
      f"the trace captured {len(wanted)} array(s) ({arrays}) that the key does "
      "not cover, "
      + (f"and they were not found under {where}" if where else
         "and the key keeps no object by identity to look for them under")
      + (" (search budget spent)" if head >= _GUARD_SEARCH_NODES else ""))


# Constants larger than this are not read back to compare two traces' values.
_MADE_CONST_ELEMENTS = 1 << 16


def made_by_trace(fun, a, args, kwargs, captured: list,
                  covered_ids: set) -> set:
  """Ids of the arrays in ``captured`` that the trace made itself
  (``jnp.asarray(0 == 0)`` under ``jax.ensure_compile_time_eval()``, as
  error-checking helpers do): tracing ``fun`` again (rebuilt from ``a``,
  its analysis after the first trace, with the lifted leaves abstract)
  captures, at the same position, a *new* array of the same type and value.
  An array that existed before the trace (reached through something the key
  does not cover) is the same object in both traces; one that depends on
  something else than what the key covers (a clock, a random draw) differs
  in value; neither is returned. Side effects of the second trace are undone
  (the closure key's ``StateWatch``)."""
  from jax_closure_cache.key import rebuild

  def again(leaves, *args, **kwargs):
    return rebuild.rebuild(fun, a.key, leaves)(*args, **kwargs)
  watch = state_watch.StateWatch(fun)
  try:
    second = jax.make_jaxpr(again)(a.leaves, *args, **kwargs).consts
  except Exception:   # the second trace fails: nothing is known to be made
    return set()
  finally:
    watch.restore()
  if len(second) != len(captured):
    return set()
  made = set()
  for first, other in zip(captured, second):
    if id(first) in covered_ids or not isinstance(first, jax.Array):
      continue
    if (other is first or not isinstance(other, jax.Array)
        or getattr(first, "aval", None) != getattr(other, "aval", None)
        or first.size > _MADE_CONST_ELEMENTS
        or not np.array_equal(np.asarray(first), np.asarray(other),
                              equal_nan=True)):
      return set()
    made.add(id(first))
  return made


def _root_name(r) -> str:
  name = getattr(r, "__qualname__", None) or type(r).__name__
  return f"{name}"


def _children(obj):
  t = type(obj)
  if t in ATOMS or t is float or isinstance(obj, (jax.Array, np.ndarray)):
    return ()
  if t is dict:
    return [(("item", k), v) for k, v in obj.items()]
  if t is list or t is tuple:
    return [(("item", i), v) for i, v in enumerate(obj)]
  if t is _FunctionType:
    g = obj.__globals__
    out = [(("global", n), g[n]) for n in code_plan(obj.__code__).global_names
           if n in g and type(g[n]) is not _ModuleType]
    if obj.__closure__:
      for i, c in enumerate(obj.__closure__):
        try:
          out.append((("cell", i), c.cell_contents))
        except ValueError:
          pass
    if obj.__defaults__:
      out.extend((("default", i), d) for i, d in enumerate(obj.__defaults__))
    return out
  if t is _ModuleType or isinstance(obj, type):
    return ()
  try:
    attrs = vars(obj)
  except TypeError:
    return ()
  return [(("attr", k), v) for k, v in attrs.items()]
