"""Values the walk looks at before it walks them: library state a trace
draws from (random generators, iterators, clocks), library objects kept by
identity, code reading globals by computed names, static values, callable
wrappers (the closure key's registry), and functions whose identity is
fresh per call, in tuples and in pytree node data.

Invariants: nothing here walks a value or calls user code (but attribute
reads along a chain the code itself reads, ``chain_draws``); the wrapper
rules are the closure key module's own table (``WRAPPERS``), so its walk
and rebuild and the package's see the same registrations.
"""

from __future__ import annotations

import builtins
import collections
import contextvars
import functools
import gc
import inspect
import io
import operator
import random
import sys
import threading
import traceback
import types

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache.key import closure_key
from jax_closure_cache.key.code_plan import (
    chain_base, is_stable, library_class, namespace_attribute, stable_module)
from jax_closure_cache.key.objects import as_method, is_plain_type
from jax_closure_cache.key.parts import BUILTIN_NODES

_key = closure_key
_FunctionType = types.FunctionType


# -- library state a trace draws from ------------------------------------------

#: Library types whose state a trace changes by reading it: random
#: generators and files (iterators are recognised by ``__next__``).
DRAWN_TYPES = (np.random.Generator, np.random.RandomState,
               np.random.BitGenerator, random.Random, io.IOBase)
#: Library modules whose functions answer anew on every call: random draws,
#: clocks, entropy, the environment (``random.random`` is also a method of
#: a generator, ``time.time`` a function of ``time``).
DRAWING_MODULES = ("numpy.random", "scipy.stats", "random", "time",
                   "datetime", "uuid", "secrets", "os", "resource",
                   "importlib")
#: Functions of otherwise steady modules that read live interpreter state
#: (not the thread's identity: ``dataclasses``' ``__repr__`` reads it).
LIVE_STATE_FUNCTIONS = frozenset({
    sys.getrefcount, sys.getallocatedblocks, gc.get_count, gc.get_stats,
    gc.get_objects,
    # the running frames: a trace reading its caller's locals
    sys._getframe, inspect.currentframe, inspect.stack, inspect.trace,
    traceback.extract_stack, traceback.format_stack, traceback.walk_stack})
#: Builtins a trace calls for what they do or read outside the process's
#: values: a file's contents, the terminal, a debugger. Stock calls them on
#: every trace; a hit that skips the trace would not.
TRACE_EFFECTS = frozenset({print, open, input, breakpoint, io.open, np.info})
#: The types of those functions.
_EFFECT_FUNCTION_TYPES = frozenset(
    map(type, LIVE_STATE_FUNCTIONS | TRACE_EFFECTS))


def _draws(v) -> bool:
  # an iterator of a plain class is keyed by its attributes, which a draw
  # changes; a generator's or a C iterator's state is unreadable
  # (by its type: ``isinstance`` would ask the object's ``__class__``,
  # which its own ``__getattribute__`` may answer with anything)
  t = type(v)
  return issubclass(t, DRAWN_TYPES) or (
      hasattr(t, "__next__") and not is_plain_type(t))


#: Library modules whose functions a trace calls for their effect: a log
#: record, a warning, printed text (stock makes it at every trace; a hit
#: would not).
EFFECT_MODULES = ("logging", "warnings", "_warnings", "pprint")
#: Library modules whose answers read the calling thread's state, which no
#: key holds: the decimal context (precision, rounding, traps); jaxtyping's
#: dimension memo (``isinstance(x, Float[Array, "b d"])`` checks ``b``
#: against what an enclosing ``@jaxtyped`` function bound on this thread).
THREAD_STATE_MODULES = ("decimal", "_decimal", "_pydecimal", "jaxtyping")
_UNKEYED_MODULES = frozenset(DRAWING_MODULES + EFFECT_MODULES
                             + THREAD_STATE_MODULES)
_UNKEYED_PREFIXES = tuple(m + "." for m in _UNKEYED_MODULES)


def _drawing_module(v) -> bool:
  """A module of ``DRAWING_MODULES``, ``EFFECT_MODULES`` or
  ``THREAD_STATE_MODULES``, or a callable defined in one."""
  if type(v) is types.ModuleType:
    name = v.__name__
  elif callable(v):
    name = getattr(v, "__module__", None)
  else:
    return False
  return isinstance(name, str) and (
      name in _UNKEYED_MODULES or name.startswith(_UNKEYED_PREFIXES))


_BOUND_METHOD_TYPES = frozenset({
    types.MethodType, types.BuiltinMethodType, types.MethodWrapperType})


def drawn_from(v) -> bool:
  """Whether reading or calling ``v`` in a trace may give a new value each
  time (a random generator or a method of one, an iterator, a file, a
  function of a drawing module, such as a clock): stock reads it again for
  every closure it traces, so a key holding ``v`` would answer later
  closures with an earlier value."""
  # a bound method's owner (read from method types only: an object's own
  # __getattr__ would run, and may raise, for a name stock never reads)
  owner = v.__self__ if type(v) in _BOUND_METHOD_TYPES else None
  if (_draws(v) or _drawing_module(v)
      or (owner is not None and (_draws(owner) or _drawing_module(owner)))):
    return True
  if v is sys.modules:   # modules looked up by name: what they hold is unkeyed
    return True
  if _compat.live_setting(v):   # JAX's config: its settings now, or a write
    return True
  if isinstance(v, contextvars.ContextVar) or isinstance(
      owner, contextvars.ContextVar):
    return True   # its value is the running context's, read by get()
  if type(v) not in _EFFECT_FUNCTION_TYPES:
    return False   # (a user's object's __hash__ is never called here)
  return v in LIVE_STATE_FUNCTIONS or v in TRACE_EFFECTS


#: Builtins that read globals by a name the code computes (the closure
#: key's): what they reach is in no key.
DYNAMIC_READS = _key.DYNAMIC_READS
#: Attributes whose values no key holds, wherever a code reads them: a
#: class's live subclasses, its ``case C(...)`` pattern's
#: ``__match_args__``, a frame's or a traceback's view of the running code.
UNKEYED_ATTRIBUTES = frozenset({
    "__subclasses__", "__match_args__", "f_back", "f_locals", "f_globals",
    "tb_frame", "gi_frame", "cr_frame"})
#: Attributes no key holds where a code's attribute chain reads them from
#: a global or a cell (``helper.__qualname__``): a function's metadata set
#: after it was made, a dataclass's field objects. (A class's own
#: ``__qualname__`` is keyed with it; a dataclass's ``__repr__`` reads it.)
UNKEYED_CHAIN_ATTRIBUTES = frozenset({
    "__qualname__", "__module__", "__doc__", "__annotations__",
    "__wrapped__", "__dataclass_fields__"})


def unkeyed_reads(plan) -> set:
  """The attributes of :data:`UNKEYED_ATTRIBUTES` a code plan reads, and
  of :data:`UNKEYED_CHAIN_ATTRIBUTES` its chains read."""
  found = set(plan.attributes & UNKEYED_ATTRIBUTES)
  for _, _, attributes in plan.chains:
    found.update(UNKEYED_CHAIN_ATTRIBUTES.intersection(attributes))
  return found


#: Builtins that read attributes so: a module's attributes are keyed only
#: as its code names them (an object's are keyed whole).
ATTRIBUTE_READS = frozenset({"getattr", "hasattr", "vars", "dir"})


def dynamic_reads(f, global_names) -> str:
  """The builtins by which ``f`` reads globals by computed names
  (``globals()[n]``, ``eval``), or a user module's attributes so
  (``getattr(cfg, n)``), comma-separated; empty if none."""
  names = set(global_names)
  why = names & DYNAMIC_READS
  if not why and names & ATTRIBUTE_READS:
    reached = [f.__globals__.get(n) for n in global_names]
    reached += [c.cell_contents for c in f.__closure__ or ()
                if _key.cell_filled(c)]
    if any(type(m) is types.ModuleType and not stable_module(m.__name__)
           for m in reached):
      why = names & ATTRIBUTE_READS
  return ", ".join(sorted(why))


def chain_draws(f, kind: str, name: str, attributes: tuple) -> str | None:
  """Whether an attribute chain ``f`` reads from a library module or class
  (``np.random.normal``, ``time.time``) passes through or reaches what
  :func:`drawn_from` refuses; the walk keys such modules by identity, and
  never follows their chains otherwise. ``"setting"`` where what it reads
  is a JAX setting no jit key holds (``_config_read_draws``), ``"draw"``
  for anything else refused, None where nothing is."""
  obj = chain_base(f, kind, name)
  if _compat.config_namespace(obj):
    return _config_read_draws(f, obj, attributes)
  if obj is builtins and not _compat.library_code(f.__code__):
    return "draw"   # ``builtins.X``: a name the user may bind there
  if not isinstance(obj, (types.ModuleType, type)):
    return None   # an object: walked by value, refused there if drawn from
  if drawn_from(obj):
    return _drawn_kind(obj)
  for i, attribute in enumerate(attributes):
    if not isinstance(obj, (types.ModuleType, type)):
      return None   # past the namespaces: the value reached is walked
    try:
      obj = namespace_attribute(obj, attribute)
    except closure_key.Unkeyable:
      raise
    except Exception:
      return None
    if _compat.config_namespace(obj):
      return _config_read_draws(f, obj, attributes[i + 1:])
    if drawn_from(obj):
      return _drawn_kind(obj)
  return None


def _drawn_kind(obj) -> str:
  return "setting" if _compat.live_setting(obj) else "draw"


def _config_read_draws(f, config, attributes: tuple) -> str | None:
  """Whether ``f``'s chain reading ``attributes`` of ``config``
  (``jax.config``, or the module defining it) reads what no key holds:
  anything but a setting of JAX's trace context, which JAX's jit key holds
  (``jax.config.jax_enable_x64``); ``update`` writes. JAX's own code (a
  wrapper of a user's function: ``vmap``'s reads ``config.
  mutable_array_checks``) is trusted as JAX's jit trusts it; a write it
  made would be seen (``closure_cache.UnwatchedEffects``)."""
  if _compat.library_code(f.__code__) or (
      attributes and _compat.keyed_setting(config, attributes[0])):
    return None
  return "setting"


#: Packages whose objects the walk keeps by identity when it cannot read
#: them (their arrays guarded): jax's and numpy's own (devices, registries,
#: stock jitted functions, config states, ufuncs) and this package's (its C
#: ``jit``). Any other object whose state the walk cannot read is stock's.
IDENTITY_PACKAGES = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes",
                               "jax_closure_cache"})
#: Standard-library types kept so: sentinels, locks, operator's getters and
#: a NamedTuple's field getters, whose state no trace reads as a value or
#: which never change.
IDENTITY_TYPES = frozenset({object, type(NotImplemented),
                            type(threading.Lock()), type(threading.RLock()),
                            operator.itemgetter, operator.attrgetter,
                            operator.methodcaller,
                            type(collections.namedtuple("_Pair", "a").a)})


def kept_as_library_object(t: type) -> bool:
  """Whether an instance of ``t`` (hashed by identity, its state unreadable
  to the walk) is kept by identity: a ``threading.local`` or a
  ``decimal.Context`` is not (a trace reads attributes that change)."""
  module = getattr(t, "__module__", None) or ""
  return t in IDENTITY_TYPES or (
      module.partition(".")[0] in IDENTITY_PACKAGES and library_class(t))


# -- static values ------------------------------------------------------------

def _incomparable(values, others) -> ValueError:
  """Stock's error for static values whose ``==`` raised: its cache's
  ``ValueError``, naming the two values' types and the error raised."""
  pairs = list(zip(values, others))
  while pairs:
    a, b = pairs.pop(0)
    if type(a) is tuple and type(b) is tuple and len(a) == len(b):
      pairs[:0] = zip(a, b)   # (the values themselves, not their holders)
      continue
    try:
      bool(a == b)   # as the comparison of the tuples reads it
    except Exception:   # noqa: BLE001
      return ValueError(
          "static arguments should be comparable using __eq__.The following "
          "error was raised when comparing two objects of types "
          f"{type(a)} and {type(b)}. The error was:\n"
          + traceback.format_exc().rstrip("\n"))
  return ValueError("static arguments should be comparable using __eq__")


class Static:
  """Values a caller holds static (a launcher's loop bounds, a jitted
  function's non-function static arguments), keyed by value and exact
  top-level types: they are how a stock function is called, not values a
  closure reads. ``value`` is the tuple given; ``ident_hash`` and then
  ``ident`` what two are compared by (a matcher compares them directly)."""
  __slots__ = ("value", "ident", "ident_hash")

  def __init__(self, *value):
    self.value = value
    # each value's type, and each item's of a tuple of them (a jit's plain
    # static arguments, which stock compares by type and ==: IntEnum 1 and
    # float32 1.0 are two traces)
    kinds = tuple(map(type, value))
    if tuple in kinds:
      kinds = tuple([(tuple, tuple(map(type, v))) if type(v) is tuple
                     else type(v) for v in value])
    self.ident = kinds, value
    try:
      self.ident_hash = hash(self.ident)
    except TypeError:   # stock's jit raises for it; never stored
      self.ident_hash = None

  def __eq__(self, other):
    # as stock's cache finds a static argument: equal hashes, then ==
    # (a class whose == ignores what its hash reads is two traces there)
    if type(other) is not Static or self.ident_hash != other.ident_hash:
      return False
    try:
      return self.ident == other.ident
    except Exception:   # noqa: BLE001 -- raised as stock's cache raises it
      raise _incomparable(self.value, other.value) from None

  def __hash__(self):
    if self.ident_hash is None:
      raise TypeError(f"unhashable static value in {self.value!r:.60}")
    return self.ident_hash

  def __repr__(self):
    return f"Static{self.value!r}"

  @staticmethod
  def of(*value) -> "Static":
    """``Static(*value)``, made once for values that are all Python ints,
    bools and None (whose ``==`` is exact within one type): a Static is
    immutable, and a launcher makes one per call."""
    kinds = tuple(map(type, value))
    if not _MEMO_TYPES.issuperset(kinds):
      return Static(*value)   # no hash or == of anything else is run here
    typed = kinds, value
    found = _statics.get(typed)
    return found if found is not None else _memo(_statics, typed, value)

  @staticmethod
  def of_ints(*value) -> "Static":
    """``Static.of(*value)`` for values the caller knows are exact Python
    ints or None (a loop's bounds), looked up by the values alone: with no
    bool among them, equal values are of equal types."""
    found = _int_statics.get(value)
    return found if found is not None else _memo(_int_statics, value, value)


def exactly(key, *value) -> Static:
  """``Static(*value)``, made once per ``key``, which the caller makes of
  the values' exact types and bits (``atoms.exact_key``): a launcher's
  parameters that are not all ints, bools and None (a solver's
  tolerances), whose Static its every call would make anew."""
  found = _exact_statics.get(key)
  return found if found is not None else _memo(_exact_statics, key, value)


def _memo(table: dict, key, value: tuple) -> Static:
  """``Static(*value)``, kept in ``table`` under ``key`` (a table of at most
  1024, emptied when full): the miss of ``Static.of`` and ``of_ints``."""
  if len(table) >= 1024:
    table.clear()
  found = table[key] = Static(*value)
  return found


# (the values' types, the values) -> their Static (``Static.of``)
_statics: dict = cache.STORE.table("values.statics", cache.Store.CALLS)
# values of exact ints and None -> their Static (``Static.of_ints``)
_int_statics: dict = cache.STORE.table("values.int_statics",
                                       cache.Store.CALLS)
# a caller's exact key of its values -> their Static (``exactly``)
_exact_statics: dict = cache.STORE.table("values.exact_statics",
                                         cache.Store.CALLS)
_MEMO_TYPES = frozenset({int, bool, type(None)})


# -- initial guesses of zeros ---------------------------------------------------

#: Arrays of at most this many bytes are kept by :func:`zeros_like`, at
#: most this many of them (256 KiB in all).
ZEROS_KEPT_BYTES, ZEROS_KEPT = 1 << 12, 64


def zeros_like(x):
  """``jnp.zeros_like(x)`` as stock computes it eagerly, the one array kept
  per exact kind of a jax array ``x`` of up to ``ZEROS_KEPT_BYTES`` (its
  shape, dtype, weak type, sharding and commitment, and for an uncommitted
  one the default device it goes to; outside any mesh block;
  ``ZEROS_KEPT`` kinds, emptied by ``clear()``): an eager solver's initial
  guess, which it closes over and never hands out. None for anything
  else, whose zeros only stock makes."""
  if type(x) is not _compat.ArrayImpl or not _compat.no_mesh_context():
    return None
  committed = _compat.is_committed(x)
  kind = (x.shape, x.dtype, x.weak_type, x.sharding, committed,
          None if committed else _compat.DEFAULT_DEVICE.value)
  try:
    found = _zeros.get(kind)
  except TypeError:   # an unhashable sharding
    return None
  if found is None or found.is_deleted():   # (deleted: by a user, in a trace)
    if x.nbytes > ZEROS_KEPT_BYTES:   # (only small kinds are ever found)
      return None
    found = _compat.jax.numpy.zeros_like(x)
    if len(_zeros) >= ZEROS_KEPT:
      _zeros.clear()
    _zeros[kind] = found
  return found


# (shape, dtype, ...) -> the zeros stock's ``zeros_like`` made for it
_zeros: dict = cache.STORE.table("values.zeros", cache.Store.CALLS)


# -- callable wrappers that the walk sees through ---------------------------

#: The wrapper rules, by class: the closure key's registry.
# The upstream-shaped module's registries, held by the package's store too
wrapper_rules = cache.STORE.own("closure_key.WRAPPERS", _key.WRAPPERS,
                                cache.Store.REGISTRY)
cache.STORE.own("closure_key.active_rules", _key.active_rules,
                cache.Store.REGISTRY)
# which globals a code reads: read off code objects alone, weakly keyed
cache.STORE.own("closure_key.code_names", _key.code_names, cache.Store.FACTS)


def register_wrapper(cls: type, split, join, label: str | None = None) -> None:
  """Key instances of ``cls`` by a static part plus the values they wrap:
  the closure key's ``register_wrapper``, whose walk and rebuild both use
  it, and whose ``label`` explanations name the static part by. The
  package's own ``jit`` wrapper and jaxprs (``jaxpr_key``) register here."""
  global _wrapper_types
  _key.register_wrapper(cls, split, join, label)
  _wrapper_types = tuple(wrapper_rules)


def unregister_wrapper(cls: type) -> None:
  """Undo :func:`register_wrapper` for ``cls``."""
  global _wrapper_types
  wrapper_rules.pop(cls, None)
  _wrapper_types = tuple(wrapper_rules)


_wrapper_types: tuple = ()   # the registered classes (their subclasses too)


def fresh_function(x, depth: int = 4):
  """``x``, or the first item of a tuple in it, that is a function whose
  identity is fresh per call (a closure or user function, a partial, a
  bound method, a registered wrapper, a callable object); else None."""
  t = type(x)
  if t is _FunctionType:
    return x if x.__closure__ is not None or not is_stable(x) else None
  if (t is functools.partial or t is types.MethodType
      or isinstance(x, _wrapper_types) or as_method(x) is not None):
    return x
  if depth > 0 and isinstance(x, tuple):
    for y in x:
      found = fresh_function(y, depth - 1)
      if found is not None:
        return found
  return None


def node_data_function(treedef):
  """The first such function a custom node of ``treedef`` carries in its
  node data (a pytree class keeping ``apply=model.apply`` as aux data), or
  None. Its hash is then the function's identity, new per call, so the
  tree is keyed node by node instead. A node whose children are all leaves
  is not descended into, so a dict of arrays costs one look."""
  for data in node_datas(treedef):
    if data[0] not in BUILTIN_NODES:
      found = fresh_function(data[1])
      if found is not None:
        return found
  return None


def node_datas(treedef):
  """Each node's ``(type, node data)`` of ``treedef``, leaves aside; the
  children of a node whose children are all leaves are not visited."""
  pending = [treedef]
  while pending:
    t = pending.pop()
    data = t.node_data()
    if data is None:
      continue
    yield data
    if t.num_nodes != t.num_leaves + 1:
      pending.extend(t.children())
