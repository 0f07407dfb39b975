"""Which stored keys get a generated matcher, and what the matcher binds.

A key is *simple* when a value can be checked against each of its parts
without building a key (``simple_part``); a simple key's matcher compares
the globals dicts of the functions it reaches by identity
(``globals_reached``), reads plain dict/list/tuple trees in place
(``plain_tree``), and checks the top function's own attributes only when
the key refers back to it (``refers_to_top``). ``key/matchers.py``
generates the checks.

Invariants: these are pure functions of a key (and, for
``globals_reached``, of the function it was analysed from); they hold
nothing.
"""

from __future__ import annotations

import collections
import functools
import types

from jax_closure_cache.key import closure_key
from jax_closure_cache.key.code_plan import code_plan
from jax_closure_cache.key.parts import (
    ALIAS, ATOMS, BUILTIN_NODES, CYCLE, FN, LIBATTR, LIFTED, MISSING, NOCHAIN,
    PARTIAL, TREE, TREEAUX, Atom, CyclePart, FnPart, NodePart, PartialPart,
    Tag, TreeAuxPart, TreePart)

_FunctionType = types.FunctionType
REACH_NODES = 4096   # past it, a globals dict is compared by id
# Whether a cell holds a value: layer two's test, shared.
_filled = closure_key.cell_filled


def simple_part(part) -> bool:
  """A key part that a value can be checked against without building a key:
  a lifted array (or one met again), an atom or float, a missing global, an identity object, a
  pytree of those, a ``functools.partial`` of those, or a nested function (no
  keyword defaults, no back-reference) whose cells, defaults and read globals
  are all simple."""
  if part is LIFTED or part is MISSING or part is NOCHAIN:
    return True
  if type(part) is tuple:
    if len(part) == 2 and (part[0] is CYCLE or part[0] is LIBATTR
                           or part[0] is ALIAS):
      return True
    if len(part) == len(TreePart._fields) and part[0] is TREE:
      return all(map(simple_part, TreePart._make(part).leaves))
    if len(part) == len(TreeAuxPart._fields) and part[0] is TREEAUX:
      t = TreeAuxPart._make(part)
      return simple_nodes(t.nodes) and all(map(simple_part, t.leaves))
    if len(part) == len(PartialPart._fields) and part[0] is PARTIAL:
      p = PartialPart._make(part)
      return all(map(simple_part,
                     (p.func, *p.args, *(kp for _, kp in p.keywords))))
    if len(part) == len(FnPart._fields) and part[0] is FN:
      fn = FnPart._make(part)
      return (fn.kwdefaults is None
              and len(fn.globals) == len(code_plan(fn.code).global_names)
              and all(map(simple_part,
                          (*fn.cells, *(fn.defaults or ()), *fn.globals,
                           *fn.chains))))
    # an atom, a float, or a value-hashed object (a frozen dataclass, an
    # enum, a launcher's static parameters): checked by type and equality
    # (a value keyed by a representation, such as a NumPy scalar's bytes,
    # is not: the object itself would never equal its part)
    if len(part) != len(Atom._fields):
      return False
    t, value = Atom._make(part)
    return t in ATOMS or t is float or (
        isinstance(t, type) and type(value) is t)
  return not isinstance(part, Tag)


def simple_nodes(node) -> bool:
  """Whether a ``TREEAUX`` part's nodes (``NodePart``s; None: a leaf) can be
  checked without building a key: dict, list, tuple, None and OrderedDict
  nodes, and custom nodes whose class is kept by identity (one of a stable
  module's, ``Analysis.klass``) and whose node data's part is simple."""
  if node is None:
    return True
  if type(node) is not tuple or len(node) != len(NodePart._fields):
    return False
  n = NodePart._make(node)
  if n.type in BUILTIN_NODES or n.type is collections.OrderedDict:
    ok = n.klass is None
  else:   # (a defaultdict's factory is walked with it: not simple)
    ok = (n.klass is n.type and n.type is not collections.defaultdict
          and simple_part(n.aux))
  return ok and all(map(simple_nodes, n.children))


def refers_to_top(part) -> bool:
  """Whether a key holds a reference back to its top function."""
  if type(part) is not tuple:
    return False
  if len(part) == 2 and part[0] is CYCLE:
    return CyclePart._make(part).index == 0
  return any(map(refers_to_top, part))


def plain_tree(treedef, budget: int = 4096) -> bool:
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


def plain_keys(layout) -> bool:
  """Whether every dict of a ``TREE`` part's layout has only ``str`` and
  ``int`` keys (whose ``==`` is exact within one type), so a matcher can
  check them as a tuple and its types."""
  # a[0]: a key atom's type, Atom.type (``trees.key_atom``'s triple for a
  # complex key has it there too, where Atom._make would raise)
  return all(a[0] is str or a[0] is int for keys in layout for a in keys)


def globals_reached(fun) -> dict:
  """id -> globals dict of every function a walk of ``fun`` can reach."""
  found = {}
  pending = [fun]
  seen = set()
  while pending and len(seen) < REACH_NODES:   # unfound: compared by id
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
