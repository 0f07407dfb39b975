"""The inline cache's matchers: code generated per stored key.

``quick_matcher(fun, key)`` returns ``match`` with ``match(f)`` equal to
``f``'s lifted leaves exactly when ``closure.analyse(f).key == key``, else
None. It reads each value once, in the walk's order, and builds no key;
every object it compares with is bound by name, never written into the
source. It plays the part torch.compile's guards play.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from jax_closure_cache import _compat
from jax_closure_cache.key.values import kept_by_identity
from jax_closure_cache.key.code_plan import chain_value, code_plan, is_stable
from jax_closure_cache.key.parts import (
    ATOMS, CYCLE, DYN, FN, LIFTED, MISSING, NOCHAIN, PARTIAL, TREE, FnPart,
    Tag, float_key)

_ArrayImpl = _compat.ArrayImpl
COMMITTED = _compat.COMMITTED   # read by name in the generated text
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType
_tree_flatten = _compat.jax.tree_util.tree_flatten


# How a generated check says "not this key" (``_MatchSource.block``).
_MISS = "return None"


def _is_simple_part(part) -> bool:
  """A key part that a value can be checked against without building a key:
  a lifted array, an atom or float, a missing global, an identity object, a
  pytree of those, a ``functools.partial`` of those, or a nested function (no
  keyword defaults, no back-reference) whose cells, defaults and read globals
  are all simple."""
  if part is LIFTED or part is MISSING or part is NOCHAIN:
    return True
  if type(part) is tuple:
    if len(part) == 2 and part[0] is DYN:
      return True
    if len(part) == 2 and part[0] is CYCLE:
      return True
    if len(part) == 3 and part[0] is TREE:
      return all(map(_is_simple_part, part[2]))
    if len(part) == 4 and part[0] is PARTIAL:
      return all(map(_is_simple_part,
                     (part[1], *part[2], *(p for _, p in part[3]))))
    if len(part) == len(FnPart._fields) and part[0] is FN:
      fn = FnPart._make(part)
      return (fn.kwdefaults is None
              and len(fn.globals) == len(code_plan(fn.code).global_names)
              and all(map(_is_simple_part,
                          (*fn.cells, *(fn.defaults or ()), *fn.globals,
                           *fn.chains))))
    # an atom, a float, or a value-hashed object (a frozen dataclass, an
    # enum, a launcher's static parameters): checked by type and equality
    # (a value keyed by a representation, such as a NumPy scalar's bytes,
    # is not: the object itself would never equal its part)
    return len(part) == 2 and (part[0] in ATOMS or part[0] is float or (
        isinstance(part[0], type) and type(part[1]) is part[0]))
  return not isinstance(part, Tag)


class _MatchSource:
  """Source lines of a generated matcher, and the objects they name."""

  def __init__(self, prefix: str = "K"):
    self.name = ""         # the top function's, for tracebacks
    self.prefix = prefix   # of the names bound (several sources may share
    # one namespace: front/generated.py)
    self.env = {"MISSING": MISSING, "ArrayImpl": _ArrayImpl,
                "FunctionType": _FunctionType, "float_key": float_key,
                "partial": functools.partial,
                "tree_flatten": _tree_flatten,
                "is_stable": is_stable, "chain_value": chain_value,
                "own_attributes": own_attributes,
                "kept_by_identity": kept_by_identity,
                "ALL_LIFTED": _ALL_LIFTED}
    self.self_referenced = False   # the key refers back to its top function
    self.lines: list[str] = []
    self.functions: list[str] = []   # variables holding walked functions
    self.by_index: dict[int, str] = {}   # memo index -> that variable
    # id -> globals dict of the functions the key was analysed from: the
    # matcher compares the dict itself (cheaper than its id), which the entry
    # anchors anyway
    self.globals_by_id: dict[int, dict] = {}

  def block(self, miss: str = _MISS) -> list[str]:
    """The checks with ``out`` made: when every leaf is one appended
    variable, the appends give way to one list display after the checks
    (cheaper than appends); else ``out = []`` comes first.

    ``miss`` is the statement that says "not this key": ``return None`` in
    a matcher of its own (``compile_matcher``), ``break`` in the fast
    front's loop over a code's stored keys (``front/generated.py``). Every
    check says it as the last statement of an ``if`` at the block's own
    level (``all_lifted``'s loop only breaks out of itself)."""
    lines = [line[:-len(_MISS)] + miss if line.endswith(_MISS) else line
             for line in self.lines]
    appends = [line for line in lines if line.startswith("    out.")]
    if all(line.startswith("    out.append(") for line in appends):
      leaves = ", ".join(line[len("    out.append("):-1] for line in appends)
      return [line for line in lines if line not in appends] + [
          f"    out = [{leaves}]"]
    return ["    out = []", *lines]

  def literal(self, value) -> str:
    """``value`` as source: its repr for a str or int, else a bound name."""
    return repr(value) if type(value) in (str, int) else self.bind(value)

  def bind(self, value) -> str:
    name = f"{self.prefix}{len(self.env)}"
    self.env[name] = value
    return name

  def check(self, expr: str, part) -> None:
    """Lines that return None unless ``expr`` keys to ``part``; lifted
    arrays are appended to ``out`` in walk order."""
    add = self.lines.append
    v = f"v{len(self.lines)}"
    add(f"    {v} = {expr}")
    if part is LIFTED:
      add(f"    if type({v}) is not ArrayImpl or ({v}.{COMMITTED} and kept_by_identity({v})): return None")
      add(f"    out.append({v})")
    elif type(part) is tuple and part[0] is DYN:
      add(f"    if type({v}) is not {self.bind(part[1])}: return None")
      add(f"    out.append({v})")
    elif type(part) is tuple and part[0] is FN:
      self.function(v, part)
    elif type(part) is tuple and part[0] is CYCLE:
      # the same object as an earlier walked function (distinct otherwise)
      add(f"    if {v} is not {self.by_index[part[1]]}: return None")
    elif type(part) is tuple and part[0] is PARTIAL:
      _, func, args, keywords = part
      names = tuple(k for k, _ in keywords)
      add(f"    if type({v}) is not partial or len({v}.args) != {len(args)} "
          f"or tuple({v}.keywords) != {self.bind(names)}: return None")
      self.check(f"{v}.func", func)
      for j, p in enumerate(args):
        self.check(f"{v}.args[{j}]", p)
      for k, p in keywords:
        self.check(f"{v}.keywords[{k!r}]", p)
    elif (type(part) is tuple and part[0] is TREE and part[2]
          and all(p is LIFTED for p in part[2]) and _plain_tree(part[1])):
      # dicts, lists and tuples of arrays (a params tree): read in place,
      # in the order tree_flatten would give, without flattening
      self.plain_tree(v, part[1])
    elif type(part) is tuple and part[0] is TREE:
      leaves, treedef = f"{v}_leaves", f"{v}_def"
      add(f"    {leaves}, {treedef} = tree_flatten({v})")
      add(f"    if {treedef} != {self.bind(part[1])}: return None")
      if all(p is LIFTED for p in part[2]):   # the common params pytree
        self.all_lifted(leaves)
        add(f"    out.extend({leaves})")
      else:
        for j, leaf_part in enumerate(part[2]):
          self.check(f"{leaves}[{j}]", leaf_part)
    elif type(part) is tuple and part[0] is float:
      add(f"    if type({v}) is not float or float_key({v}) != "
          f"{self.bind(part)}: return None")
    elif type(part) is tuple:
      add(f"    if type({v}) is not {self.bind(part[0])} or {v} != "
          f"{self.bind(part[1])}: return None")
    else:
      add(f"    if {v} is not {self.bind(part)}: return None")

  def all_lifted(self, xs: str) -> None:
    """Lines that return None unless every element of ``xs`` is a liftable
    array. The loop only breaks, and the one ``return None`` is a statement
    of the matcher's own block, so the fast front can turn every
    ``return None`` of a matcher into a ``break`` (front/generated.py)."""
    add = self.lines.append
    add(f"    for x in {xs}:")
    add(f"      if type(x) is not ArrayImpl or (x.{COMMITTED} and kept_by_identity(x)): break")
    add("    else:")
    add("      x = ALL_LIFTED")
    add("    if x is not ALL_LIFTED: return None")

  def plain_tree(self, e: str, treedef) -> None:
    """Checks that variable ``e`` has the structure ``treedef`` (dicts,
    lists and tuples only) with an uncommitted array at every leaf, which
    are appended to ``out`` in tree_flatten's order (sorted dict keys)."""
    add = self.lines.append
    kind, keys = treedef.node_data()
    children = treedef.children()
    n = len(children)
    if kind is dict:
      # Every key is read below (a missing one raises KeyError: no match),
      # so equal lengths mean equal key sets.
      add(f"    if type({e}) is not dict or len({e}) != {n}: return None")
      items = [f"{e}[{self.literal(k)}]" for k in keys]
    else:
      add(f"    if type({e}) is not {self.bind(kind)} or len({e}) != {n}: "
          "return None")
      items = [f"{e}[{i}]" for i in range(n)]
    if (n > _STRAIGHT_LINE and
        all(c.num_nodes == 1 and c.num_leaves == 1 for c in children)):
      # a big node of leaves: one C-level gather, one check loop
      gather = (f"list(map({e}.__getitem__, {self.bind(tuple(keys))}))"
                if kind is dict else f"list({e})")
      xs = f"{e}_xs"
      add(f"    {xs} = {gather}")
      self.all_lifted(xs)
      add(f"    out.extend({xs})")
      return
    for i, (item, child) in enumerate(zip(items, children)):
      if child.num_nodes == 1 and child.num_leaves == 1:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        add(f"    if type({x}) is not ArrayImpl or ({x}.{COMMITTED} and kept_by_identity({x})): return None")
        add(f"    out.append({x})")
      else:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        self.plain_tree(x, child)

  def function(self, f: str, part) -> None:
    """Checks of the function in variable ``f`` against an ``FN`` part, in
    the walk's order: cells, defaults, read globals.

    The globals dict is compared by id: the part holds only its id, and a
    match is used only while its entry, which anchors that dict, is alive.
    """
    fn = FnPart._make(part)
    index, code, gid, cells, defaults, globs, chains = (
        fn.index, fn.code, fn.globals_id, fn.cells, fn.defaults, fn.globals,
        fn.chains)
    add = self.lines.append
    self.functions.append(f)
    self.by_index[index] = f
    g = self.globals_by_id.get(gid)
    same_globals = (f"{f}.__globals__ is not {self.bind(g)}" if g is not None
                    else f"id({f}.__globals__) != {gid}")
    # Once the dict is known to be ``g``, its globals are read through
    # ``g.get`` bound once (one attribute read fewer per global).
    get = (self.bind(g.get) if g is not None else f"{f}.__globals__.get")
    # no defaults: tested with the rest (the top function's usual case)
    no_defaults = f" or {f}.__defaults__ is not None" if defaults is None else ""
    # A function with attributes of its own has no key (the walk refuses
    # it). Only code that reaches a function as a value can read them: the
    # top function only through a reference to itself (reading ``__dict__``
    # makes a dict, about 0.3 us on the hit path, so it is skipped there
    # otherwise).
    attributes = (f" or {f}.__dict__ and own_attributes({f})"
                  if index != 0 or self.self_referenced else "")
    if index == 0:
      # The top function: callers look the matcher up by the code of a
      # plain function (``_quick[fun.__code__]``), so type and code hold.
      add(f"    if {same_globals} or {f}.__kwdefaults__ is not None"
          f"{no_defaults}{attributes}: return None")
    else:
      add(f"    if (type({f}) is not FunctionType or {f}.__code__ is not "
          f"{self.bind(code)} or {same_globals} "
          f"or {f}.__kwdefaults__ is not None{no_defaults}{attributes}): "
          "return None")
    # analyse keys a function of jax, numpy or the standard library by
    # identity instead
    if part[1] != 0:
      add(f"    if {f}.__closure__ is None and is_stable({f}): return None")
    if defaults is not None:
      add(f"    {f}_d = {f}.__defaults__")
      add(f"    if {f}_d is None or len({f}_d) != {len(defaults)}: return None")
    for i, p in enumerate(cells):
      self.check(f"{f}.__closure__[{i}].cell_contents", p)
    for i, p in enumerate(defaults or ()):
      self.check(f"{f}_d[{i}]", p)
    for name, p in zip(code_plan(code).global_names, globs):
      self.check(f"{get}({name!r}, MISSING)", p)
    names = code_plan(code).global_names
    for chain, p in zip(code_plan(code).chains, chains):
      kind, name, _ = chain
      if p is NOCHAIN:
        # The base is checked above: by identity when it is a module or a
        # class (then whether it is one of the user's is settled), or by its
        # own key otherwise (then it is not a namespace either).
        base = (globs[names.index(name)] if kind == "global" else
                cells[code.co_freevars.index(name)]
                if name in code.co_freevars else None)
        if base is not None and not isinstance(base, Tag) and (
            isinstance(base, (_ModuleType, type)) or type(base) is tuple):
          continue
      self.check(f"chain_value({f}, *{self.bind(chain)})", p)


def _refers_to_top(part) -> bool:
  """Whether a key holds a reference back to its top function."""
  if type(part) is not tuple:
    return False
  if len(part) == 2 and part[0] is CYCLE:
    return part[1] == 0
  return any(map(_refers_to_top, part))


def own_attributes(f) -> bool:
  """Whether function ``f`` (not the library's) has attributes of its own
  (all but ``__wrapped__``): the walk gives such a function no key."""
  return bool(f.__dict__.keys() - {"__wrapped__"}) and not is_stable(f)


_REACH_NODES = 4096   # past it, a globals dict is compared by id
# Nodes of up to this many leaves are read item by item in straight-line
# code, which costs about half the gather-and-loop form's per small dict.
_STRAIGHT_LINE = 8
_ALL_LIFTED = object()   # a loop over leaves ended without a mismatch
# Whether a cell holds a value: layer two's test, shared.
_filled = _compat.closure_key_module().cell_filled


def _plain_tree(treedef, budget: int = 4096) -> bool:
  """Whether ``treedef`` has only dict, list and tuple nodes above its
  leaves (so a matcher can read it in place), in at most ``budget`` nodes."""
  if treedef.num_nodes > budget:
    return False
  pending = [treedef]
  while pending:
    t = pending.pop()
    if t.num_nodes == 1 and t.num_leaves == 1:
      continue
    data = t.node_data()
    if data is None or data[0] not in (dict, list, tuple) or not t.children():
      return False
    pending.extend(t.children())
  return True


def _globals_reached(fun) -> dict:
  """id -> globals dict of every function a walk of ``fun`` can reach."""
  found = {}
  pending = [fun]
  seen = set()
  while pending and len(seen) < _REACH_NODES:   # unfound: compared by id
    f = pending.pop()
    if id(f) in seen:
      continue
    seen.add(id(f))
    if type(f) is _FunctionType:
      found[id(f.__globals__)] = f.__globals__
      values = [c.cell_contents for c in (f.__closure__ or ())
                if _filled(c)] + list(f.__defaults__ or ())
      values += [f.__globals__.get(n) for n in code_plan(f.__code__).global_names]
      pending.extend(values)
    elif type(f) is functools.partial:
      pending.extend([f.func, *f.args, *f.keywords.values()])
    elif type(f) in (list, tuple):
      pending.extend(f)
    elif type(f) is dict:
      pending.extend(f.values())
  return found


def quick_matcher(fun, key) -> "Callable[[Any], list | None] | None":
  """The hot path's inline cache for one key of a top-level function.

  Returns ``match`` such that, for a plain function ``f`` with ``key``'s
  code object (the callers' lookup guarantees both), ``match(f)`` is
  ``f``'s lifted leaves exactly when ``analyse(f).key == key``, and None
  otherwise; or returns None itself
  when some part of ``key`` is not simple (:func:`_is_simple_part`).
  ``match`` is generated for this key, like a ``dataclasses`` method, so it
  reads each value once with no key to build; every object it compares with
  is bound by name, never written into the source. Nested functions must be
  distinct objects, as the walk would otherwise have keyed the second
  occurrence as a back-reference. It plays the part torch.compile's guards
  play.
  """
  src = match_source(fun, key)
  return None if src is None else compile_matcher(src)


def compile_matcher(src: _MatchSource) -> Callable[[Any], list | None]:
  """``match(f)`` from the checks of :func:`match_source`."""
  text = "\n".join(
      ["def match(f):", "  try:", *src.block(),
       "  except Exception:   # an unfilled cell, a flatten that fails",
       "    return None", "  return out"])
  exec(compile(text, f"<closure-cache match {src.name}>", "exec"), src.env)
  return src.env["match"]


def match_source(fun, key, prefix: str = "K") -> _MatchSource | None:
  """The checks of :func:`quick_matcher` for ``key`` as source lines (a
  block indented by four spaces that reads the function in ``f``, appends
  the lifted leaves to ``out``, may raise, and says "no match" only by a
  ``return None`` statement of its own level), with the objects they name
  (bound as ``prefix`` and a number); or None when some part of ``key`` is
  not simple."""
  if (type(fun) is not _FunctionType or type(key) is not tuple
      or key[0] is not FN or not _is_simple_part(key)
      or fun.__code__ is not key[2] or id(fun.__globals__) != key[3]):
    return None
  src = _MatchSource(prefix)
  src.self_referenced = _refers_to_top(key)
  src.globals_by_id = _globals_reached(fun)
  src.function("f", key)
  if len(src.functions) > 1:
    ids = ", ".join(f"id({f})" for f in src.functions)
    src.lines.append(f"    if len({{{ids}}}) != {len(src.functions)}: return None")
  src.name = key[2].co_name
  src.globals_by_id = {}   # what is compared is bound in env; hold no more
  return src
