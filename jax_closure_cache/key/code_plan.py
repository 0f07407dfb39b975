"""What a function's code reads, and which code is taken as stable.

``code_plan(code)`` is read once per code object: the globals it (and its
nested code) loads, whether it writes globals or cells, and the attribute
chains it reads from a global or a cell (``Table.W``). ``chain_value``
follows such a chain through the user's modules and classes to the value
the key must hold. Code of jax, numpy, the standard library and this
package's module-level functions is stable: keyed by identity, not walked.

Invariants: a plan depends on the code object alone (cached by it, bounded);
a chain is followed only through namespaces (modules, classes) that are not
stable, so the value reached is what the code reads.
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from typing import NamedTuple

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache._compat.lowering import HEAPTYPE, held_by_its_module
from jax_closure_cache.key.versions import (
    namespace_version as _namespace_version)
from jax_closure_cache.key import closure_key
from jax_closure_cache.key.parts import MISSING, NOCHAIN

_ModuleType = types.ModuleType


class CodePlan(NamedTuple):
  """What a code object (with its nested code objects) reads and writes.

  ``chains`` are the attribute chains its code reads from a global or a
  free variable, as ``(kind, name, attributes)`` with kind ``"global"`` or
  ``"cell"``: ``Table.W`` is ``("global", "Table", ("W",))``.
  """
  global_names: tuple[str, ...]
  writes_globals: bool
  chains: tuple = ()
  # free variables of the code that it (or code it nests) assigns:
  # ``nonlocal n`` of a closed-over ``n`` (a local of its own that a nested
  # function captures is a fresh cell each call, never the closure's)
  written_cells: frozenset = frozenset()
  # modules it imports where it runs (``import cfg``, ``from cfg import K``
  # in its body): what it reads of them goes through locals, in no chain
  imports: tuple = ()
  # ``(kind, name)`` of the globals and free variables it also reads bare,
  # not as the base of an attribute chain (passed, returned, ``getattr``)
  bare: frozenset = frozenset()
  # every attribute name it reads, of anything (``__match_args__`` for a
  # ``case C(...)`` pattern, which reads the class's)
  attributes: frozenset = frozenset()


_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_ATTR_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_CELL_WRITES = frozenset({"STORE_DEREF", "DELETE_DEREF"})
# A plain dict: a weak one costs a weakref per lookup on the hot path. It is
# emptied when it grows past _PLANS_MAX (code made by exec in a loop).
_plans: dict[types.CodeType, CodePlan] = cache.STORE.table("code_plan.plans",
                                                       cache.Store.FACTS)
_PLANS_MAX = 1 << 16


def code_plan(code: types.CodeType) -> CodePlan:
  """The globals ``code`` and its nested code objects read, once per code."""
  try:
    return _plans[code]
  except KeyError:
    pass
  names: dict[str, None] = {}
  chains: dict[tuple, None] = {}
  bare: set = set()
  attributes: set = set()
  imports: dict[str, None] = {}
  written: dict = {}   # code -> the cell names it assigns itself
  writes = False
  pending = [code]
  while pending:
    co = pending.pop()
    written[co] = set()
    chain = None   # (kind, name, [attributes]) being read right now
    for ins in dis.get_instructions(co):
      op = ins.opname
      if op in _GLOBAL_READS or op == "LOAD_DEREF":
        if chain is not None:
          _end_chain(chain, chains, bare)
        kind = "cell" if op == "LOAD_DEREF" else "global"
        chain = (kind, ins.argval, [])
        if kind == "global":
          names[ins.argval] = None
        continue
      if op in _ATTR_READS:
        attributes.add(ins.argval)
        if chain is not None:
          chain[2].append(ins.argval)
          continue
      elif op == "MATCH_CLASS":
        attributes.add("__match_args__")
      if chain is not None:
        _end_chain(chain, chains, bare)
      chain = None
      if op == "IMPORT_NAME":
        imports[ins.argval] = None
      elif op in _GLOBAL_WRITES:
        writes = True
      elif op in _CELL_WRITES:
        written[co].add(ins.argval)
    if chain is not None:
      _end_chain(chain, chains, bare)
    pending.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
  plan = CodePlan(tuple(names), writes, tuple(chains),
                  frozenset(_free_writes(code, written)), tuple(imports),
                  frozenset(bare), frozenset(attributes))
  if len(_plans) >= _PLANS_MAX:
    _plans.clear()
  _plans[code] = plan
  return plan


def _end_chain(chain, chains: dict, bare: set) -> None:
  """Record the chain read from ``chain``'s name, or its bare read."""
  if chain[2]:
    chains[(chain[0], chain[1], tuple(chain[2]))] = None
  else:
    bare.add((chain[0], chain[1]))


def _free_writes(co: types.CodeType, written: dict) -> set:
  """The free variables of ``co`` that it or code it nests assigns: a name
  assigned in nested code reaches ``co``'s free variable only through
  free variables of each code between (a cell of the nested code's own, or
  of ``co``'s, is made afresh by each call)."""
  found = {n for n in written.get(co, ()) if n in co.co_freevars}
  for c in co.co_consts:
    if isinstance(c, types.CodeType):
      found |= {n for n in _free_writes(c, written) if n in co.co_freevars}
  return found


def is_module_level(fun: types.FunctionType) -> bool:
  """A function defined at module scope: no closure, not nested anywhere."""
  return fun.__closure__ is None and "<locals>" not in fun.__qualname__


#: Top-level packages whose functions are taken as stable: their globals are
#: not walked (a user does not reassign ``jax.numpy``'s module globals), and
#: they are keyed by identity. The closure key module's list, extended by
#: jax's own dependencies and the whole standard library. Everything else a
#: traced function reaches, module-level helpers included, is walked to the
#: function budget (this package's module-level functions aside:
#: :func:`is_stable`). (``values.IDENTITY_PACKAGES`` is another list: whose
#: objects are kept by identity where the walk cannot read them.)
STABLE_PACKAGES = closure_key.STABLE_PACKAGES | frozenset(
    {"ml_dtypes", "opt_einsum"}) | frozenset(
        getattr(sys, "stdlib_module_names", ()))
#: The stable packages whose code is found by their own folders (the
#: standard library's, jax's, jaxlib's and numpy's are ``_compat``'s).
_FOLDERED = tuple(sorted(STABLE_PACKAGES - {"jax", "jaxlib", "numpy"}
                         - frozenset(getattr(sys, "stdlib_module_names", ()))))
# module name -> whether it is stable (bounded: 4096 names)
_stable_modules: dict = cache.STORE.table("code_plan.stable_modules",
                                         cache.Store.FACTS)


def _is_namespace(obj) -> bool:
  """A module or class outside jax, numpy and the standard library: kept by
  identity in a key, so what code reads from it must be keyed as well."""
  if type(obj) is _ModuleType:
    return not stable_module(obj.__name__)
  if isinstance(obj, type):
    return not library_class(obj)
  return False


def chain_base(f, kind: str, name: str):
  """The global or cell a chain starts from (:data:`MISSING` for an absent
  global, :data:`NOCHAIN` for an unreadable cell)."""
  if kind == "global":
    return f.__globals__.get(name, MISSING)
  try:
    return f.__closure__[f.__code__.co_freevars.index(name)].cell_contents
  except (ValueError, TypeError, IndexError):
    return NOCHAIN


def chain_value(f, kind: str, name: str, attributes: tuple):
  """What ``f`` reads through an attribute chain (see :class:`CodePlan`):
  the chain is followed while it passes through modules and classes of the
  user's, and the first other value is returned (``Cfg.table`` for
  ``Cfg.table["scale"]``). :data:`NOCHAIN` when the base is no such
  namespace (its contents are keyed otherwise), :data:`MISSING` when an
  attribute is absent."""
  obj = chain_base(f, kind, name)
  if obj is NOCHAIN or not _is_namespace(obj):
    return NOCHAIN
  return _follow(obj, attributes, _is_namespace)


def chain_read(f, kind: str, name: str, attributes: tuple):
  """What the closure walk keys for an attribute chain: :func:`chain_value`,
  or, where that finds no namespace of the user's at the base (a module of
  jax's: ``jax.lax.while_loop``), :func:`library_value`. A matcher reads a
  chain with this, so it reads what the walk read."""
  obj = chain_value(f, kind, name, attributes)
  if obj is NOCHAIN:
    return library_value(f, kind, name, attributes)
  return obj


def _follow(obj, attributes: tuple, through):
  """``obj``'s attributes along ``attributes`` while ``through(obj)``;
  :data:`MISSING` where one is absent. A module's are read from its
  namespace: one its ``__getattr__`` (PEP 562: a lazy attribute, a
  deprecation shim) would serve is run by every read, which the key would
  run again on every call (its result, its warnings, its counters), so
  such a chain is refused (``Unkeyable``)."""
  for attribute in attributes:
    if not through(obj):
      break
    try:
      obj = namespace_attribute(obj, attribute)
    except closure_key.Unkeyable:
      raise
    except Exception:
      return MISSING
  return obj


def namespace_attribute(obj, attribute: str):
  """``getattr(obj, attribute)``, a module's read from its namespace: where
  its ``__getattr__`` would serve it, ``Unkeyable`` (that runs code: a lazy
  import, a deprecation warning, a counter), else AttributeError where it
  is absent."""
  if type(obj) is not _ModuleType:
    return getattr(obj, attribute)
  names = obj.__dict__
  if attribute in names:
    return names[attribute]
  if "__getattr__" in names:
    raise closure_key.Unkeyable(
        "module_getattr", f"{obj.__name__}.{attribute} is served by its "
        "module's __getattr__, which runs at every read")
  raise AttributeError(attribute)


def library_value(f, kind: str, name: str, attributes: tuple):
  """What ``f`` reads through an attribute chain from a module of jax, numpy
  or the standard library (``jnp.tanh``): followed through modules only, so
  a test that replaces ``jnp.tanh`` is seen. :data:`NOCHAIN` when the base
  is no such module, :data:`MISSING` when an attribute is absent."""
  obj = chain_base(f, kind, name)
  if type(obj) is not _ModuleType or not stable_module(obj.__name__):
    return NOCHAIN
  return _follow(obj, attributes, lambda o: type(o) is _ModuleType)


def is_stable(fun: types.FunctionType) -> bool:
  """Whether ``fun`` belongs to jax, numpy or the standard library (its
  ``__module__`` names theirs and its code was loaded from their folders:
  ``functools.wraps`` copies a ``__module__`` onto user code), or is one
  of this package's module-level functions (:func:`own_module_level`)."""
  return ((stable_module(fun.__module__) and stable_code(fun.__code__))
          or own_module_level(fun))


def stable_code(code) -> bool:
  """Whether ``code`` was loaded from the folder of a stable package
  (``STABLE_PACKAGES``, the standard library's frozen modules included)
  or of this package (which wraps jax's functions it replaces): where its
  file lies, never what ``__module__`` says."""
  return (_compat.stable_package_code(code, _FOLDERED)
          or _compat.library_or_own_code(code))


def may_be_stable(module: str) -> bool:
  """Whether some function whose ``__module__`` is ``module`` is stable
  (:func:`is_stable`): every function of a stable module, and this
  package's module-level ones."""
  return stable_module(module) or module.partition(".")[0] == PACKAGE


def own_module_level(fun) -> bool:
  """Whether ``fun`` (a function or a class) is a module-level one of this
  package, keyed by identity like jax's: its ``jit`` stands in for
  ``jax.jit`` (a user function that reads ``jit`` after ``from jax import
  jit`` reaches it), and its globals are the cache's own state, which
  changes with every store (and holds dicts keyed by code objects) but
  never what a function computes. Nested functions, such as the
  benchmark's workloads, are walked as any user's; so is anything whose
  ``__module__`` or ``__qualname__`` raises when read."""
  try:
    module = fun.__module__
    qualname = fun.__qualname__
  except Exception:   # a metaclass's property
    return False
  return (type(module) is str and module.partition(".")[0] == PACKAGE
          and type(qualname) is str and "<locals>" not in qualname
          # (a function's code loaded from this package: a copied
          # ``__module__`` names it too; a class has no code of its own)
          and (type(fun) is not types.FunctionType
               or _compat.library_or_own_code(fun.__code__)))


def library_class(t) -> bool:
  """Whether ``t`` is a class of jax, numpy, the standard library or the
  other stable packages (``STABLE_PACKAGES``): its ``__module__`` names
  one of theirs, that module holds it (``held_by_its_module``: by its
  qualified name or its name; a static C type is theirs), and its
  namespace holds no function loaded from outside their folders (a method
  the user set on it). (``__module__`` alone is ``builtins`` for a class
  ``exec`` made, ``types`` for one ``make_dataclass`` made; a class a
  library makes in a function is walked, as a user's.) A class whose
  attributes raise when read is not. The answer is kept per class while
  its namespace holds the same objects (:data:`_LIBRARY_CLASSES`)."""
  try:
    if not type.__dict__["__flags__"].__get__(t) & HEAPTYPE:
      # a static C type: its namespace cannot be changed
      return stable_module(t.__module__)
    held = (_namespace_version(t) if _namespace_version is not None
            else tuple(map(id, vars(t).values())))
  except Exception:   # a metaclass's property, a module's __getattr__
    return False
  known = _LIBRARY_CLASSES.get(id(t))
  if known is not None and known[0]() is t and known[2] == held:
    return known[1]
  answer = _library_class(t)
  try:
    ref = weakref.ref(t, lambda r, i=id(t): _forget_class(i, r))
  except TypeError:
    return answer
  _LIBRARY_CLASSES[id(t)] = (ref, answer, held)
  return answer


#: :func:`library_class`'s answers, by the class's id while it lives (``id
#: -> (weak reference, answer, its namespace's version tag then)``): keyed
#: by id, as a metaclass's ``__hash__`` is the user's. The tag
#: (``versions.namespace_version``) changes with every change to the
#: namespace; without it, the ids of the namespace's values stand in (not
#: the values: holding them would hold the class, whose ``__dict__``
#: descriptor names it; a method set later is made while the one it
#: replaces lives, so its id differs).
_LIBRARY_CLASSES = cache.STORE.table("code_plan.library_classes",
                                     cache.Store.FACTS)


def _forget_class(i: int, ref) -> None:
  known = _LIBRARY_CLASSES.get(i)
  if known is not None and known[0] is ref:   # not a later class's
    _LIBRARY_CLASSES.pop(i, None)


def _library_class(t) -> bool:
  try:
    return (stable_module(t.__module__) and held_by_its_module(t)
            and not _user_code_in(t))
  except Exception:   # a metaclass's property, a module's __getattr__
    return False


def _user_code_in(t) -> bool:
  """Whether ``t``'s own namespace holds a function (a method, a static
  or class method, a property's getter) whose code was not loaded from
  the stable packages' folders or this package's."""
  return any(map(user_function, vars(t).values()))


def user_function(x) -> bool:
  """Whether ``x`` is, or wraps (a bound, static or class method, a
  property's getter), a function whose code was not loaded from the
  stable packages' folders or this package's, nor made for a library's
  class by the standard library (:func:`_made_for_a_library`)."""
  f = getattr(x, "__func__", None) or getattr(x, "fget", None) or x
  return (type(f) is types.FunctionType and not stable_code(f.__code__)
          and not _made_for_a_library(f))


def _made_for_a_library(f) -> bool:
  """Whether ``f``'s code was compiled from a string in a stable module's
  namespace: a NamedTuple's ``__new__`` (which reads nothing but
  ``tuple.__new__``), or a function whose ``__globals__`` is a stable
  module's own dict (a method ``dataclasses`` made for a class of that
  module's; asked of the namespace of a class its module holds, so a
  ``make_dataclass`` class of the user's, given ``types`` as its module,
  is not a library's for it)."""
  code = f.__code__
  if code.co_filename != "<string>":
    return False
  g = f.__globals__
  if (f.__closure__ is None and code.co_names == ("_tuple_new",)
      and g.get("_tuple_new") is tuple.__new__):
    return True
  name = g.get("__name__")
  return (stable_module(name)
          and getattr(sys.modules.get(name), "__dict__", None) is g)


PACKAGE = __name__.partition(".")[0]


def stable_module(module) -> bool:
  try:
    return _stable_modules[module]
  except KeyError:
    pass
  stable = isinstance(module, str) and module.partition(".")[0] in STABLE_PACKAGES
  if len(_stable_modules) < 4096:
    _stable_modules[module] = stable
  return stable
