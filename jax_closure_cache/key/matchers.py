"""The inline cache's matchers: code generated per stored key.

``quick_matcher(fun, key)`` returns ``match`` with ``match(f)`` equal to
``f``'s lifted leaves exactly when ``closure.analyse(f).key == key``, else
None. It reads each value once, in the walk's order, and builds no key;
every object it compares with is bound by name, never written into the
source. It plays the part torch.compile's guards play.
"""

from __future__ import annotations

import functools
import itertools
import types
from typing import Any, Callable

from jax_closure_cache import _compat
from jax_closure_cache.key.values import Static, drawn_from
from jax_closure_cache.key import match_plan
from jax_closure_cache.key import trees
from jax_closure_cache.key import versions
from jax_closure_cache.key.code_plan import (
    chain_read, code_plan, is_stable, library_value, may_be_stable)
from jax_closure_cache.key.parts import (
    ALIAS, ATOMS, CYCLE, FN, LIBATTR, LIFTED, MISSING, NOCHAIN,
    PARTIAL, TREE, TREEAUX, AliasPart, Atom, CyclePart, FnPart, LibAttrPart,
    NodePart, PartialPart, Tag, TreeAuxPart, TreePart, float_key, tree_part)

_ArrayImpl = _compat.ArrayImpl
COMMITTED = _compat.COMMITTED   # read by name in the generated text
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType
_tree_flatten = _compat.jax.tree_util.tree_flatten


class _MissIf(str):
  """A check's condition: when it holds, the function does not match this
  key. ``_MatchSource.block`` writes it as ``if <condition>: <miss>``."""
  __slots__ = ()


class _MatchSource:
  """Source lines of a generated matcher, and the objects they name."""

  def __init__(self, prefix: str = "K"):
    self.name = ""         # the top function's, for tracebacks
    self.prefix = prefix   # of the names bound (several sources may share
    # one namespace: front/generated.py)
    self.env = {"MISSING": MISSING, "ArrayImpl": _ArrayImpl,
                "FunctionType": _FunctionType, "float_key": float_key,
                "layout_or_none": trees.layout_or_none,
                "partial": functools.partial,
                "tree_flatten": _tree_flatten,
                "is_stable": is_stable, "chain_read": chain_read,
                "library_value": library_value,
                "own_attributes": own_attributes,
                "drawn_from": drawn_from, "Static": Static,
                "ALL_LIFTED": _ALL_LIFTED, "version": versions.version}
    self.self_referenced = False   # the key refers back to its top function
    self.lines: list[str] = []
    # (variable, code object) of each walked function
    self.functions: list[tuple[str, Any]] = []
    self.by_index: dict[int, str] = {}   # memo index -> that variable
    # leaf index -> the expression holding that lifted array (what an
    # ``(ALIAS, i)`` part is checked against by identity)
    self.leaf_exprs: list[str] = []
    # id -> globals dict of the functions the key was analysed from: the
    # matcher compares the dict itself (cheaper than its id), which the entry
    # anchors anyway
    self.globals_by_id: dict[int, dict] = {}
    # (id of a globals dict compared by identity, name) -> the part a check
    # above compared that global with (a second function of the same module
    # reading the same name is not checked again: ``function``)
    self.read_globals: dict[tuple[int, str], Any] = {}
    # id -> (globals dict, conditions): checks of its globals skipped while
    # its version tag holds (``function``; written by ``tagged_checks``)
    self.unchanged: dict[int, tuple[dict, list[str]]] = {}

  def miss_if(self, condition: str) -> None:
    """A check at the block's own level: ``condition`` holds for a
    function that does not match."""
    self.lines.append(_MissIf(condition))

  def block(self, miss: str = "return None") -> list[str]:
    """The checks with ``out`` made: when every leaf is one appended
    variable, the appends give way to one list display after the checks
    (cheaper than appends); else ``out = []`` comes first.

    ``miss`` is the statement that says "not this key": ``return None`` in
    a matcher of its own (``compile_matcher``), ``break`` in the fast
    front's loop over a code's stored keys (``front/generated.py``). Every
    check says it as the last statement of an ``if`` at the block's own
    level (``miss_if``; ``all_lifted``'s loop only breaks out of itself)."""
    lines = [f"    if {line}: {miss}" if type(line) is _MissIf else line
             for line in self.lines]
    appends = [line for line in lines if line.startswith("    out.")]
    # Each lifted array is one object: a function holding one array at two
    # lifted places has another key (an ALIAS part, never matched here).
    distinct = ([f"    if len(set(map(id, out))) != len(out): {miss}"]
                if len(appends) > 1 or any(line.startswith("    out.extend(")
                                           for line in appends) else [])
    if all(line.startswith("    out.append(") for line in appends):
      names = [line[len("    out.append("):-1] for line in appends]
      if 1 < len(names) <= _PAIRWISE:   # fewer pairs than a set costs
        pairs = " or ".join(f"{a} is {b}"
                            for a, b in itertools.combinations(names, 2))
        distinct = [f"    if {pairs}: {miss}"]
      return [line for line in lines if line not in appends] + [
          f"    out = [{', '.join(names)}]", *distinct]
    return ["    out = []", *lines, *distinct]

  def literal(self, value) -> str:
    """``value`` as source: its repr for a str or int, else a bound name."""
    return repr(value) if type(value) in (str, int) else self.bind(value)

  def bind(self, value) -> str:
    name = f"{self.prefix}{len(self.env)}"
    self.env[name] = value
    return name

  def check(self, expr: str, part) -> None:
    """Checks that ``expr`` keys to ``part``; lifted arrays are appended to
    ``out`` in walk order."""
    add = self.lines.append
    v = f"v{len(self.lines)}"
    add(f"    {v} = {expr}")
    if part is LIFTED:
      self.miss_if(f"type({v}) is not ArrayImpl or {v}.{COMMITTED}")
      add(f"    out.append({v})")
      self.leaf_exprs.append(v)
    elif type(part) is tuple and part[0] is ALIAS:
      # the same array object as an earlier lifted place
      index = AliasPart._make(part).index
      self.miss_if(f"{v} is not {self.leaf_exprs[index]}")
    elif type(part) is tuple and part[0] is FN:
      self.function(v, part)
    elif type(part) is tuple and part[0] is CYCLE:
      # the same object as an earlier walked function (distinct otherwise)
      index = CyclePart._make(part).index
      self.miss_if(f"{v} is not {self.by_index[index]}")
    elif type(part) is tuple and part[0] is PARTIAL:
      p = PartialPart._make(part)
      names = tuple(k for k, _ in p.keywords)
      # (no attributes: the walk refuses a partial with any, such as the
      # name ``update_wrapper`` gives it, which JAX names its trace by)
      self.miss_if(f"type({v}) is not partial or len({v}.args) != "
                   f"{len(p.args)} or tuple({v}.keywords) != "
                   f"{self.bind(names)} or {v}.__dict__")
      self.check(f"{v}.func", p.func)
      for j, arg in enumerate(p.args):
        self.check(f"{v}.args[{j}]", arg)
      for k, keyword in p.keywords:
        self.check(f"{v}.keywords[{k!r}]", keyword)
    elif type(part) is tuple and part[0] is TREE:
      self.tree(v, tree_part(part))
    elif type(part) is tuple and part[0] is TREEAUX:
      self.tree_aux(v, TreeAuxPart._make(part))
    else:
      self.miss_if(self._value_condition(v, v, part))

  def _value_condition(self, first: str, again: str, part) -> str:
    """The condition that a value compared by itself (by identity, a
    library attribute, a float key, a ``Static``, an atom) does not key to
    ``part``: ``first`` reads the value, ``again`` reads it after that."""
    if type(part) is not tuple:
      return f"{first} is not {self.bind(part)}"
    if part[0] is LIBATTR:   # by identity
      return f"{first} is not {self.bind(LibAttrPart._make(part).obj)}"
    if part[0] is float:
      return (f"type({first}) is not float or float_key({again}) != "
              f"{self.bind(part)}")
    if part[0] is Static:
      # what Static's == compares (the hashes first: a value's own == may
      # say equal where its hash differs), without its Python-level call
      # (the key's own object first: ``Static.of`` hands out one object
      # per value, so a launcher's parameters are usually that very one)
      return (f"{first} is not {self.bind(part[1])} and (type({again}) is "
              f"not Static or {again}.ident_hash != "
              f"{self.bind(part[1].ident_hash)} or {again}.ident != "
              f"{self.bind(part[1].ident)})")
    atom = Atom._make(part)   # an Atom (match_plan.simple_part)
    return (f"type({first}) is not {self.bind(atom.type)} or {again} != "
            f"{self.bind(atom.value)}")

  def tree(self, v: str, t: TreePart) -> None:
    """Checks of the pytree in variable ``v`` against a ``TREE`` part."""
    add = self.lines.append
    if (t.leaves and all(p is LIFTED for p in t.leaves)
        and match_plan.plain_tree(t.treedef)
        and match_plan.plain_keys(t.layout)):
      # dicts, lists and tuples of arrays (a params tree): read in place,
      # in the order tree_flatten would give, without flattening
      self.plain_tree(v, t.treedef, iter(t.layout))
      return
    leaves, treedef = f"{v}_leaves", f"{v}_def"
    add(f"    {leaves}, {treedef} = tree_flatten({v})")
    self.miss_if(f"{treedef} != {self.bind(t.treedef)}")
    # dict keys by exact type and in insertion order (a treedef compares
    # them with == and sorted)
    self.miss_if(f"layout_or_none({v}, {treedef}) != {self.bind(t.layout)}")
    if all(p is LIFTED for p in t.leaves):   # the common params pytree
      self.all_lifted(leaves)
      add(f"    out.extend({leaves})")
      self.leaf_exprs += [f"{leaves}[{j}]" for j in range(len(t.leaves))]
    else:
      for j, leaf_part in enumerate(t.leaves):
        self.check(f"{leaves}[{j}]", leaf_part)

  def tree_aux(self, v: str, t: TreeAuxPart) -> None:
    """Checks of the pytree in variable ``v`` against a ``TREEAUX`` part
    (``closure.Analysis.tree_parts``), in the walk's order: its nodes (each
    custom node's data as the walk keys it), then its leaves; its layout
    too. A root that is not a dict, list or tuple was keyed by
    ``Analysis.opaque``, which refuses what a trace draws from and a node
    whose data is itself (its flatten covers the rest of its state, which
    the layout checks)."""
    add = self.lines.append
    leaves, treedef = f"{v}_leaves", f"{v}_def"
    root = NodePart._make(t.nodes)
    opaque = root.type not in (dict, list, tuple)
    if opaque:
      self.miss_if(f"drawn_from({v})")
    add(f"    {leaves}, {treedef} = tree_flatten({v})")
    self.nodes(treedef, root, v if opaque else None)
    # dict keys by exact type and in insertion order; a custom node whose
    # state is outside its flatten: None
    self.miss_if(f"layout_or_none({v}, {treedef}) != {self.bind(t.layout)}")
    self.miss_if(f"len({leaves}) != {len(t.leaves)}")
    for j, leaf_part in enumerate(t.leaves):
      self.check(f"{leaves}[{j}]", leaf_part)

  def nodes(self, d: str, node, itself: str | None = None) -> None:
    """Checks of the treedef in variable ``d`` against a ``NodePart`` (None:
    a leaf), as ``closure.Analysis.node_parts`` walks it: a built-in node's
    data by value, a custom node's as any value (its class, of a stable
    module, by identity: ``match_plan.simple_nodes``), then the children.
    ``itself``: the root's value, which its node data must not be."""
    add = self.lines.append
    data = f"{d}_data"
    add(f"    {data} = {d}.node_data()")
    if node is None:
      self.miss_if(f"{data} is not None")
      return
    n = NodePart._make(node)
    self.miss_if(f"{data} is None or {data}[0] is not {self.bind(n.type)}")
    if n.klass is None:   # a built-in node (dict keys: sorted)
      self.miss_if(f"(tuple({data}[1]) if type({data}[1]) is list else "
                   f"{data}[1]) != {self.bind(n.aux)}")
    else:
      if itself is not None:
        self.miss_if(f"{data}[1] is {itself}")
      self.check(f"{data}[1]", n.aux)
    children = f"{d}_c"
    add(f"    {children} = {d}.children()")
    self.miss_if(f"len({children}) != {len(n.children)}")
    for i, child in enumerate(n.children):
      x = f"{d}_{i}"
      add(f"    {x} = {children}[{i}]")
      self.nodes(x, child)

  def all_lifted(self, xs: str) -> None:
    """Checks that every element of ``xs`` is a liftable array. The loop
    only breaks out of itself; its one miss is a check of the block's own
    level, after it."""
    add = self.lines.append
    add(f"    for x in {xs}:")
    add(f"      if type(x) is not ArrayImpl or x.{COMMITTED}: break")
    add("    else:")
    add("      x = ALL_LIFTED")
    self.miss_if("x is not ALL_LIFTED")

  def plain_tree(self, e: str, treedef, layout) -> None:
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
      self.miss_if(f"type({e}) is not dict or len({e}) != {n}")
      # its keys as the walk saw them: insertion order and exact types
      # (``match_plan.plain_keys``: str and int keys, whose == is exact
      # within one type)
      order = next(layout)
      by_atom = {(type(k), k): k for k in keys}
      inserted = tuple([by_atom[a] for a in order])
      key_types = tuple([Atom._make(a).type for a in order])
      self.miss_if(f"tuple({e}) != {self.bind(inserted)} or "
                   f"tuple(map(type, {e})) != {self.bind(key_types)}")
      items = [f"{e}[{self.literal(k)}]" for k in keys]
    else:
      self.miss_if(f"type({e}) is not {self.bind(kind)} or len({e}) != {n}")
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
      self.leaf_exprs += [f"{xs}[{j}]" for j in range(n)]
      return
    for i, (item, child) in enumerate(zip(items, children)):
      if child.num_nodes == 1 and child.num_leaves == 1:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        self.miss_if(f"type({x}) is not ArrayImpl or {x}.{COMMITTED}")
        add(f"    out.append({x})")
        self.leaf_exprs.append(x)
      else:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        self.plain_tree(x, child, layout)

  def function(self, f: str, part) -> None:
    """Checks of the function in variable ``f`` against an ``FN`` part, in
    the walk's order: what the function is, cells, defaults, read globals,
    attribute chains."""
    fn = FnPart._make(part)
    self.functions.append((f, fn.code))
    self.by_index[fn.index] = f
    get = self._function_itself(f, fn)
    for i, p in enumerate(fn.cells):
      self.check(f"{f}.__closure__[{i}].cell_contents", p)
    for i, p in enumerate(fn.defaults or ()):
      self.check(f"{f}_d[{i}]", p)
    known = fn.globals_id in self.globals_by_id   # compared by identity
    unchanged = []   # conditions skipped while the dict's tag holds
    for name, p in zip(code_plan(fn.code).global_names, fn.globals):
      if known:
        prior = self.read_globals.get((fn.globals_id, name), _UNREAD)
        if _same_read(prior, p):
          continue
        self.read_globals[(fn.globals_id, name)] = p
        condition = self._changed_if(f"{get}({name!r}, MISSING)", p)
        if (condition is not None and versions.version is not None
            and type(self.globals_by_id[fn.globals_id]) is dict):
          # (a dict's subclass has no tag to read)
          unchanged.append(condition)
          continue
      self.check(f"{get}({name!r}, MISSING)", p)
    if unchanged:   # (only a dict compared by identity has any)
      g = self.globals_by_id[fn.globals_id]
      self.unchanged.setdefault(id(g), (g, []))[1].extend(unchanged)
    self._chains(f, fn)

  def _changed_if(self, expr: str, part) -> str | None:
    """For a part whose check holds again whenever ``expr`` is the same
    object as when it held (an object by identity, a library attribute, an
    immutable atom), the condition that it does not; else None."""
    if isinstance(part, Tag) and part is not MISSING:
      return None   # a lifted array (appended to the leaves), ...
    if type(part) is tuple and not (
        part[0] is LIBATTR or part[0] is float
        or part[0] in _IMMUTABLE_ATOMS and len(part) == 2):
      return None   # a walked value, or one that may change in place
    return self._value_condition(f"(w := {expr})", "w", part)

  def tagged_checks(self) -> None:
    """The checks of globals put aside by :meth:`function`, one group per
    dict (whatever the functions that read it), after the others: they
    append no leaf and guard no other check, so their place is free."""
    for g, conditions in self.unchanged.values():
      self._unchanged(g, conditions)
    self.unchanged = {}

  def _unchanged(self, g, conditions: list[str]) -> None:
    """The checks ``conditions`` of globals read from dict ``g``, made only
    when ``g``'s version tag is not one at which they all held (the last
    such, kept in a cell of this matcher's own)."""
    if len(conditions) == 1:   # one lookup costs what the tag's read does
      self.miss_if(conditions[0])
      return
    seen = self.bind([None])   # the version at which they last held
    tag = f"v{len(self.lines)}"
    self.lines.append(f"    {tag} = version({self.bind(g)})")
    self.miss_if(f"{tag} != {seen}[0] and ({' or '.join(conditions)})")
    self.lines.append(f"    {seen}[0] = {tag}")

  def _function_itself(self, f: str, fn) -> str:
    """Checks that ``f`` is a function of the part's code, globals dict and
    number of defaults, with no attributes of its own and no keyword-only
    defaults; returns the expression that reads one of its globals.

    The globals dict is compared by id: the part holds only its id, and a
    match is used only while its entry, which anchors that dict, is alive.
    """
    add = self.lines.append
    g = self.globals_by_id.get(fn.globals_id)
    same_globals = (f"{f}.__globals__ is not {self.bind(g)}" if g is not None
                    else f"id({f}.__globals__) != {fn.globals_id}")
    # no defaults: tested with the rest (the top function's usual case)
    no_defaults = (f" or {f}.__defaults__ is not None"
                   if fn.defaults is None else "")
    # A function with attributes of its own has no key (the walk refuses
    # it). Only code that reaches a function as a value can read them: the
    # top function only through a reference to itself (reading ``__dict__``
    # makes a dict, about 0.3 us on the hit path, so it is skipped there
    # otherwise).
    # (A library's ``functools.wraps`` leaves ``__wrapped__`` alone: told
    # without the call.)
    attributes = (f" or ({f}_a := {f}.__dict__) and (len({f}_a) != 1 or "
                  f"'__wrapped__' not in {f}_a) and own_attributes({f})"
                  if fn.index != 0 or self.self_referenced else "")
    # its name, which JAX's trace reads: the code's own (an interned
    # identifier: compared by identity; another object equal to it misses
    # and is keyed by the walk), or the one the walk keyed, an exact str
    attributes += (f" or {f}.__name__ is not {self.bind(fn.code.co_name)}"
                   if fn.name is None else
                   f" or type({f}_n := {f}.__name__) is not str or {f}_n != "
                   f"{self.bind(fn.name)}")
    if fn.index == 0 and f == "f":
      # The top function: callers look the matcher up by the code of a
      # plain function (``_quick[fun.__code__]``), so type and code hold.
      # (A partial's function is checked in full below: the partial was
      # looked up by its function's code when jitted, and
      # ``partial.__setstate__`` can give it another function since.)
      self.miss_if(f"{same_globals} or {f}.__kwdefaults__ is not None"
                   f"{no_defaults}{attributes}")
    else:
      self.miss_if(f"type({f}) is not FunctionType or {f}.__code__ is not "
                   f"{self.bind(fn.code)} or {same_globals} "
                   f"or {f}.__kwdefaults__ is not None{no_defaults}"
                   f"{attributes}")
      # analyse keys a function of jax, numpy or the standard library by
      # identity instead. Whether one is depends on its ``__module__`` (and,
      # for this package's, its qualified name): one still of its globals'
      # ``__name__``, where no function of that module is stable, is not,
      # and is told so without the call.
      module = g.get("__name__") if g is not None else None
      if type(module) is str and not may_be_stable(module):
        self.miss_if(f"{f}.__closure__ is None and {f}.__module__ is not "
                     f"{self.bind(module)} and is_stable({f})")
      else:
        self.miss_if(f"{f}.__closure__ is None and is_stable({f})")
    if fn.defaults is not None:
      add(f"    {f}_d = {f}.__defaults__")
      self.miss_if(f"{f}_d is None or len({f}_d) != {len(fn.defaults)}")
    # Once the dict is known to be ``g``, its globals are read through
    # ``g.get`` bound once (one attribute read fewer per global).
    return self.bind(g.get) if g is not None else f"{f}.__globals__.get"

  def _library_read(self, f: str, fn, chain) -> str:
    """The expression reading a library chain (``library_value``): for a
    module in a global or a cell, which the checks above compared by
    identity, its attributes read straight off the bound module (an absent
    one raises: no match), with no call on the hit path."""
    kind, name, attributes = chain
    # the module itself where the base's part is one, which the checks of
    # the globals and cells compared by identity
    base = _base_part(fn, kind, name)
    if type(base) is _ModuleType:
      followed = _modules_along(base, attributes)
      if followed:
        return self.bind(base) + "".join(f".{a}" for a in followed)
    return f"library_value({f}, *{self.bind(chain)})"

  def _chains(self, f: str, fn) -> None:
    """Checks of the values the function's attribute chains reach."""
    for chain, p in zip(code_plan(fn.code).chains, fn.chains):
      kind, name, _ = chain
      if p is NOCHAIN:
        # The base is checked above: by identity when it is a module or a
        # class (then whether it is one of the user's is settled), or by its
        # own key otherwise (then it is not a namespace either). A cell the
        # code does not close over (its own local cell) is never a base:
        # the code, checked by identity, fixes its free variables.
        if kind == "cell" and name not in fn.code.co_freevars:
          continue
        base = _base_part(fn, kind, name)
        if base is not None and not isinstance(base, Tag) and (
            isinstance(base, (_ModuleType, type)) or type(base) is tuple):
          continue
      if type(p) is tuple and p[0] is LIBATTR:   # the library's own object
        self.miss_if(f"{self._library_read(f, fn, chain)} is not "
                     f"{self.bind(LibAttrPart._make(p).obj)}")
        continue
      self.check(f"chain_read({f}, *{self.bind(chain)})", p)


def _base_part(fn, kind: str, name: str):
  """The part a function's key holds for an attribute chain's base: its
  global's or its cell's; None for a cell the code does not close over."""
  if kind == "global":
    return fn.globals[code_plan(fn.code).global_names.index(name)]
  freevars = fn.code.co_freevars
  return fn.cells[freevars.index(name)] if name in freevars else None


_UNREAD = object()
# Up to this many lifted leaves are told apart pairwise (``a is b or ...``)
_PAIRWISE = 3
# atoms whose object, while a dict holds it, keeps its type and value
_IMMUTABLE_ATOMS = frozenset({str, bytes, int, bool, complex, type(None)})
_READ_ATOMS = ATOMS | {float}   # (float parts are ``float_key``'s)


def _same_read(a, b) -> bool:
  """Whether a global's part ``b`` is one a check above already compared
  the same global of the same dict with (``a``): the same identity part
  (a module, a closure-free library function, ``MISSING``), the same
  library object (``LIBATTR``), or an equal atom or float key of one
  type (``float_key`` parts differ for ``0.0`` and ``-0.0``). A function
  walked again is a ``CYCLE`` part, checked as such."""
  if a is b:
    return a is not _UNREAD and not isinstance(a, Tag) or a is MISSING
  if type(a) is not tuple or type(b) is not tuple or len(a) != 2 or (
      len(b) != 2 or a[0] is not b[0]):
    return False
  if a[0] is LIBATTR:
    return a[1] is b[1]
  return a[0] in _READ_ATOMS and a[1] == b[1]


def _modules_along(module, attributes: tuple) -> tuple:
  """The prefix of ``attributes`` that ``code_plan.library_value`` follows
  from ``module`` (through modules only), as they are now."""
  followed, obj = [], module
  for attribute in attributes:
    if type(obj) is not _ModuleType:
      break
    followed.append(attribute)
    obj = getattr(obj, attribute, None)
  return tuple(followed)


def own_attributes(f) -> bool:
  """Whether function ``f`` (not the library's) has attributes of its own
  (all but ``__wrapped__``): the walk gives such a function no key."""
  return bool(f.__dict__.keys() - {"__wrapped__"}) and not is_stable(f)


# Nodes of up to this many leaves are read item by item in straight-line
# code, which costs about half the gather-and-loop form's per small dict.
_STRAIGHT_LINE = 8
_ALL_LIFTED = object()   # a loop over leaves ended without a mismatch


def quick_matcher(fun, key) -> "Callable[[Any], list | None] | None":
  """The hot path's inline cache for one key of a top-level function.

  Returns ``match`` such that, for a plain function ``f`` with ``key``'s
  code object (the callers' lookup guarantees both), ``match(f)`` is
  ``f``'s lifted leaves exactly when ``analyse(f).key == key``, and None
  otherwise; or returns None itself
  when some part of ``key`` is not simple (:func:`match_plan.simple_part`).
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
  ``return None`` statement of its own level: ``_MatchSource.block``'s
  default ``miss``), with the objects they name
  (bound as ``prefix`` and a number); or None when some part of ``key`` is
  not simple."""
  if type(fun) is functools.partial and type(key) is tuple and (
      key[0] is PARTIAL):   # a partial of a function: checked as a part
    top, fn = fun.func, PartialPart._make(key).func
  else:
    top, fn = fun, key
  if fn is top is not fun and type(top) is _FunctionType:
    # a partial of a function keyed by identity (a library's)
    if not match_plan.simple_part(key):
      return None
  elif (type(top) is not _FunctionType or type(fn) is not tuple
        or fn[0] is not FN or not match_plan.simple_part(key)
        or top.__code__ is not FnPart._make(fn).code
        or id(top.__globals__) != FnPart._make(fn).globals_id):
    return None
  src = _MatchSource(prefix)
  src.self_referenced = match_plan.refers_to_top(key)
  src.globals_by_id = match_plan.globals_reached(fun)
  if fn is key:
    src.function("f", key)
  else:
    src.check("f", key)
  src.tagged_checks()
  # Walked functions are distinct objects (a second occurrence is a
  # ``CYCLE`` part). Each one's code is checked by identity (the top
  # function's by the callers' lookup), so only those of one code can be
  # one object.
  by_code: dict[int, list[str]] = {}
  for f, code in src.functions:
    by_code.setdefault(id(code), []).append(f)
  for same in by_code.values():
    if len(same) > 1:
      ids = ", ".join(f"id({f})" for f in same)
      src.miss_if(f"len({{{ids}}}) != {len(same)}")
  src.name = top.__code__.co_name
  src.globals_by_id = {}   # what is compared is bound in env; hold no more
  return src
