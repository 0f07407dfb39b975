"""Names for what a closure key holds, and the differences between two keys.

``named_parts`` walks a key as the walk built it and names each value the
way a user reads their code: ``cell 'w'``, ``default 'n'``, ``kwdefault
'k'``, ``global 'W'``, ``partial arg 0``, ``self``, joined by `` -> `` into
nested functions and ``[i]`` into pytree leaves; ``render`` shows a part's
value and kind; ``differences`` lists what changed between two keys of one
code. The walk's ``difference`` (the closure key module's miss explanation)
is the first of them, so JAX's ``pe.explain`` and the package's log name a
change alike.

Invariants: functions of keys and of the wrapper rules' labels (nothing
here logs, counts or stores); a part this module cannot name is reported
as such, never guessed.
"""

from __future__ import annotations

import types
from typing import Any, Iterator

from jax_closure_cache.key import code_plan
from jax_closure_cache.key import values
from jax_closure_cache.key import parts as key_parts


#: The cell in which a static-argument binder (``front/static_args``) holds
#: the jitted function's static values other than functions: a part of it,
#: met in a code that has no such cell of its own, is the function's static
#: arguments (:func:`is_binders_static_values`).
BINDER_VALUES_CELL = "static_values"


def is_binders_static_values(part_name: str, user_code) -> bool:
  """Whether a named part (:func:`named_parts`) is a static-argument
  binder's static values, not a cell of the user's code ``user_code``."""
  return (part_name.startswith(f"cell {BINDER_VALUES_CELL!r}")
          and BINDER_VALUES_CELL not in getattr(user_code, "co_freevars",
                                                (BINDER_VALUES_CELL,)))


def function_names(code) -> tuple[list[str], list[str]]:
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
    args, global_names = function_names(code)
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
      yield from named_parts(None, part,
                             _sub(prefix, name) + (" -> " if nested else ""))
  elif type(key) is tuple and key and key[0] is key_parts.TREE:
    for i, part in enumerate(key_parts.tree_part(key).leaves):
      yield from named_parts(None, part, f"{prefix}[{i}]")
  elif type(key) is tuple and key and key[0] is key_parts.PARTIAL:
    p = key_parts.PartialPart._make(key)
    yield from named_parts(None, p.func, _sub(prefix, "partial func -> "))
    for i, part in enumerate(p.args):
      yield from named_parts(None, part, _sub(prefix, f"partial arg {i}"))
    for k, part in p.keywords:
      yield from named_parts(None, part,
                             _sub(prefix, f"partial keyword {k!r}"))
  elif type(key) is tuple and key and key[0] is key_parts.METHOD:
    m = key_parts.MethodPart._make(key)
    yield from named_parts(None, m.func, _sub(prefix, "method -> "))
    yield _sub(prefix, "self"), m.instance
  elif type(key) is tuple and key and key[0] is key_parts.WRAPPER:
    w = key_parts.WrapperPart._make(key)
    kind = _sub(prefix, _label(w.type))
    yield kind, w.static
    yield from named_parts(None, w.inner, kind + " -> ")
  elif type(key) is tuple and key and key[0] is key_parts.TREEAUX:
    t = key_parts.TreeAuxPart._make(key)
    yield from _node_parts(t.nodes, _sub(prefix, "node data "))
    for i, part in enumerate(t.leaves):
      yield from named_parts(None, part, f"{prefix}[{i}]")
  elif type(key) is tuple and key and key[0] is key_parts.TREEDEF:
    yield from _node_parts(key_parts.TreeDefPart._make(key).nodes,
                           _sub(prefix, "treedef node data "))
  elif type(key) is tuple and key and (key[0] is key_parts.OBJ
                                       or key[0] is key_parts.COPY):
    o = key_parts.ObjPart._make(key)
    for item in o.items:
      if len(item) == 2 and isinstance(item[0], str):   # an attribute
        attribute, part = item
        yield from named_parts(None, part, f"{prefix}.{attribute}")
      else:   # the items of a list, tuple or dict subclass
        for i, part in enumerate(item):
          yield from named_parts(None, part, f"{prefix}[{i}]")
    if type(o.klass) is tuple:   # a user class's namespace
      yield from named_parts(None, o.klass, prefix)
  elif type(key) is tuple and key and key[0] is key_parts.CLASS:
    for owner, name, part in key_parts.ClassPart._make(key).items:
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
    node = key_parts.NodePart._make(p)
    if node.type not in key_parts.BUILTIN_NODES:
      kind = node.type.__name__
      yield from named_parts(None, node.aux, f"{prefix}of {kind} ")
      if node.klass is not None:
        yield from named_parts(None, node.klass, f"{prefix}class {kind} ")
    pending.extend(node.children)


def render(part) -> tuple[str, str]:
  """(value, kind) of a key part, for messages."""
  if part is key_parts.LIFTED:
    return "array", "lifted"
  if part is key_parts.NOCHAIN:
    return "not a module or class", "attribute chain"
  if part is key_parts.MISSING:
    return "undefined", "global"
  if type(part) is tuple and part:
    tag = part[0]   # a compound part's marker, or an atom's type
    if tag is key_parts.ALIAS:
      index = key_parts.AliasPart._make(part).index
      return f"the array of lifted place {index}", "lifted again"
    if tag is float or tag in key_parts.ATOMS:
      value = key_parts.Atom._make(part).value
      if tag is float and isinstance(value, str):
        value = float.fromhex(value)
      return repr(value), f"static {tag.__name__}"
    if tag is key_parts.NUMPY:
      n = key_parts.NumpyPart._make(part)
      shape = ",".join(map(str, n.shape))
      return f"{n.dtype}[{shape}] #{n.digest.hex()[:8]}", "numpy, baked"
    if tag is key_parts.ID:
      i = key_parts.IdPart._make(part)
      return i.label or f"object at {i.id:#x}", "kept by identity"
    if tag is key_parts.OBJ or tag is key_parts.COPY:
      kind = key_parts.IdPart._make(key_parts.ObjPart._make(part).type)
      return f"{kind.label}(...)", "object keyed by attributes"
    if tag is key_parts.FN:
      return key_parts.FnPart._make(part).code.co_qualname, "function"
    if tag is key_parts.TREE:
      return str(key_parts.tree_part(part).treedef), "pytree"
    if tag is key_parts.CYCLE:
      return (f"back-reference #{key_parts.CyclePart._make(part).index}",
              "cycle")
    if tag is key_parts.LIBATTR:
      return (_name_of(key_parts.LibAttrPart._make(part).obj),
              "library attribute, by identity")
    if tag is key_parts.WEAKREF:
      referent = key_parts.WeakrefPart._make(part).referent
      return ("dead" if referent is None else render(referent)[0],
              "weak reference")
    if tag is key_parts.PARTIAL:
      return (f"partial({render(key_parts.PartialPart._make(part).func)[0]})",
              "partial")
    if tag is key_parts.METHOD:
      return (f"method {render(key_parts.MethodPart._make(part).func)[0]}",
              "bound method")
    if tag is key_parts.WRAPPER:
      w = key_parts.WrapperPart._make(part)
      return f"{_label(w.type)}({render(w.inner)[0]})", "wrapper"
    if isinstance(tag, type) and len(part) in (2, 3):
      # an Atom, or a user class's ValuePart
      view = key_parts.Atom if len(part) == 2 else key_parts.ValuePart
      return repr(view._make(part).value), f"static {tag.__name__}"
  if isinstance(part, types.ModuleType):
    return part.__name__, "module"
  if isinstance(part, (types.FunctionType, type)):
    return part.__qualname__, "by identity"
  return repr(part), type(part).__name__


def _name_of(obj) -> str:
  module = getattr(obj, "__module__", None)
  name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
  if name is None:
    return repr(obj)
  return f"{module}.{name}" if isinstance(module, str) else name


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


def _label(cls: type) -> str:
  """What a registered wrapper class is called: its rule's label, or its
  name where it is no longer registered."""
  rule = values.wrapper_rules.get(cls)
  return cls.__name__ if rule is None else rule.label
