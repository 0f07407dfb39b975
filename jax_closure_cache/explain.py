"""Names for what a closure key holds, and explanations built from them.

``named_parts`` walks a key as the walk built it and names each value the
way a user reads their code: ``cell 'w'``, ``default 'n'``, ``kwdefault
'k'``, ``global 'W'``, ``partial arg 0``, ``self``, joined by `` -> `` into
nested functions and ``[i]`` into pytree leaves; ``render`` shows a part's
value and kind. ``explain_miss``, ``differences``, ``retrace_changes`` and
``name_uncacheable`` turn two keys, or a function, into those sentences.

Invariants: pure functions of keys and functions (nothing here logs, counts
or stores); a part this module cannot name is reported as such, never
guessed.
"""

from __future__ import annotations

import types
from typing import Any, Iterator

import jax

from jax_closure_cache.key import closure
from jax_closure_cache.key import code_plan
from jax_closure_cache.key import parts as key_parts


def _function_names(code) -> tuple[list[str], list[str]]:
  """Parameter names that have defaults, and the globals the code reads."""
  n_args = code.co_argcount
  return list(code.co_varnames[:n_args]), list(
      code_plan.code_plan(code).global_names)


def named_parts(fun, key, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(name, key part) for each value the walk keyed, nested parts expanded."""
  if type(key) is tuple and key and key[0] is key_parts.FN:
    fn = key_parts.FnPart._make(key)
    code, cells, defaults, kwdefaults, globs, chains = (
        fn.code, fn.cells, fn.defaults, fn.kwdefaults, fn.globals, fn.chains)
    args, global_names = _function_names(code)
    names = ([f"cell {n!r}" for n in code.co_freevars]
             + [f"default {n!r}" for n in args[len(args) - len(defaults or ()):]]
             + [f"kwdefault {k!r}" for k, _ in kwdefaults or ()]
             + [f"global {n!r}" for n in global_names]
             + [f"{kind} '{name}.{'.'.join(attrs)}'"
                for kind, name, attrs in code_plan.code_plan(code).chains])
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
      return key_parts.FnPart._make(part).code.co_qualname, "function"
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


def retrace_changes(fun, key, old_avals, new_avals, old_static=None,
                    new_static=None) -> list[str]:
  """What made a stored entry trace again: the lifted arrays whose types
  changed, or the static part of an argument (a function in pytree aux
  data) that did."""
  names = [n for n, p in named_parts(fun, key) if p is key_parts.LIFTED]
  changes = [f"{n} changed: {_aval(a)} -> {_aval(b)} (lifted array: same entry, "
             "new trace)"
             for n, a, b in zip(names, old_avals, new_avals) if a != b]
  if old_static is not None and new_static is not None:
    changes += [f"the static part of {p} changed: {a} -> {b}"
                for (p, a), (q, b) in zip(old_static, new_static)
                if p == q and a != b]
  return changes


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
