"""Closure keys: a function's code and the values it reads (cells, defaults,
globals, through the functions it reaches), arrays abstracted to leaves;
``closure_cache.py`` shares one trace among the functions of a key.

Invariants: functions with equal keys trace alike but for their leaves (a
:class:`Walk` keys each value a trace may read, by value or by the identity
of an anchor, or raises :class:`Unkeyable`); :class:`Rebuild` fills the
leaves in the walk's order, never modifying the user's objects.
"""

from __future__ import annotations

from collections.abc import Callable
import dis
import functools
import hashlib
import types
from typing import Any, NamedTuple
import weakref

import numpy as np

from jax import tree_util

from jax_closure_cache import _compat
from jax_closure_cache import atoms

BUDGET = 4096      # values walked per key
#: Top-level packages whose functions the walk takes as stable (keyed by
#: identity, their globals not walked): the one list, which the package's
#: code plans extend (``code_plan.STABLE_PACKAGES``).
STABLE_PACKAGES = frozenset({"jax", "jaxlib", "numpy", "scipy", "builtins",
                             "functools", "operator", "math", "itertools"})
_DRAWING = ("numpy.random", "scipy.stats")   # a new value on every call
DYNAMIC_READS = frozenset({"globals", "eval", "exec", "__import__"})


class Marker:
  """A compound part's head: compared by identity; a key holds ids."""
  __slots__ = ("name",)

  def __init__(self, name: str):
    self.name = name

  def __repr__(self):
    return self.name

  def __reduce__(self):
    raise TypeError("closure-key markers are not picklable")


LIFTED = Marker("LIFTED")     # an array passed to the shared trace
ALIAS = Marker("ALIAS")       # AliasPart: the array lifted as leaf i, again
MISSING = Marker("MISSING")   # a global name the globals lack
EMPTY = Marker("EMPTY")       # an unfilled cell
FN = Marker("FN")             # FnPart: a function walked by its code
TREE = Marker("TREE")         # TreePart: a pytree of builtin nodes
PARTIAL = Marker("PARTIAL")   # PartialPart: a functools.partial
WEAKREF = Marker("WEAKREF")   # WeakrefPart: read through it
CYCLE = Marker("CYCLE")       # CyclePart: a function reached before
ID = Marker("ID")             # IdPart: an anchor, by identity
NUMPY = Marker("NUMPY")       # NumpyPart: a NumPy array, by its bytes
WRAPPER = Marker("WRAPPER")   # WrapperPart: a registered wrapper
ATOMS = atoms.ATOMS


# The layouts of the parts above. A key holds plain tuples (cheaper to
# build; a view compares and hashes as its tuple does, but is not ``type(x)
# is tuple``): a reader names a part's fields through its view,
# ``FnPart._make(part).code``. Every compound part's head, ``[0]``, is its
# marker (an atom's, its type), what readers test to pick the view.

class AliasPart(NamedTuple):
  """``(ALIAS, index)``: the array lifted as leaf ``index`` met again
  (``Walk.lift``)."""
  tag: Marker           # ALIAS
  index: int            # its place in the walk's leaves


class CyclePart(NamedTuple):
  """``(CYCLE, index)``: a function (or, in the package's walk, an object
  or class) reached before (``Walk.enter``)."""
  tag: Marker           # CYCLE
  index: int            # the walk's ordinal of the part it refers back to


class WeakrefPart(NamedTuple):
  """``(WEAKREF, referent)``: a weak reference, read through."""
  tag: Marker           # WEAKREF
  referent: Any         # the part of its referent, or None if it is dead


class IdPart(NamedTuple):
  """``(ID, id, label)``: an object kept by identity, one of the anchors."""
  tag: Marker           # ID
  id: int               # id(obj)
  label: str            # its __qualname__ or type name, for explanations


class Atom(NamedTuple):
  """``(type, value)``: a value keyed by its exact type and its value, or
  what stands for it: an int, str, ... of ``ATOMS`` as it is; a float by
  ``float_key`` (its ``hex()`` for 0.0 and -0.0, a NaN's bits); a NumPy scalar by
  its bytes (the package's walk adds sets, complex numbers, statics and
  hashable library values, ``closure.Analysis.other``)."""
  type: type
  value: Any


class FnPart(NamedTuple):
  """``(FN, index, code, globals_id, cells, defaults, kwdefaults, globals,
  chains, name)``: a function walked by its code (``Walk.function``)."""
  tag: Marker           # FN
  index: int            # the walk's ordinal (what a CYCLE refers to)
  code: types.CodeType
  globals_id: int       # id of its globals dict (an anchor of the entry)
  cells: tuple          # the parts of its closure cells, in co_freevars order
  defaults: tuple | None
  kwdefaults: tuple | None   # ((name, part), ...)
  globals: tuple        # the parts of the globals its code reads
  chains: tuple         # the parts of the attribute chains it reads
  name: str | None      # its ``__name__``, None where it is its code's


class TreePart(NamedTuple):
  """``(TREE, treedef, leaves, layout)``: a pytree of builtin nodes walked
  through its flatten; this module's walk leaves ``layout`` out (read such
  a part with :func:`tree_part`)."""
  tag: Marker           # TREE
  treedef: Any
  leaves: tuple         # the parts of its leaves, in flatten order
  layout: Any           # each dict's keys in insertion order (key/trees.py)


def tree_part(part: tuple) -> TreePart:
  """The view of a ``TREE`` part: the package's walk adds the layout, this
  module's own walk (its rules used alone) does not (None then)."""
  return TreePart._make(part if len(part) == 4 else (*part, None))


class PartialPart(NamedTuple):
  """``(PARTIAL, func, args, keywords)``: a ``functools.partial``."""
  tag: Marker           # PARTIAL
  func: Any             # the part of the function it wraps
  args: tuple           # the parts of its positional arguments
  keywords: tuple       # ((name, part), ...)


class NumpyPart(NamedTuple):
  """``(NUMPY, dtype, shape, digest, layout)``: a NumPy array baked by its
  bytes."""
  tag: Marker           # NUMPY
  dtype: Any
  shape: tuple
  digest: bytes         # blake2b of its bytes, 16 bytes
  layout: tuple         # (atoms.dtype_key, strides, writeable)


class WrapperPart(NamedTuple):
  """``(WRAPPER, type, static, inner)``: an instance of a registered
  wrapper class (``register_wrapper``)."""
  tag: Marker           # WRAPPER
  type: type
  static: Any           # its static part, keyed by value
  inner: Any            # the part of what it wraps


class Unkeyable(Exception):
  """A value a key cannot cover (``reason``: a category; ``detail``: why)."""

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason, self.detail = reason, detail


float_key = atoms.float_key   # 0.0 is not -0.0, and a NaN is its bits


class WrapperRule(NamedTuple):
  """How a registered wrapper class is keyed (:func:`register_wrapper`)."""
  split: Callable   # w -> (static, inner)
  join: Callable    # (static, inner) -> a wrapper around new values
  label: str        # what explanations call its static part


WRAPPERS: dict[type, WrapperRule] = {}   # class -> its rule


def register_wrapper(cls: type, split, join, label: str | None = None) -> None:
  """Key a ``cls`` by ``split(w) == (static, inner)``: ``static`` hashable,
  ``inner`` walked; ``join(static, inner)`` rebuilds it around new values.
  ``label`` (the class's name by default) names it in explanations."""
  WRAPPERS[cls] = WrapperRule(split, join, label or cls.__name__)


@functools.partial(_compat.weakref_lru_cache, maxsize=2048)
def code_names(code: types.CodeType) -> tuple[tuple[str, ...], bool]:
  """The global names ``code`` (and code it nests) may read; if it sets one."""
  names, writes, pending = [], False, [code]
  while pending:
    c = pending.pop()
    names.extend(c.co_names)
    writes |= any(i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
                  for i in dis.get_instructions(c))
    pending.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
  return tuple(dict.fromkeys(names)), writes


def cell_filled(cell) -> bool:
  try:
    cell.cell_contents
  except ValueError:
    return False
  return True


def _is_stable(f, module=None) -> bool:   # library code: keyed by identity
  module = module or getattr(f, "__module__", None)
  return (isinstance(module, str) and module.partition(".")[0] in STABLE_PACKAGES
          and not module.startswith(_DRAWING))


def _static_unkeyable(v):
  raise Unkeyable("static_argument",
                  f"a {type(v).__name__} as a static argument")


class Walk:
  """:meth:`value` is a value's part of the key, its arrays put in
  ``leaves`` and the objects whose ids it holds in ``anchors``; a library
  keying more overrides steps in a subclass (:func:`use_rules`)."""
  __slots__ = ("leaves", "anchors", "memo", "budget", "lifted")

  def __init__(self):
    self.leaves, self.anchors, self.memo = [], [], {}  # memo: id -> index
    self.budget = BUDGET
    self.lifted = {}   # id of a lifted array -> its index in leaves

  def value(self, v) -> Any:
    t = type(v)
    if t is _compat.ArrayImpl:
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
    if _compat.is_committed(v):
      # stock bakes it: as an argument it would commit the result to its
      # placement (a device, a sharding), and stock refuses one spanning
      # other processes' devices
      return self.identity(v)
    return self.lift(v)

  def lift(self, v):
    """``v`` as a leaf: LIFTED where first met, ``(ALIAS, i)`` where met
    again, so the trace sees one tracer where stock's sees one object (its
    constants deduplicated by identity, an ``is`` test) and a function
    holding two distinct arrays there has another key."""
    i = self.lifted.get(id(v))
    if i is not None:
      return (ALIAS, i)
    self.lifted[id(v)] = len(self.leaves)
    self.leaves.append(v)
    return LIFTED

  def scalar(self, v, t):
    return (t, v) if t is int else float_key(v)

  stable = staticmethod(_is_stable)

  @staticmethod
  def static_key(v) -> Any:
    """A static argument's part of a trace's key, by exact type and bits
    (``atoms.exact_key``: ``0.0`` is not ``-0.0``, ``1`` not ``1.0`` nor
    ``True``); anything else is Unkeyable: JAX's own cache of one function
    compares static arguments by ``==``, which cannot say that another
    function object's trace would be the same."""
    try:
      return atoms.exact_key(v, _static_unkeyable)
    except atoms.Inexact as e:
      raise Unkeyable("static_argument", str(e)) from None

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
    if isinstance(v, _compat.Tracer):
      raise Unkeyable("tracer", f"a {t.__name__} tracer is closed over")
    if isinstance(v, np.ndarray):
      return self.numpy(v)
    if isinstance(v, np.generic):
      return self.numpy_scalar(v)
    rule = WRAPPERS.get(t)
    if rule is not None:
      return self.wrapper(v, t, rule)
    if isinstance(v, type) and self.stable(v):
      return self.identity(v)   # a user class's attributes may change
    if isinstance(v, type):
      raise Unkeyable("class", f"reads the user class {v.__qualname__}")
    raise Unkeyable("unhashable", f"closes over a {t.__name__}")

  def partial(self, v):
    if v.__dict__:   # ``update_wrapper``'s name: JAX names its trace by it
      raise Unkeyable("attributes", "a functools.partial with attributes "
                      f"({', '.join(map(str, v.__dict__))[:60]})")
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
    try:
      dtype = atoms.dtype_key(v.dtype)
    except atoms.Inexact as e:
      raise Unkeyable("unhashable", str(e)) from None
    digest = hashlib.blake2b(np.ascontiguousarray(v).tobytes(),
                             digest_size=16).digest()
    # (a trace may read its memory order or flags: ``ravel(order="K")``)
    return (NUMPY, v.dtype, v.shape, digest,
            (dtype, v.strides, v.flags.writeable))

  @staticmethod
  def numpy_scalar(v):
    try:
      return atoms.numpy_scalar_key(v)
    except atoms.Inexact as e:
      raise Unkeyable("unhashable", str(e)) from None

  def wrapper(self, v, t, rule):
    static, inner = rule.split(v)
    return (WRAPPER, t, static, self.value(inner))

  def tree(self, v):
    self.spend(len(v))   # a table too large to key, before flattening it
    try:
      leaves, treedef = tree_util.tree_flatten(v)
    except Exception as e:   # dict keys that do not sort
      raise Unkeyable("unhashable", f"flattening raised {e!r}") from e
    return self.tree_parts(leaves, treedef)

  def tree_parts(self, leaves, treedef):
    self.spend(len(leaves))
    return (TREE, treedef, tuple([self.value(x) for x in leaves]))

  def identity(self, v):
    self.anchors.append(v)
    # the label only makes explanations readable (``float32``, not an id)
    return (ID, id(v), getattr(v, "__qualname__", None) or type(v).__name__)

  def finish(self, key) -> None:
    """Checks of the whole ``key`` once walked (raise :class:`Unkeyable`);
    none here."""

  def enter(self, v):   # v's index, or (CYCLE, index) if reached before
    i = self.memo.get(id(v))
    if i is not None:
      return (CYCLE, i)
    self.spend(1)
    i = self.memo[id(v)] = len(self.memo)
    return i

  def spend(self, n: int) -> None:
    """Count ``n`` values against the key's budget: an object or function
    entered, a container's leaves (each a part of the key, compared on
    every hit)."""
    self.budget -= n
    if self.budget < 0:
      raise Unkeyable("budget", f"more than {BUDGET} values")

  def function(self, f: types.FunctionType):
    index = self.enter(f)
    if type(index) is tuple:
      return index
    if f.__dict__.keys() - {"__wrapped__"} and not self.stable(f):
      raise Unkeyable("attributes", f"{f.__qualname__} has attributes")
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
            chains, self.name(f))

  @staticmethod
  def name(f) -> str | None:
    """``f.__name__`` where it is not its code's (set by hand,
    ``functools.wraps``): JAX names a trace, its lowering and a caller's
    equation by it. None for the code's own."""
    name = f.__name__
    if name is f.__code__.co_name:
      return None
    if type(name) is not str:
      raise Unkeyable("attributes", f"{f.__qualname__} is named by a "
                      f"{type(name).__name__}")
    return None if name == f.__code__.co_name else name

  def cells(self, f) -> tuple:
    return tuple([self.cell(c) for c in f.__closure__ or ()])

  def cell(self, c):
    return self.value(c.cell_contents) if cell_filled(c) else EMPTY

  def reads(self, f) -> tuple[tuple, tuple]:
    """The parts of the globals ``f`` reads, and of its attribute chains
    (none: JAX keys a module or class only if stable, and by identity)."""
    if code_names(f.__code__)[1]:
      raise Unkeyable("writes_globals", f"{f.__qualname__} assigns to a global")
    g, names = f.__globals__, self.global_names(f.__code__)
    if DYNAMIC_READS.intersection(names):   # globals()[n], eval(...)
      raise Unkeyable("dynamic_read", f"{f.__qualname__} reads names it makes")
    for m in [g[n] for n in names if type(g.get(n)) is types.ModuleType]:
      if any(type(s := m.__dict__.get(n)) is types.ModuleType
             and not _is_stable(None, s.__name__) for n in names):
        raise Unkeyable("module", f"{f.__qualname__} reads {s.__name__}")
    return tuple([self.value(g[n]) if n in g else MISSING for n in names]), ()

  global_names = staticmethod(lambda code: code_names(code)[0])

  @classmethod
  def difference(cls, a, b, path="") -> str:
    """Where keys ``a`` and ``b`` first differ, named by cells and globals."""
    if (type(a) is tuple and type(b) is tuple and len(a) == len(b)
        and not (len(a) == 2 and isinstance(a[0], type))):   # not an Atom
      fields, names = (), {}
      if a and a[0] is FN and b[0] is FN:
        code, fields = FnPart._make(a).code, FnPart._fields
        names = {"cells": [f"cell {n!r}" for n in code.co_freevars],
                 "globals": [f"global {n!r}" for n in cls.global_names(code)]}
      for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
          continue
        named = names.get(fields[i]) if fields else None   # FnPart's field
        if fields and fields[i] == "name":
          return (f"{path}its __name__: {x or code.co_name!r} -> "
                  f"{y or code.co_name!r}")
        if named is not None:
          j = next(j for j, (p, q) in enumerate(zip(x, y)) if p != q)
          return cls.difference(x[j], y[j], f"{path}{named[j]} ")
        return cls.difference(x, y, path)
    return f"{path.strip() or 'the function'}: {_show(a)} -> {_show(b)}"


def _show(k) -> str:
  if type(k) is tuple and len(k) == 2 and k[0] is ALIAS:
    return f"the array of lifted place {AliasPart._make(k).index} again"
  if type(k) is tuple and len(k) == 2 and isinstance(k[0], type):
    t, value = Atom._make(k)
    if type(value) is str and t is float:
      value = float.fromhex(value)
    return f"{t.__name__} {value!r}"
  # a compound part by its marker
  return "an array" if k is LIFTED else str(k[0] if type(k) is tuple else k)


class Rebuild:
  """:meth:`value` is ``v`` with the leaves of its part ``k`` replaced in new
  functions, partials and containers; a walk adding parts pairs with a
  subclass adding ``STEPS``."""
  # parts that are leaves, parts that never hold one, and parts with a walk
  # index at [1], their view's ``index`` (what a CYCLE refers to)
  LEAF_PARTS = frozenset({ALIAS})
  KEPT_PARTS = frozenset()
  INDEXED_PARTS = frozenset({FN})
  STEPS = types.MappingProxyType({
      FN: "function", TREE: "tree", PARTIAL: "partial", WEAKREF: "weakref",
      WRAPPER: "wrapper", ALIAS: "alias"})
  walk = Walk

  def __init__(self, leaves):
    self.leaves = iter(leaves)
    # walk index -> rebuilt function; rebuilt objects only weakrefs reach
    self.memo, self.keep = {}, []
    self.taken = []   # the leaves placed so far, for ALIAS parts
    # the indices of the parts that reach a leaf (through CYCLEs too); None:
    # every CYCLE is taken to reach one
    self.leafy = None

  def has_leaf(self, k) -> bool:
    if type(k) is not tuple or not k:
      return k is LIFTED
    if k[0] is CYCLE:   # k[1]: CyclePart.index (a loop over the key)
      return self.leafy is None or k[1] in self.leafy
    return k[0] in self.LEAF_PARTS or (
        k[0] not in self.KEPT_PARTS and any(map(self.has_leaf, k)))

  def find_leafy(self, key) -> None:
    """Set :attr:`leafy` for ``key``: a function (or object) reached again
    is rebuilt only if what it reaches holds a leaf, so a part whose every
    path leads to values kept as they are (a jitted function over a module
    helper reached before) stays the user's own object."""
    indexed, stack = {}, [key]
    while stack:
      k = stack.pop()
      if type(k) is tuple and k:
        if (k[0] in self.INDEXED_PARTS and len(k) > 1
            and type(k[1]) is int):   # k[1]: FnPart.index (ObjPart's, ...)
          indexed[k[1]] = k
        stack.extend([x for x in k if type(x) is tuple])
    self.leafy = frozenset()
    while True:   # grows until no CYCLE adds a part
      found = frozenset([i for i, k in indexed.items() if self.has_leaf(k)])
      if found == self.leafy:
        return
      self.leafy = found

  def value(self, v, k):
    if k is LIFTED:
      leaf = next(self.leaves)
      self.taken.append(leaf)
      return leaf
    if type(k) is not tuple or not k or type(k[0]) is not Marker:
      return v
    if k[0] is CYCLE:
      return self.memo.get(CyclePart._make(k).index, v)
    if not self.has_leaf(k):
      return v
    return getattr(self, self.STEPS[k[0]])(v, k)

  def alias(self, v, k):
    return self.taken[AliasPart._make(k).index]

  def partial(self, v, k):
    p, value = PartialPart._make(k), self.value
    return functools.partial(
        value(v.func, p.func),
        *[value(a, ka) for a, ka in zip(v.args, p.args)],
        **{n: value(v.keywords[n], kn) for n, kn in p.keywords})

  def tree(self, v, k):
    leaves, treedef = tree_util.tree_flatten(v)
    parts = tree_part(k).leaves
    return tree_util.tree_unflatten(
        treedef, [self.value(x, kx) for x, kx in zip(leaves, parts)])

  def weakref(self, v, k):
    self.keep.append(self.value(v(), WeakrefPart._make(k).referent))
    return weakref.ref(self.keep[-1])

  def wrapper(self, v, k):
    w = WrapperPart._make(k)
    rule = WRAPPERS[w.type]
    static, inner = rule.split(v)
    return rule.join(static, self.value(inner, w.inner))

  def function(self, f, k):
    fn = FnPart._make(k)
    index, code, cells, defaults, kwdefaults, reads = (
        fn.index, fn.code, fn.cells, fn.defaults, fn.kwdefaults, fn.globals)
    has_leaf, value = self.has_leaf, self.value
    closure, g = f.__closure__, f.__globals__
    new_cells = None if closure is None else tuple(
        types.CellType() if has_leaf(k) else c for c, k in zip(closure, cells))
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


active_rules = [Walk, Rebuild]   # the walk and rebuild in use (use_rules)


def use_rules(walk: type[Walk] = Walk, rebuild: type[Rebuild] = Rebuild):
  """Key with ``walk``, rebuild with its pair ``rebuild`` (default: JAX's)."""
  if rebuild.walk is not walk:
    raise ValueError(f"{rebuild.__name__} rebuilds {rebuild.walk.__name__}'s "
                     f"keys, not {walk.__name__}'s")
  active_rules[:] = [walk, rebuild]


def closure_key(fun: Callable) -> tuple[Any, list[Any], list[Any]]:
  """``(key, leaves, anchors)``: equal keys read equal values but for their
  arrays ``leaves``; ``anchors``: the objects whose ids it holds."""
  w = active_rules[0]()
  key = w.function(fun) if type(fun) is types.FunctionType else w.value(fun)
  w.finish(key)
  return key, w.leaves, w.anchors


def rebuild(fun: Callable, key, leaves, rules=None) -> Callable:
  """``fun`` with ``key``'s leaves replaced by ``leaves`` (by ``rules``)."""
  r = (rules or active_rules[1])(leaves)
  r.find_leafy(key)
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
