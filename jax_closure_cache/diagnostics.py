"""Why a call missed or fell back, recompile storms, monitoring events, and
per-location statistics.

Invariants:
* Nothing here runs on a cache hit except :func:`hit`, which bumps a record
  and emits a ``jax.monitoring`` event only when a listener is registered.
* Explanations are logged through the ``jax_closure_cache`` logger when JAX's
  ``jax_explain_cache_misses`` option or ``JAX_CLOSURE_CACHE_EXPLAIN`` is on;
  they are computed only then.
* The storm guard logs at most once per user code object, at WARNING
  through the ``jax_closure_cache`` logger (never through ``warnings``).

Names in messages follow the walk: ``cell 'w'``, ``default 'n'``,
``kwdefault 'k'``, ``global 'W'``, ``partial arg 0``, ``self``, joined by
`` -> `` into nested functions and ``[i]`` into pytree leaves.
"""

from __future__ import annotations

import collections
import logging
import threading
import types
from typing import Any, Iterator

import jax

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache import settings
from jax_closure_cache.key import closure
from jax_closure_cache.key import parts as key_parts

logger = logging.getLogger("jax_closure_cache")

EXPLAIN_ENV = settings.EXPLAIN.name
DEFAULT_STORM_THRESHOLD = settings.STORM_THRESHOLD.default
_storm_threshold = settings.read(settings.STORM_THRESHOLD)


def storm_threshold() -> int:
  """Entries one code object may accumulate before the storm warning."""
  return _storm_threshold


def set_storm_threshold(n: int) -> None:
  """Warn once when a code object accumulates more than ``n`` entries."""
  global _storm_threshold
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"storm threshold must be a positive int, got {n!r}")
  _storm_threshold = n


def explaining() -> bool:
  return settings.read(settings.EXPLAIN) or _compat.explain_cache_misses()


# -- per-location records ----------------------------------------------------

class Record:
  """One entry's counts: hits, and the trace+compile seconds of its miss.

  ``front`` counts the fast front's hits (generated.HIT adds to it and
  to nothing else, so a hit there costs one statement); ``hits`` counts the
  others, which also count in ``cache.counters``. Under the GIL of CPython
  3.11 ``record.front += 1`` runs no check for a thread switch between its
  read and its write, so the count is exact.
  """
  __slots__ = ("hits", "cost", "front")

  def __init__(self, cost: float):
    self.hits = 0
    self.front = 0
    self.cost = cost

  @property
  def total(self) -> int:
    return self.hits + self.front


class CodeStats:
  """Everything seen for one code object (one source location)."""
  __slots__ = ("location", "misses", "fallbacks", "records", "keys", "warned")

  def __init__(self, location: str):
    self.location = location
    self.misses = 0
    self.fallbacks: collections.Counter = collections.Counter()
    self.records: list[Record] = []
    # recent keys of this code: (options key, function key), newest last
    self.keys: collections.deque = collections.deque(maxlen=64)
    self.warned = False

  @property
  def hits(self) -> int:
    return sum(r.total for r in self.records)

  @property
  def seconds_avoided(self) -> float:
    return sum(r.total * r.cost for r in self.records)


_by_code: dict[Any, CodeStats] = {}
_lock = threading.Lock()
cache.register_clear_hook(_by_code.clear)


def _front_hits() -> int:
  """The fast front's hits since the last clear (every entry it can hit
  has a record here: the front is built for stored entries only)."""
  with _lock:
    stats = list(_by_code.values())
  return sum(r.front for s in stats for r in list(s.records))


cache.register_hit_count(_front_hits)


def location(fun) -> str:
  """``name (file:line)`` of the function under ``fun``'s wrappers."""
  inner = fun
  while True:
    if isinstance(inner, types.FunctionType):
      code = inner.__code__
      return f"{inner.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    inner = (getattr(inner, "func", None) or getattr(inner, "__func__", None)
             or getattr(inner, "_fun", None))
    if inner is None:
      return repr(fun)


def _stats(code, fun) -> CodeStats:
  s = _by_code.get(code)
  if s is None:
    with _lock:
      s = _by_code.setdefault(code, CodeStats(location(fun)))
  return s


def summary(top: int = 10) -> dict:
  """Counters, the busiest locations, and trace+compile time avoided."""
  rows = sorted(_by_code.values(),
                key=lambda s: -(s.hits + s.misses + sum(s.fallbacks.values())))
  return {
      **cache.stats(),
      "seconds_avoided": sum(s.seconds_avoided for s in _by_code.values()),
      "locations": [{"location": s.location, "hits": s.hits,
                     "misses": s.misses, "fallbacks": dict(s.fallbacks),
                     "seconds_avoided": s.seconds_avoided}
                    for s in rows[:top]],
  }


# -- the cost of a compile stock makes for us -----------------------------------
#
# A closure-free function's first object is handed stock's own jitted object
# before it is called, so its trace and compile happen later, inside stock.
# JAX reports their durations as monitoring events; they are added to that
# entry's record until the next cache event, so ``run`` can say how much
# time its hits avoided.

class _Unmeasured(threading.local):
  record = None


_unmeasured = _Unmeasured()


def _on_duration(event: str, seconds: float, **_) -> None:
  record = _unmeasured.record
  if record is not None and event in _compat.COMPILE_DURATION_EVENTS:
    record.cost += seconds


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def measure_later(record: Record) -> None:
  """Attribute the trace and compile JAX reports next to ``record``."""
  _unmeasured.record = record


# -- events ------------------------------------------------------------------

_monitoring_active = _compat.monitoring_active


def hit(record: Record) -> None:
  _unmeasured.record = None
  record.hits += 1
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/hit")


def miss(fun, code, full_key, cost: float, first_object: bool = False) -> Record:
  """Record a miss; explain it and guard storms. ``first_object``: the first
  function object of its code, left to stock's own jit (identity first)."""
  _unmeasured.record = None
  record = Record(cost)
  s = _stats(code, fun)
  with _lock:
    s.misses += 1
    s.records.append(record)
    previous = list(s.keys)
    s.keys.append(full_key)
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/miss")
  if explaining():
    why = explain_miss(fun, full_key, previous)
    if first_object:
      why = why + ["first function object of this code: stock jit traces it "
                   "(a re-created one compiles the shared lifted entry)"]
    logger.warning("closure-cache miss for %s: %s", s.location, "; ".join(why))
  distinct = len(set(_hashable(k) for k in previous + [full_key]))
  if distinct > _storm_threshold and not s.warned:
    s.warned = True
    _warn_storm(fun, code, s, previous + [full_key])
  return record


def _hashable(key):
  try:
    hash(key)
    return key
  except TypeError:
    return id(key)


def became_dynamic(fun, old_full_key, new_full_key) -> None:
  """Explain that Python scalars became arguments (auto-dynamic)."""
  what = "; ".join(differences(fun, old_full_key[1], new_full_key[1])) or \
      "a Python scalar changed"
  logger.warning("closure-cache: %s: %s; from now on passed as a weakly "
                 "typed argument (one executable for every value)",
                 location(fun), what)


def stays_static(fun, old_full_key, new_full_key, why: str) -> None:
  """Explain that Python scalars stay static: verification failed."""
  code = getattr(fun, "__code__", None)
  if code is not None:
    _stats(code, fun).fallbacks["scalar_stays_static"] += 1
  if explaining():
    what = "; ".join(differences(fun, old_full_key[1], new_full_key[1])) or \
        "a Python scalar changed"
    logger.warning("closure-cache: %s: %s; it stays static (keyed by value): "
                   "traced as an argument it computes something else: %s",
                   location(fun), what, why)


def not_stored(fun, reason: str, detail: str) -> None:
  """A missed entry that was not stored: say why (explanations only)."""
  if explaining():
    logger.warning("closure-cache entry not stored for %s (%s): %s; later "
                   "re-created closures of this code will miss again",
                   location(fun), reason, detail)


def fallback(fun, code, reason: str, detail: str) -> None:
  if code is not None:
    _stats(code, fun).fallbacks[reason] += 1
  if _monitoring_active():
    jax.monitoring.record_event("/jax_closure_cache/fallback", reason=reason)
  if explaining():
    logger.warning("closure-cache fallback to stock jit for %s: %s",
                   location(fun), name_uncacheable(fun) or detail)


# -- naming the parts of a key ------------------------------------------------

def built_too_early(names: list) -> None:
  """At ``enable()``: stock jitted functions outside JAX that take
  functions statically and were built before it (never reached)."""
  if names and explaining():
    logger.warning("closure-cache: enable() came after these stock jitted "
                   "functions that take functions as static arguments were "
                   "built: %s; fresh functions passed to them compile on "
                   "every call, as with stock (enable() before importing "
                   "their modules, or set JAX_CLOSURE_CACHE=1)",
                   ", ".join(names))


def _function_names(code) -> tuple[list[str], list[str]]:
  """Parameter names that have defaults, and the globals the code reads."""
  n_args = code.co_argcount
  return list(code.co_varnames[:n_args]), list(
      closure.code_plan(code).global_names)


def named_parts(fun, key, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(name, key part) for each value the walk keyed, nested parts expanded."""
  if type(key) is tuple and key and key[0] is key_parts.FN:
    _, _, code, _, cells, defaults, kwdefaults, globs, chains = key
    args, global_names = _function_names(code)
    names = ([f"cell {n!r}" for n in code.co_freevars]
             + [f"default {n!r}" for n in args[len(args) - len(defaults or ()):]]
             + [f"kwdefault {k!r}" for k, _ in kwdefaults or ()]
             + [f"global {n!r}" for n in global_names]
             + [f"{kind} '{name}.{'.'.join(attrs)}'"
                for kind, name, attrs in closure.code_plan(code).chains])
    parts = (*cells, *(defaults or ()), *(p for _, p in kwdefaults or ()),
             *globs, *chains)
    for name, part in zip(names, parts):
      nested = type(part) is tuple and part and part[0] is key_parts.FN
      yield from named_parts(None, part, prefix + name + (" -> " if nested else ""))
  elif type(key) is tuple and key and key[0] is key_parts.TREE:
    for i, part in enumerate(key[2]):
      yield from named_parts(None, part, f"{prefix}[{i}]")
  elif type(key) is tuple and key and key[0] is key_parts.PARTIAL:
    yield from named_parts(None, key[1], prefix + "partial func -> ")
    for i, part in enumerate(key[2]):
      yield from named_parts(None, part, f"{prefix}partial arg {i}")
    for k, part in key[3]:
      yield from named_parts(None, part, f"{prefix}partial keyword {k!r}")
  elif type(key) is tuple and key and key[0] is key_parts.METHOD:
    yield from named_parts(None, key[1], prefix + "method -> ")
    yield prefix + "self", key[2]
  elif type(key) is tuple and key and key[0] is key_parts.WRAPPER:
    kind = _sub(prefix, "jitted" if key[1].__name__.endswith("Jitted")
                else key[1].__name__)
    yield kind, key[2]
    yield from named_parts(None, key[3], kind + " -> ")
  elif type(key) is tuple and key and key[0] is key_parts.TREEAUX:
    yield from _node_parts(key[1], _sub(prefix, "node data "))
    for i, part in enumerate(key[2]):
      yield from named_parts(None, part, f"{prefix}[{i}]")
  elif type(key) is tuple and key and key[0] is key_parts.TREEDEF:
    yield from _node_parts(key[1], _sub(prefix, "treedef node data "))
  elif type(key) is tuple and key and (key[0] is key_parts.OBJ
                                       or key[0] is key_parts.COPY):
    for item in key[3]:
      if len(item) == 2 and isinstance(item[0], str):   # an attribute
        yield from named_parts(None, item[1], f"{prefix}.{item[0]}")
      else:   # the items of a list, tuple or dict subclass
        for i, part in enumerate(item):
          yield from named_parts(None, part, f"{prefix}[{i}]")
    if type(key[4]) is tuple:   # a user class's namespace
      yield from named_parts(None, key[4], prefix)
  elif type(key) is tuple and key and key[0] is key_parts.CLASS:
    for owner, name, part in key[3]:
      nested = type(part) is tuple and part and part[0] is key_parts.FN
      yield from named_parts(None, part, f"{prefix} class {owner}.{name}"
                             + (" -> " if nested else ""))
  else:
    yield prefix.rstrip(" ->") or "value", key


def _sub(prefix: str, name: str) -> str:
  """``name`` under ``prefix`` (a cell, an item) in a part's name."""
  if not prefix or prefix.endswith((" ", "> ")):
    return prefix + name
  return f"{prefix} -> {name}"


def _node_parts(parts, prefix: str) -> Iterator[tuple[str, Any]]:
  """Named parts of the custom nodes' data of a treedef keyed node by node
  (``closure.Analysis.node_parts``)."""
  pending = [parts]
  while pending:
    p = pending.pop()
    if p is None:
      continue
    node_type, aux, children = p
    if node_type not in key_parts.BUILTIN_NODES:
      yield from named_parts(None, aux, f"{prefix}of {node_type.__name__} ")
    pending.extend(children)


def render(part) -> tuple[str, str]:
  """(value, kind) of a key part, for messages."""
  if part is closure.LIFTED:
    return "array", "lifted"
  if type(part) is tuple and len(part) == 2 and part[0] is key_parts.DYN:
    return f"any {part[1].__name__}", "passed as an argument (auto-dynamic)"
  if part is key_parts.NOCHAIN:
    return "not a module or class", "attribute chain"
  if part is key_parts.MISSING:
    return "undefined", "global"
  if type(part) is tuple and part:
    tag = part[0]
    if tag is float or tag in key_parts.ATOMS:
      value = part[1]
      if tag is float and isinstance(value, str):
        value = float.fromhex(value)
      return repr(value), f"static {tag.__name__}"
    if tag is key_parts.NUMPY:
      shape = ",".join(map(str, part[2]))
      return f"{part[1]}[{shape}] #{part[3].hex()[:8]}", "numpy, baked"
    if tag is key_parts.ID:
      label = part[2] if len(part) > 2 else f"object at {part[1]:#x}"
      return label, "kept by identity"
    if tag is key_parts.OBJ or tag is key_parts.COPY:
      return f"{part[2].__name__}(...)", "object keyed by attributes"
    if tag is key_parts.FN:
      return part[2].co_qualname, "function"
    if tag is key_parts.TREE:
      return str(part[1]), "pytree"
    if tag is key_parts.CYCLE:
      return f"back-reference #{part[1]}", "cycle"
    if isinstance(tag, type):
      return repr(part[1]), f"static {tag.__name__}"
  if isinstance(part, types.ModuleType):
    return part.__name__, "module"
  if isinstance(part, (types.FunctionType, type)):
    return part.__qualname__, "by identity"
  return repr(part), type(part).__name__


def _describe_change(name: str, old, new) -> str:
  old_value, _ = render(old)
  new_value, kind = render(new)
  return f"{name} changed: {old_value} -> {new_value} ({kind})"


def differences(fun, old_key, new_key) -> list[str]:
  old = dict(named_parts(fun, old_key))
  new = list(named_parts(fun, new_key))
  if [n for n, _ in new] != list(old):
    return ["the closure's structure changed: "
            + ", ".join(n for n, _ in new if n not in old) or "reordered"]
  return [_describe_change(n, old[n], p) for n, p in new if old[n] != p]


def explain_miss(fun, full_key, previous: list) -> list[str]:
  """What differs from the nearest earlier key of the same code."""
  options, key = full_key
  if not previous:
    return ["first call of this code"]
  best = None
  for old_options, old_key in previous:
    diffs = differences(fun, old_key, key)
    if old_options != options:
      diffs = ["jit options changed"] + diffs
    elif not diffs and old_key != key:
      diffs = ["the closure's contents changed in a part this explanation "
               "cannot name"]
    if best is None or len(diffs) < len(best):
      best = diffs
  if best:
    return best
  if len(previous) == 1:
    # by design: the first object of a code was stock's own
    return ["same closure contents as the first function object of this "
            "code, which stock jit traced; this second object compiles the "
            "shared lifted entry that later ones hit"]
  return ["same closure contents as an earlier miss, whose entry is gone "
          "(evicted past capacity, cleared, or not stored: see the "
          "'entry not stored' explanation)"]


def describe_static_parts(tree) -> list[tuple[str, str]]:
  """(path, description) of every node's static part (pytree aux data) in
  ``tree``, functions by their qualified name, in flattening order."""
  out = []
  pending = [("args", jax.tree_util.tree_structure(tree))]
  while pending:
    path, treedef = pending.pop()
    data = treedef.node_data()
    if data is None:
      continue
    kind, aux = data
    if aux is not None and kind not in (dict, list, tuple):
      out.append((f"{path}: {kind.__name__}", _describe_aux(aux)))
    for i, child in enumerate(treedef.children()):
      pending.append((f"{path}[{i}]", child))
  return out


def _describe_aux(aux) -> str:
  if isinstance(aux, (tuple, list)):
    return "(" + ", ".join(_describe_aux(a) for a in aux) + ")"
  if callable(aux) and hasattr(aux, "__qualname__"):
    code = getattr(aux, "__code__", None)
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code else ""
    return f"function {aux.__qualname__}{where} (object {id(aux):#x})"
  return repr(aux)


def explain_retrace(fun, key, old_avals, new_avals, old_static=None,
                    new_static=None) -> None:
  """A hit traced its shared function again: name the arrays that changed,
  or the static part of an argument (a function in pytree aux data) that
  did."""
  names = [n for n, p in named_parts(fun, key) if p is closure.LIFTED]
  changes = [f"{n} changed: {_aval(a)} -> {_aval(b)} (lifted array: same entry, "
             "new trace)"
             for n, a, b in zip(names, old_avals, new_avals) if a != b]
  if old_static is not None and new_static is not None:
    changes += [f"the static part of {p} changed: {a} -> {b}"
                for (p, a), (q, b) in zip(old_static, new_static)
                if p == q and a != b]
  logger.warning("closure-cache retrace for %s: %s", location(fun),
                 "; ".join(changes) or "argument types changed")


def _aval(aval) -> str:
  if not hasattr(aval, "str_short"):
    return str(aval)
  weak = " (weakly typed)" if getattr(aval, "weak_type", False) else ""
  return aval.str_short() + weak


def name_uncacheable(fun) -> str | None:
  """Which top-level value made ``fun`` uncacheable, as ``cell 'x' holds ...``."""
  if not isinstance(fun, types.FunctionType):
    return None
  code = fun.__code__
  args, global_names = _function_names(code)
  defaults = fun.__defaults__ or ()
  values = ([(f"cell {n!r}", c) for n, c in zip(code.co_freevars,
                                                 fun.__closure__ or ())]
            + [(f"default {n!r}", d) for n, d in
               zip(args[len(args) - len(defaults):], defaults)]
            + [(f"kwdefault {k!r}", v) for k, v in (fun.__kwdefaults__ or {}).items()]
            + [(f"global {n!r}", fun.__globals__[n]) for n in global_names
               if n in fun.__globals__])
  for name, value in values:
    if name.startswith("cell"):
      try:
        value = value.cell_contents
      except ValueError:
        continue
    try:
      closure.analyse(_holding(value))
    except closure.Uncacheable as e:
      if e.reason == "tracer":
        return f"{name} holds a tracer ({e.detail})"
      return f"{name} holds an unhashable {type(value).__name__} ({e.detail})"
  return None


def _holding(value):
  return lambda: value


# -- recompile storms ----------------------------------------------------------

def _warn_storm(fun, code, s: CodeStats, keys: list) -> None:
  """Log once per user code object, as a record attributed to that code's
  file and line, naming the value that keeps changing. Logging, not
  ``warnings``: a storm is a performance note, and ``-W error`` suites must
  not fail on it."""
  changing = collections.defaultdict(set)
  for _, key in keys:
    for name, part in named_parts(fun, key):
      try:
        changing[name].add(part)
      except TypeError:
        changing[name].add(id(part))
  culprits = sorted((n for n, parts in changing.items() if len(parts) > 1),
                    key=lambda n: -len(changing[n]))
  if culprits:
    name = culprits[0]
    examples = ", ".join(render(p)[0] for p in list(changing[name])[:3])
    what = f"{name} keeps changing ({examples}, ...)"
  else:
    what = "its closure keeps changing"
  message = (f"jax_closure_cache: {s.location} has compiled {len(keys)} "
             f"entries (more than {_storm_threshold}); {what}. Pass that value "
             "as an argument, or make it a jax array so it is lifted instead "
             "of baked into each executable.")
  filename = getattr(code, "co_filename", "?")
  lineno = getattr(code, "co_firstlineno", 0)
  if logger.isEnabledFor(logging.WARNING):
    record = logger.makeRecord(logger.name, logging.WARNING, filename, lineno,
                               message, (), None,
                               func=getattr(code, "co_name", None))
    logger.handle(record)
