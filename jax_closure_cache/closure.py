"""Closure analysis: the cache key of a callable, the arrays it lifts, and the
rebuild that puts new values (tracers, at trace time) in their place.

``analyse(fun)`` walks everything a call of ``fun`` reads without going through
its arguments: closure cells, defaults and keyword defaults, the globals its
code (and its nested code) reads by name, a ``functools.partial``'s function,
arguments and keywords, a bound method's function and ``self``. It returns an
:class:`Analysis` whose fields obey these invariants:

* ``key`` is hashable and holds no array and no tracer. Two callables with
  equal keys, called with their own ``leaves`` passed as arguments, trace to
  the same jaxpr.
* ``leaves`` are the lifted arrays, in walk order; ``key`` records where each
  one sits (:data:`LIFTED`) but not its value, shape or dtype (the shared
  jitted function keys those itself, as it keys any argument).
* ``anchors`` are the objects whose ``id`` is part of ``key``. Whoever stores
  ``key`` keeps them alive, so no ``id`` in a stored key can be reused.
* ``roots`` are objects kept by identity whose contents the key does not
  cover (module-level helper functions, opaque objects). An array a trace
  captures must be found under one of them (a guard), or the entry is
  dropped.

A tracer anywhere in the walked values raises :class:`Uncacheable`, as does a
value that is neither hashable nor a pytree.

``rebuild(fun, key, leaves)`` returns a callable that computes what ``fun``
computes, with the lifted positions holding ``leaves``. It is guided by
``key``, so walk and rebuild cannot disagree on order. Unchanged parts are
the caller's own objects (cells included), so a trace that mutates closure
state mutates the user's state, as a stock trace does.

Example::

    >>> import jax.numpy as jnp
    >>> def make(w):
    ...   return lambda x: x @ w
    >>> a, b = analyse(make(jnp.ones(2))), analyse(make(jnp.zeros(2)))
    >>> a.key == b.key, len(a.leaves)
    (True, 1)
"""

from __future__ import annotations

import dis
import functools
import hashlib
import sys
import threading
import types
import weakref
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from jax_closure_cache import _compat

#: Plain objects are keyed by their attributes down to this many nested
#: plain objects, and over at most this many attribute values in all; past
#: either budget an object is kept by identity.
OBJECT_DEPTH_BUDGET = 3
OBJECT_VALUES_BUDGET = 256


class Uncacheable(Exception):
  """A callable that the cache must leave to stock ``jax.jit``.

  ``reason`` is a short category (a key of ``stats()['fallback_reasons']``);
  ``detail`` says which value and why.
  """

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason = reason
    self.detail = detail


class _Tag:
  """A marker in a key; compares by identity and reads well in a repr."""
  __slots__ = ("name",)

  def __init__(self, name):
    self.name = name

  def __repr__(self):
    return self.name

  def __reduce__(self):
    raise TypeError("closure-cache key markers are not picklable")


LIFTED = _Tag("LIFTED")      # an array passed to the shared executable
_MISSING = _Tag("MISSING")   # a global name that is not (yet) defined
_EMPTY = _Tag("EMPTY")       # a cell that is not yet filled
_FN = _Tag("FN")             # (_FN, index, code, id(globals), cells, defaults, kwdefaults, globals, chains)
_TREE = _Tag("TREE")         # (_TREE, treedef, leaves)
_PARTIAL = _Tag("PARTIAL")   # (_PARTIAL, func, args, keywords)
_METHOD = _Tag("METHOD")     # (_METHOD, func, self)
_WRAPPER = _Tag("WRAPPER")   # (_WRAPPER, type, static, inner)
_OBJ = _Tag("OBJ")           # (_OBJ, index, type, ((name, value), ...)); arrays by identity
_COPY = _Tag("COPY")         # (_COPY, index, type, ((name, value), ...)); arrays lifted
_NUMPY = _Tag("NUMPY")       # (_NUMPY, dtype, shape, digest)
_CYCLE = _Tag("CYCLE")       # (_CYCLE, index of an enclosing function or object)
_ID = _Tag("ID")             # (_ID, id(obj), label); obj is an anchor
_NOCHAIN = _Tag("NOCHAIN")   # an attribute chain whose base is no module or class
_DYN = _Tag("DYN")           # (_DYN, int or float): a Python scalar passed as an argument
_SCALAR = _Tag("SCALAR")     # a scalar's value, masked (see scalars_that_differ)


# -- per-code-object facts ---------------------------------------------------

class CodePlan(NamedTuple):
  """What a code object (with its nested code objects) reads and writes.

  ``chains`` are the attribute chains its code reads from a global or a
  free variable, as ``(kind, name, attributes)`` with kind ``"global"`` or
  ``"cell"``: ``Table.W`` is ``("global", "Table", ("W",))``.
  """
  global_names: tuple[str, ...]
  writes_globals: bool
  chains: tuple = ()


_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_ATTR_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
# A plain dict: a weak one costs a weakref per lookup on the hot path. It is
# emptied when it grows past _PLANS_MAX (code made by exec in a loop).
_plans: dict[types.CodeType, CodePlan] = {}
_PLANS_MAX = 1 << 16


def code_plan(code: types.CodeType) -> CodePlan:
  """The globals ``code`` and its nested code objects read, once per code."""
  try:
    return _plans[code]
  except KeyError:
    pass
  names: dict[str, None] = {}
  chains: dict[tuple, None] = {}
  writes = False
  pending = [code]
  while pending:
    co = pending.pop()
    chain = None   # (kind, name, [attributes]) being read right now
    for ins in dis.get_instructions(co):
      op = ins.opname
      if op in _GLOBAL_READS or op == "LOAD_DEREF":
        if chain is not None and chain[2]:
          chains[(chain[0], chain[1], tuple(chain[2]))] = None
        kind = "cell" if op == "LOAD_DEREF" else "global"
        chain = (kind, ins.argval, [])
        if kind == "global":
          names[ins.argval] = None
        continue
      if op in _ATTR_READS and chain is not None:
        chain[2].append(ins.argval)
        continue
      if chain is not None and chain[2]:
        chains[(chain[0], chain[1], tuple(chain[2]))] = None
      chain = None
      if op in _GLOBAL_WRITES:
        writes = True
    if chain is not None and chain[2]:
      chains[(chain[0], chain[1], tuple(chain[2]))] = None
    pending.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
  plan = CodePlan(tuple(names), writes, tuple(chains))
  if len(_plans) >= _PLANS_MAX:
    _plans.clear()
  _plans[code] = plan
  return plan


def is_module_level(fun: types.FunctionType) -> bool:
  """A function defined at module scope: no closure, not nested anywhere."""
  return fun.__closure__ is None and "<locals>" not in fun.__qualname__


#: Top-level packages whose functions are taken as stable: their globals are
#: not walked (a user does not reassign ``jax.numpy``'s module globals), and
#: they are keyed by identity. Everything else a traced function reaches,
#: module-level helpers included, is walked to the function budget.
STABLE_PACKAGES = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes",
                             "opt_einsum", "scipy"}) | frozenset(
                                 getattr(sys, "stdlib_module_names", ()))
#: At most this many functions are walked for one key (helpers reached
#: through globals, nested closures); past it the function is stock's.
FUNCTION_BUDGET = 128
_stable_modules: dict = {}


def _is_namespace(obj) -> bool:
  """A module or class outside jax, numpy and the standard library: kept by
  identity in a key, so what code reads from it must be keyed as well."""
  if type(obj) is _ModuleType:
    return not _stable_module(obj.__name__)
  if isinstance(obj, type):
    return not _stable_module(getattr(obj, "__module__", None))
  return False


def chain_value(f, kind: str, name: str, attributes: tuple):
  """What ``f`` reads through an attribute chain (see :class:`CodePlan`):
  the chain is followed while it passes through modules and classes of the
  user's, and the first other value is returned (``Cfg.table`` for
  ``Cfg.table["scale"]``). :data:`_NOCHAIN` when the base is no such
  namespace (its contents are keyed otherwise), :data:`_MISSING` when an
  attribute is absent."""
  if kind == "global":
    obj = f.__globals__.get(name, _MISSING)
  else:
    try:
      obj = f.__closure__[f.__code__.co_freevars.index(name)].cell_contents
    except (ValueError, TypeError, IndexError):
      return _NOCHAIN
  if not _is_namespace(obj):
    return _NOCHAIN
  for attribute in attributes:
    if not _is_namespace(obj):
      break
    try:
      obj = getattr(obj, attribute)
    except Exception:
      return _MISSING
  return obj


def is_stable(fun: types.FunctionType) -> bool:
  """Whether ``fun`` belongs to jax, numpy or the standard library."""
  return _stable_module(fun.__module__)


def _stable_module(module) -> bool:
  try:
    return _stable_modules[module]
  except KeyError:
    pass
  stable = isinstance(module, str) and module.partition(".")[0] in STABLE_PACKAGES
  if len(_stable_modules) < 4096:
    _stable_modules[module] = stable
  return stable


# -- callable wrappers that the walk sees through ---------------------------

class _WrapperRule(NamedTuple):
  split: Callable[[Any], tuple[Any, Any]]   # wrapper -> (static part, inner callable)
  join: Callable[[Any, Any], Any]           # (static part, new inner) -> wrapper


_wrapper_rules: dict[type, _WrapperRule] = {}


def register_wrapper(cls: type, split, join) -> None:
  """Key instances of ``cls`` by a static part plus the callable they wrap.

  ``split(w)`` returns ``(static, inner)``, with ``static`` hashable;
  ``join(static, inner)`` makes an equivalent wrapper around a new inner
  callable. The package's own ``jit`` wrapper registers itself here.
  """
  _wrapper_rules[cls] = _WrapperRule(split, join)


# -- plain objects ----------------------------------------------------------

_HEAPTYPE = 1 << 9
_plain_types: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()


# C bases whose whole state the walk can read: their items (see _contents).
_CONTAINER_BASES = (list, tuple, dict)


def _is_plain_type(cls: type) -> bool:
  """Instances keep all their state in ``__dict__`` (plus their items, for a
  subclass of list, tuple or dict): Python classes only, no ``__slots__``
  anywhere in the MRO and no other C base than object and those three."""
  try:
    return _plain_types[cls]
  except KeyError:
    pass
  plain = True
  for c in cls.__mro__[:-1]:
    if c in _CONTAINER_BASES:
      continue
    slots = c.__dict__.get("__slots__", ())
    if isinstance(slots, str):
      slots = (slots,)
    if (not c.__flags__ & _HEAPTYPE
        or set(slots) - {"__dict__", "__weakref__"}):
      plain = False
      break
  plain = plain and "__dict__" in dir(cls)
  _plain_types[cls] = plain
  return plain


_copyable_types: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()
# Class attributes that make a shallow copy by __dict__ unsafe: creation or
# attribute hooks, and a class's own idea of how to copy itself.
_COPY_HOOKS = ("__new__", "__setattr__", "__delattr__", "__getattribute__",
               "__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__",
               "__getstate__", "__setstate__")


def _is_copyable_type(cls: type) -> bool:
  """Instances of ``cls`` (a plain type) can be rebuilt as
  ``object.__new__(cls)`` plus a copy of their ``__dict__``: no class in the
  MRO defines a creation, attribute or copy hook, or a data descriptor
  (a property, whose value the copy could not set), and none is a list,
  tuple or dict."""
  try:
    return _copyable_types[cls]
  except KeyError:
    pass
  ok = True
  for c in cls.__mro__[:-1]:
    d = c.__dict__
    if c in _CONTAINER_BASES or any(h in d for h in _COPY_HOOKS):
      ok = False
      break
    for name, attr in d.items():
      if name in ("__dict__", "__weakref__"):
        continue
      if hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"):
        ok = False
        break
    if not ok:
      break
  _copyable_types[cls] = ok
  return ok


def _contents(v) -> list:
  """The items of a plain object that subclasses list, tuple or dict."""
  if isinstance(v, dict):
    return [x for kv in v.items() for x in kv]
  if isinstance(v, (list, tuple)):
    return list(v)
  return []


def _float_key(x: float):
  # 0.0 == -0.0 and nan != nan; the hex form tells them apart exactly.
  return (float, x) if x == x and x != 0.0 else (float, x.hex())


def _numpy_key(a: np.ndarray):
  if a.dtype.hasobject:
    raise Uncacheable("unhashable", "a numpy array of dtype object")
  digest = hashlib.blake2b(np.ascontiguousarray(a).tobytes(),
                           digest_size=16).digest()
  return (_NUMPY, a.dtype, a.shape, digest)


_ATOMS = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})
_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten
_ArrayImpl = _compat.ArrayImpl
_Tracer = _compat.Tracer
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType


class Analysis:
  """One walk over a callable's closure; ``key``, ``leaves``, ``anchors`` and
  ``roots`` are the results (see the module docstring)."""
  __slots__ = ("key", "leaves", "anchors", "roots", "top", "memo",
               "lift_numpy", "in_object", "nesting", "budget", "depth",
               "dynamic", "scalars")

  # ``top`` is the analysed function (memo index 0); ``memo`` maps ids of
  # nested functions and objects to memo indices; ``nesting``, ``budget`` and
  # ``depth`` track plain objects. They are set when first needed: this
  # constructor runs on every cached call.

  def __init__(self, lift_numpy: bool, lift_arrays: bool, dynamic=None):
    self.leaves: list = []
    self.anchors: list = []
    self.roots: list = []
    self.lift_numpy = lift_numpy
    # Inside a plain object (or with lifting off) arrays are kept by identity.
    self.in_object = not lift_arrays
    # Ordinals (in walk order) of the Python int and float values to pass as
    # arguments (auto-dynamic scalars), or None; ``scalars`` counts them.
    self.dynamic = dynamic
    self.scalars = 0

  def identity(self, v, root: bool = False):
    self.anchors.append(v)
    if root:
      self.roots.append(v)
    # The label only makes explanations readable (``float32``, not an id).
    return (_ID, id(v), getattr(v, "__qualname__", None) or type(v).__name__)

  def value(self, v):
    t = type(v)
    if t is _ArrayImpl:
      if self.in_object or v._committed:
        return self.identity(v)
      self.leaves.append(v)
      return LIFTED
    if t is int or t is float:
      if self.dynamic is not None:
        n = self.scalars
        self.scalars = n + 1
        if n in self.dynamic and not self.in_object:
          self.leaves.append(v)   # a weakly typed scalar argument
          return (_DYN, t)
      return (t, v) if t is int else _float_key(v)
    if t in _ATOMS:
      return (t, v)
    if t is _Tag:
      return v
    if t is _FunctionType:
      if v.__closure__ is None and is_stable(v):
        return v   # jax, numpy, the standard library: by identity, not walked
      return self.function(v)
    if t is _ModuleType:
      return v
    if t is tuple or t is list or t is dict:
      return self.tree(v)
    return self.other(v, t)

  def other(self, v, t):
    if isinstance(v, _Tracer):
      raise Uncacheable("tracer", f"a {t.__name__} tracer is closed over")
    if isinstance(v, jax.Array):   # PRNG key arrays and other jax.Array types
      if self.in_object or getattr(v, "_committed", True):
        return self.identity(v)
      self.leaves.append(v)
      return LIFTED
    if isinstance(v, np.ndarray):
      if self.in_object:
        return self.identity(v)
      if self.lift_numpy and not v.dtype.hasobject:
        self.leaves.append(v)
        return LIFTED
      return _numpy_key(v)
    if isinstance(v, np.generic):
      return (t, v.tobytes())
    if t is complex:
      return (complex, repr(v))
    if t is set:   # unhashable, but its elements are hashable by definition
      return (set, frozenset(v))
    if t is bytearray:
      return (bytearray, bytes(v))
    if t is functools.partial:
      value = self.value
      return (_PARTIAL, value(v.func), tuple([value(a) for a in v.args]),
              tuple([(k, value(a)) for k, a in v.keywords.items()]))
    if t is types.MethodType:
      return (_METHOD, self.value(v.__func__), self.value(v.__self__))
    rule = _wrapper_rules.get(t)
    if rule is not None:
      static, inner = rule.split(v)
      return (_WRAPPER, t, static, self.value(inner))
    if t is type:
      return v
    if isinstance(v, type):
      return self.identity(v)
    try:
      leaves, treedef = _tree_flatten(v)
    except Exception as e:  # a custom flatten that fails: key it otherwise
      raise Uncacheable("unhashable", f"flattening {t.__name__} raised {e!r}")
    if not (len(leaves) == 1 and leaves[0] is v):
      return self.tree_parts(leaves, treedef)
    h = t.__hash__
    if h is not None and h is not object.__hash__:
      try:   # a dataclass hash fails on an unhashable field: walk it instead
        hash(v)
      except TypeError:
        pass
      else:
        return (t, v)   # value-based hash and equality, like a static argument
    if _is_plain_type(t):
      return self.plain_object(v, t)
    if h is object.__hash__:
      return self.identity(v, root=True)
    raise Uncacheable("unhashable", f"a {t.__name__} is unhashable, not a "
                      "pytree, and keeps state outside __dict__")

  def tree(self, v):
    try:
      leaves, treedef = _tree_flatten(v)
    except Exception as e:  # e.g. dict keys that do not sort
      raise Uncacheable("unhashable", f"flattening {type(v).__name__} raised {e!r}")
    return self.tree_parts(leaves, treedef)

  def tree_parts(self, leaves, treedef):
    value = self.value
    return (_TREE, treedef, tuple([value(x) for x in leaves]))

  def enter(self, v):
    """Memo index for a function or object; a back-reference if seen."""
    try:
      memo = self.memo
    except AttributeError:
      memo = self.memo = {}
      self.nesting = 0
    if v is getattr(self, "top", None):
      return (_CYCLE, 0)
    i = memo.get(id(v))
    if i is not None:
      return (_CYCLE, i)
    memo[id(v)] = i = len(memo) + 1
    return i

  def function(self, f, top: bool = False):
    if top:
      self.top = f
      i = 0
    else:
      i = self.enter(f)
      if type(i) is tuple:
        return i
      if i > FUNCTION_BUDGET:
        raise Uncacheable(
            "function_budget", f"more than {FUNCTION_BUDGET} functions and "
            f"objects are reachable through cells and globals (at "
            f"{f.__qualname__}); a retrace could read any of them")
    code = f.__code__
    plan = _plans.get(code) or code_plan(code)
    g = f.__globals__
    self.anchors.append(g)
    value = self.value
    closure = f.__closure__
    if closure is None:
      cells = ()
    else:
      try:
        cells = tuple([value(c.cell_contents) for c in closure])
      except ValueError:   # an unfilled cell (a recursive def in progress)
        cells = tuple([self.cell(c) for c in closure])
    d = f.__defaults__
    kw = f.__kwdefaults__
    return (_FN, i, code, id(g), cells,
            None if d is None else tuple([value(x) for x in d]),
            None if kw is None else tuple([(k, value(x)) for k, x in kw.items()]),
            tuple([value(g[n]) if n in g else _MISSING
                   for n in plan.global_names]),
            tuple([self.chain(f, *c) for c in plan.chains]) if plan.chains else ())

  def chain(self, f, kind, name, attributes):
    """The key of what an attribute chain reads (``Table.W``, ``mylib.W``,
    ``Cfg.table``): keyed like an object's attribute, so an array there is
    kept by identity (and such a function is stock's), never lifted."""
    obj = chain_value(f, kind, name, attributes)
    if obj is _NOCHAIN or obj is _MISSING:
      return obj
    saved = self.in_object
    self.in_object = True
    try:
      return self.value(obj)
    finally:
      self.in_object = saved

  def cell(self, c):
    try:
      v = c.cell_contents
    except ValueError:
      return _EMPTY
    return self.value(v)

  def plain_object(self, v, t):
    i = self.enter(v)
    if type(i) is tuple:
      return i
    attrs = vars(v)
    contents = _contents(v)
    size = len(attrs) + len(contents)
    if self.nesting == 0:   # a new outermost object gets fresh budgets
      self.budget = OBJECT_VALUES_BUDGET
      self.depth = OBJECT_DEPTH_BUDGET
    if self.depth <= 0 or size > self.budget:
      if t.__hash__ is None:
        raise Uncacheable(
            "unhashable", f"a {t.__name__} is unhashable and too large to key "
            "by its attributes")
      return self.identity(v, root=True)
    saved = self.in_object, self.depth
    # An object the rebuild can copy keeps arrays lifted (the trace runs on
    # a shallow copy holding tracers); any other keeps them by identity.
    copyable = not self.in_object and not contents and _is_copyable_type(t)
    self.in_object = not copyable
    self.nesting += 1
    self.depth -= 1
    self.budget -= size   # shared by the whole outermost object
    try:
      value = self.value
      items = tuple([(k, value(x)) for k, x in attrs.items()])
      if contents:
        items += (tuple([value(x) for x in contents]),)
    finally:
      self.in_object, self.depth = saved
      self.nesting -= 1
    return (_COPY if copyable else _OBJ, i, t, items)


def analyse(fun: Callable, lift_numpy: bool = False,
            lift_arrays: bool = True, dynamic=None) -> Analysis:
  """Key, lifted leaves, anchors and guard roots of ``fun`` (see module doc).

  With ``lift_arrays=False`` every array is keyed by identity and left in
  place, as inside a plain object.

  Raises:
    Uncacheable: ``fun`` closes over a tracer, or over a value that is
      neither hashable nor a pytree.
  """
  a = Analysis(lift_numpy, lift_arrays, dynamic)
  if type(fun) is _FunctionType:
    a.key = a.function(fun, top=True)   # by contents even at module level
  else:
    a.key = a.value(fun)
  return a


# -- auto-dynamic scalars -------------------------------------------------------

def _is_scalar_part(k) -> bool:
  return (type(k) is tuple and len(k) == 2
          and (k[0] is int or k[0] is float or k[0] is _DYN))


def _mask(k, scalars: list):
  """``k`` with every int or float part replaced by ``(type, _SCALAR)``
  (a dynamic one by its type too), appending the parts to ``scalars`` in
  walk order: the order in which :meth:`Analysis.value` counts them."""
  if _is_scalar_part(k):
    scalars.append(k)
    return (k[1] if k[0] is _DYN else k[0], _SCALAR)
  if type(k) is tuple:
    return tuple([_mask(x, scalars) for x in k])
  return k


def scalars_that_differ(old_key, new_key) -> "frozenset[int] | None":
  """Ordinals of the Python int/float values that differ between two keys
  equal in everything else (same types at the same positions), or None if
  anything else differs."""
  old_scalars, new_scalars = [], []
  if _mask(old_key, old_scalars) != _mask(new_key, new_scalars):
    return None
  return frozenset(i for i, (a, b) in enumerate(zip(old_scalars, new_scalars))
                   if a != b and a[0] is not _DYN and b[0] is not _DYN)


def dynamic_ordinals(key) -> frozenset:
  """Ordinals of the scalars ``key`` passes as arguments."""
  scalars: list = []
  _mask(key, scalars)
  return frozenset(i for i, k in enumerate(scalars) if k[0] is _DYN)


# -- quick match: the hot path's check against one known key -----------------

def _is_simple_part(part) -> bool:
  """A key part that a value can be checked against without building a key:
  a lifted array, an atom or float, a missing global, an identity object, a
  pytree of those, a ``functools.partial`` of those, or a nested function (no
  keyword defaults, no back-reference) whose cells, defaults and read globals
  are all simple."""
  if part is LIFTED or part is _MISSING or part is _NOCHAIN:
    return True
  if type(part) is tuple:
    if len(part) == 2 and part[0] is _DYN:
      return True
    if len(part) == 2 and part[0] is _CYCLE:
      return True
    if len(part) == 3 and part[0] is _TREE:
      return all(map(_is_simple_part, part[2]))
    if len(part) == 4 and part[0] is _PARTIAL:
      return all(map(_is_simple_part,
                     (part[1], *part[2], *(p for _, p in part[3]))))
    if len(part) == 9 and part[0] is _FN:
      _, _, code, _, cells, defaults, kwdefaults, globs, chains = part
      return (kwdefaults is None
              and len(globs) == len(code_plan(code).global_names)
              and all(map(_is_simple_part,
                          (*cells, *(defaults or ()), *globs, *chains))))
    # an atom, a float, or a value-hashed object (a frozen dataclass, an
    # enum, a launcher's static parameters): checked by type and equality
    # (a value keyed by a representation, such as a NumPy scalar's bytes,
    # is not: the object itself would never equal its part)
    return len(part) == 2 and (part[0] in _ATOMS or part[0] is float or (
        isinstance(part[0], type) and type(part[1]) is part[0]))
  return not isinstance(part, _Tag)


class _MatchSource:
  """Source lines of a generated matcher, and the objects they name."""

  def __init__(self):
    self.env = {"MISSING": _MISSING, "ArrayImpl": _ArrayImpl,
                "FunctionType": _FunctionType, "float_key": _float_key,
                "partial": functools.partial,
                "tree_flatten": _tree_flatten,
                "is_stable": is_stable, "chain_value": chain_value}
    self.lines: list[str] = []
    self.functions: list[str] = []   # variables holding walked functions
    self.by_index: dict[int, str] = {}   # memo index -> that variable
    # id -> globals dict of the functions the key was analysed from: the
    # matcher compares the dict itself (cheaper than its id), which the entry
    # anchors anyway
    self.globals_by_id: dict[int, dict] = {}

  def bind(self, value) -> str:
    name = f"K{len(self.env)}"
    self.env[name] = value
    return name

  def check(self, expr: str, part) -> None:
    """Lines that return None unless ``expr`` keys to ``part``; lifted
    arrays are appended to ``out`` in walk order."""
    add = self.lines.append
    v = f"v{len(self.lines)}"
    add(f"    {v} = {expr}")
    if part is LIFTED:
      add(f"    if type({v}) is not ArrayImpl or {v}._committed: return None")
      add(f"    out.append({v})")
    elif type(part) is tuple and part[0] is _DYN:
      add(f"    if type({v}) is not {self.bind(part[1])}: return None")
      add(f"    out.append({v})")
    elif type(part) is tuple and part[0] is _FN:
      self.function(v, part)
    elif type(part) is tuple and part[0] is _CYCLE:
      # the same object as an earlier walked function (distinct otherwise)
      add(f"    if {v} is not {self.by_index[part[1]]}: return None")
    elif type(part) is tuple and part[0] is _PARTIAL:
      _, func, args, keywords = part
      names = tuple(k for k, _ in keywords)
      add(f"    if type({v}) is not partial or len({v}.args) != {len(args)} "
          f"or tuple({v}.keywords) != {self.bind(names)}: return None")
      self.check(f"{v}.func", func)
      for j, p in enumerate(args):
        self.check(f"{v}.args[{j}]", p)
      for k, p in keywords:
        self.check(f"{v}.keywords[{k!r}]", p)
    elif (type(part) is tuple and part[0] is _TREE and part[2]
          and all(p is LIFTED for p in part[2]) and _plain_tree(part[1])):
      # dicts, lists and tuples of arrays (a params tree): read in place,
      # in the order tree_flatten would give, without flattening
      self.plain_tree(v, part[1])
    elif type(part) is tuple and part[0] is _TREE:
      leaves, treedef = f"{v}_leaves", f"{v}_def"
      add(f"    {leaves}, {treedef} = tree_flatten({v})")
      add(f"    if {treedef} != {self.bind(part[1])}: return None")
      if all(p is LIFTED for p in part[2]):   # the common params pytree
        add(f"    for x in {leaves}:")
        add(f"      if type(x) is not ArrayImpl or x._committed: return None")
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

  def plain_tree(self, e: str, treedef) -> None:
    """Checks that variable ``e`` has the structure ``treedef`` (dicts,
    lists and tuples only) with an uncommitted array at every leaf, which
    are appended to ``out`` in tree_flatten's order (sorted dict keys)."""
    add = self.lines.append
    kind, keys = treedef.node_data()
    children = treedef.children()
    n = len(children)
    if kind is dict:
      add(f"    if type({e}) is not dict or {e}.keys() != "
          f"{self.bind(frozenset(keys))}: return None")
      items = [f"{e}[{k!r}]" for k in keys]
    else:
      add(f"    if type({e}) is not {self.bind(kind)} or len({e}) != {n}: "
          "return None")
      items = [f"{e}[{i}]" for i in range(n)]
    if all(c.num_nodes == 1 and c.num_leaves == 1 for c in children):
      # a node of leaves: one C-level gather, one check loop
      gather = (f"list(map({e}.__getitem__, {self.bind(tuple(keys))}))"
                if kind is dict else f"list({e})")
      xs = f"{e}_xs"
      add(f"    {xs} = {gather}")
      add(f"    for x in {xs}:")
      add(f"      if type(x) is not ArrayImpl or x._committed: return None")
      add(f"    out.extend({xs})")
      return
    for i, (item, child) in enumerate(zip(items, children)):
      if child.num_nodes == 1 and child.num_leaves == 1:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        add(f"    if type({x}) is not ArrayImpl or {x}._committed: return None")
        add(f"    out.append({x})")
      else:
        x = f"{e}_{i}"
        add(f"    {x} = {item}")
        self.plain_tree(x, child)

  def function(self, f: str, part) -> None:
    """Checks of the function in variable ``f`` against an ``_FN`` part, in
    the walk's order: cells, defaults, read globals.

    The globals dict is compared by id: the part holds only its id, and a
    match is used only while its entry, which anchors that dict, is alive.
    """
    _, index, code, gid, cells, defaults, _, globs, chains = part
    add = self.lines.append
    self.functions.append(f)
    self.by_index[index] = f
    g = self.globals_by_id.get(gid)
    same_globals = (f"{f}.__globals__ is not {self.bind(g)}" if g is not None
                    else f"id({f}.__globals__) != {gid}")
    add(f"    if (type({f}) is not FunctionType or {f}.__code__ is not "
        f"{self.bind(code)} or {same_globals} "
        f"or {f}.__kwdefaults__ is not None): return None")
    # analyse keys a function of jax, numpy or the standard library by
    # identity instead
    if part[1] != 0:
      add(f"    if {f}.__closure__ is None and is_stable({f}): return None")
    add(f"    {f}_d = {f}.__defaults__")
    if defaults is None:
      add(f"    if {f}_d is not None: return None")
    else:
      add(f"    if {f}_d is None or len({f}_d) != {len(defaults)}: return None")
    for i, p in enumerate(cells):
      self.check(f"{f}.__closure__[{i}].cell_contents", p)
    for i, p in enumerate(defaults or ()):
      self.check(f"{f}_d[{i}]", p)
    for name, p in zip(code_plan(code).global_names, globs):
      self.check(f"{f}.__globals__.get({name!r}, MISSING)", p)
    names = code_plan(code).global_names
    for chain, p in zip(code_plan(code).chains, chains):
      kind, name, _ = chain
      if p is _NOCHAIN:
        # The base is checked above: by identity when it is a module or a
        # class (then whether it is one of the user's is settled), or by its
        # own key otherwise (then it is not a namespace either).
        base = (globs[names.index(name)] if kind == "global" else
                cells[code.co_freevars.index(name)]
                if name in code.co_freevars else None)
        if base is not None and not isinstance(base, _Tag) and (
            isinstance(base, (_ModuleType, type)) or type(base) is tuple):
          continue
      self.check(f"chain_value({f}, *{self.bind(chain)})", p)


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
  while pending and len(seen) < _GUARD_SEARCH_NODES:   # unfound: compared by id
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


def _filled(cell) -> bool:
  try:
    cell.cell_contents
  except ValueError:
    return False
  return True


def quick_matcher(fun, key) -> "Callable[[Any], list | None] | None":
  """The hot path's inline cache for one key of a top-level function.

  Returns ``match`` such that ``match(f)`` is ``f``'s lifted leaves exactly
  when ``analyse(f).key == key``, and None otherwise; or returns None itself
  when some part of ``key`` is not simple (:func:`_is_simple_part`).
  ``match`` is generated for this key, like a ``dataclasses`` method, so it
  reads each value once with no key to build; every object it compares with
  is bound by name, never written into the source. Nested functions must be
  distinct objects, as the walk would otherwise have keyed the second
  occurrence as a back-reference. It plays the part torch.compile's guards
  play.
  """
  if (type(fun) is not _FunctionType or type(key) is not tuple
      or key[0] is not _FN or not _is_simple_part(key)
      or fun.__code__ is not key[2] or id(fun.__globals__) != key[3]):
    return None
  src = _MatchSource()
  src.globals_by_id = _globals_reached(fun)
  src.function("f", key)
  if len(src.functions) > 1:
    ids = ", ".join(f"id({f})" for f in src.functions)
    src.lines.append(f"    if len({{{ids}}}) != {len(src.functions)}: return None")
  text = "\n".join(
      ["def match(f):", "  out = []", "  try:", *src.lines,
       "  except Exception:   # an unfilled cell, a flatten that fails",
       "    return None", "  return out"])
  exec(compile(text, f"<closure-cache match {key[2].co_name}>", "exec"),
       src.env)
  return src.env["match"]


# -- rebuild -----------------------------------------------------------------

def _has_lifted(k) -> bool:
  """Whether the part holds a lifted leaf or a back-reference. A function
  reached a second time (through another cell, a partial, a container) is a
  back-reference; if its first occurrence is rebuilt, every holder of the
  second must be rebuilt too, or it keeps calling the original, whose
  arrays the trace would then capture as constants."""
  if k is LIFTED:
    return True
  if type(k) is tuple and k:
    if (k[0] is _CYCLE or k[0] is _DYN) and len(k) == 2:
      return True
    if k[0] is _OBJ:   # kept whole: their arrays are kept by identity
      return False
    return any(_has_lifted(x) for x in k)
  return False


def _is_cycle(k) -> bool:
  return type(k) is tuple and len(k) == 2 and k[0] is _CYCLE


class _Rebuild:
  __slots__ = ("leaves", "memo")

  def __init__(self, leaves):
    self.leaves = iter(leaves)
    self.memo: dict[int, Any] = {}   # memo index -> rebuilt function

  def value(self, v, k):
    if k is LIFTED:
      return next(self.leaves)
    if type(k) is not tuple or not k or type(k[0]) is not _Tag:
      return v
    tag = k[0]
    if tag is _CYCLE:
      return self.memo.get(k[1], v)
    if tag is _DYN:
      return next(self.leaves)
    if not _has_lifted(k):
      return v
    if tag is _FN:
      return self.function(v, k)
    if tag is _TREE:
      leaves, treedef = _tree_flatten(v)
      return _tree_unflatten(
          treedef, [self.value(x, kx) for x, kx in zip(leaves, k[2])])
    if tag is _PARTIAL:
      func = self.value(v.func, k[1])
      args = [self.value(a, ka) for a, ka in zip(v.args, k[2])]
      kws = {name: self.value(v.keywords[name], ka) for name, ka in k[3]}
      return functools.partial(func, *args, **kws)
    if tag is _METHOD:
      return types.MethodType(self.value(v.__func__, k[1]),
                              self.value(v.__self__, k[2]))
    if tag is _WRAPPER:
      static, inner = _wrapper_rules[k[1]].split(v)
      return _wrapper_rules[k[1]].join(static, self.value(inner, k[3]))
    if tag is _COPY:
      return self.copy(v, k)
    raise AssertionError(f"lifted leaf under {tag}")

  def copy(self, obj, k):
    """A shallow copy of a plain object with its lifted attributes replaced;
    the user's object is never modified (a trace that sets an attribute sets
    it on the copy)."""
    _, index, t, items = k
    new = object.__new__(t)
    self.memo[index] = new
    attrs = dict(vars(obj))
    for name, kx in items:
      if _has_lifted(kx):
        attrs[name] = self.value(attrs[name], kx)
    vars(new).update(attrs)
    return new

  def function(self, f, k):
    _, index, code, _, cells_k, defaults_k, kwdefaults_k, globals_k, _ = k
    closure = f.__closure__
    g = f.__globals__
    plan = code_plan(code)
    lifted_globals = any(_has_lifted(x) for x in globals_k)
    if lifted_globals:
      if plan.writes_globals:
        raise Uncacheable("writes_globals", f"{f.__qualname__} assigns to a "
                          "global and reads a global array")
      g = dict(g)   # the rebuilt function reads its own copy
    new_cells = None
    if closure is not None:
      new_cells = tuple(
          types.CellType() if _has_lifted(ck) or _is_cycle(ck) else c
          for c, ck in zip(closure, cells_k))
    new = types.FunctionType(code, g, f.__name__, None, new_cells)
    self.memo[index] = new
    if closure is not None:
      for c, nc, ck in zip(closure, new_cells, cells_k):
        if nc is not c:
          nc.cell_contents = self.value(c.cell_contents, ck)
    if f.__defaults__ is not None:
      new.__defaults__ = tuple(
          self.value(x, kx) for x, kx in zip(f.__defaults__, defaults_k))
    if f.__kwdefaults__ is not None:
      new.__kwdefaults__ = {
          name: self.value(f.__kwdefaults__[name], kx)
          for name, kx in kwdefaults_k}
    if lifted_globals:
      for name, kx in zip(plan.global_names, globals_k):
        if kx is not _MISSING:
          g[name] = self.value(g[name], kx)
    copy_function_metadata(f, new)
    return new


def copy_function_metadata(src: types.FunctionType,
                           dst: types.FunctionType) -> None:
  """What ``FunctionType(code, ...)`` does not copy from ``src``."""
  dst.__qualname__ = src.__qualname__
  dst.__module__ = src.__module__
  dst.__doc__ = src.__doc__
  dst.__annotations__ = src.__annotations__
  dst.__dict__.update(src.__dict__)


def rebuild(fun: Callable, key, leaves) -> Callable:
  """``fun`` with the lifted positions of ``key`` filled from ``leaves``.

  ``key`` must be ``analyse(fun).key`` and ``leaves`` as long as its leaves.
  """
  r = _Rebuild(leaves)
  out = r.value(fun, key)
  if next(r.leaves, _MISSING) is not _MISSING:
    raise AssertionError("more leaves than lifted positions")
  return out


# -- guards: where a captured array was found --------------------------------

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
  where = ", ".join(_root_name(r) for r in roots[:4]) or "no object kept by identity"
  arrays = ", ".join(describe_array(x) for x in list(wanted.values())[:3])
  return Unguarded(
      f"the trace captured {len(wanted)} array(s) ({arrays}) that the key does "
      f"not cover and that were not found under {where}"
      + (" (search budget spent)" if head >= _GUARD_SEARCH_NODES else ""))


def _root_name(r) -> str:
  name = getattr(r, "__qualname__", None) or type(r).__name__
  return f"{name}"


def _children(obj):
  t = type(obj)
  if t in _ATOMS or t is float or isinstance(obj, (jax.Array, np.ndarray)):
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
