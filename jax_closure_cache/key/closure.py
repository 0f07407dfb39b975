"""The closure key: what a call of a callable reads, walked once into a
hashable key and the arrays it lifts.

This is the first of the closure key's modules: the walk and the key.
``rebuild`` puts new values (tracers, at trace time) in the lifted
positions, ``matchers`` generates the hot path's per-key matchers, and
``guards`` finds and checks where a captured array came from.

``analyse(fun)`` walks everything a call of ``fun`` reads without going through
its arguments: closure cells, defaults and keyword defaults, the globals its
code (and its nested code) reads by name, a ``functools.partial``'s function,
arguments and keywords, a bound method's function and ``self``. It returns an
:class:`Analysis` whose fields obey these invariants:

* ``key`` is hashable and holds no array and no tracer. Two callables with
  equal keys, called with their own ``leaves`` passed as arguments, trace to
  the same jaxpr.
* ``leaves`` are the lifted arrays, in walk order, each object once; ``key``
  records where each one sits (:data:`LIFTED`, and ``(ALIAS, i)`` where
  leaf ``i`` is met again) but not its value, shape or dtype (the shared
  jitted function keys those itself, as it keys any argument).
* ``anchors`` are the objects whose ``id`` is part of ``key``. Whoever stores
  ``key`` must drop it when one dies (the jit layer holds them weakly), so no
  ``id`` in a stored key can be reused.
* ``roots`` are objects kept by identity whose contents the key does not
  cover (opaque objects). An array a trace captures must be found under one
  of them (a guard), or the entry is dropped.

A tracer anywhere in the walked values raises :class:`Uncacheable`, as does a
value that is neither hashable nor a pytree.

Example::

    >>> import jax.numpy as jnp
    >>> def make(w):
    ...   return lambda x: x @ w
    >>> a, b = analyse(make(jnp.ones(2))), analyse(make(jnp.zeros(2)))
    >>> a.key == b.key, len(a.leaves)
    (True, 1)
"""

from __future__ import annotations

import builtins
import collections
import enum
import functools
import gc
import types
import weakref
from typing import Callable

import jax
import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache import atoms
from jax_closure_cache import cache
from jax_closure_cache.key import closure_key
from jax_closure_cache.key.values import (
    Static, chain_draws, drawn_from, dynamic_reads, kept_as_library_object,
    node_data_function, node_datas, unkeyed_reads, wrapper_rules)
from jax_closure_cache.key import names as key_names
from jax_closure_cache.key import trees
from jax_closure_cache.key.objects import (
    SKIP, as_method, class_member, contents, is_copyable_type, is_plain_type,
    slot_members, slot_values)
from jax_closure_cache.key.code_plan import (
    chain_value, code_plan, is_stable, library_class, library_value,
    own_module_level, stable_module, user_function)
from jax_closure_cache.key.parts import (
    ATOMS, BUILTIN_NODES, CLASS, COPY, LIBATTR, METHOD, MISSING,
    NOCHAIN, OBJ,
    TREE, TREEAUX, TREEDEF, Tag, Uncacheable, float_key)

# built-in value types a user class may subclass (``class Tagged(int)``),
# each with how its own methods read an instance's value
_VALUE_BASES = types.MappingProxyType({
    int: int.__int__, float: float.__float__,
    complex: lambda v: complex(complex.real.__get__(v),
                               complex.imag.__get__(v)),
    str: str.__str__, bytes: lambda v: bytes.__getitem__(v, slice(None)),
    tuple: lambda v: tuple(tuple.__iter__(v)),
    frozenset: lambda v: frozenset(frozenset.__iter__(v))})

#: Plain objects are keyed by their attributes down to this many nested
#: plain objects, and over at most this many attribute values in all; past
#: either budget an object is kept by identity.
OBJECT_DEPTH_BUDGET = 3
OBJECT_VALUES_BUDGET = 256
#: At most this many functions are walked for one key (helpers reached
#: through globals, nested closures); past it the function is stock's.
FUNCTION_BUDGET = 128

_key = closure_key
_tree_flatten = jax.tree_util.tree_flatten
_PyTreeDef = jax.tree_util.PyTreeDef
_tree_unflatten = jax.tree_util.tree_unflatten
_ArrayImpl = _compat.ArrayImpl
_Tracer = _compat.Tracer
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType


class Analysis(_key.Walk):
  """The closure key's walk with the package's rules: ``key``, ``leaves``,
  ``anchors`` and ``roots`` are the results (see the module docstring).
  What it adds to JAX's walk, each in the step it overrides: arrays inside
  objects kept by identity (``array``), modules read through attribute
  chains (``module``, ``reads``), classes by namespace, plain objects by
  attributes, bound methods, sets, registered pytrees and hashable values
  (``other``), functions in pytree node data (``tree_parts``), refusals of
  code that writes its cells or globals (``cells``, ``reads``), and a
  budget of functions (``enter``)."""
  __slots__ = ("key", "roots", "lift_numpy", "in_object", "nesting",
               "budget_values", "depth", "custom_rules", "tracer_class")

  def __init__(self, lift_numpy: bool = False, lift_arrays: bool = True):
    super().__init__()
    self.roots: list = []
    self.lift_numpy = lift_numpy
    # Inside a plain object (or with lifting off) arrays are kept by identity.
    self.in_object = not lift_arrays
    self.nesting = 0   # plain objects being walked, one inside another
    self.custom_rules: list = []   # (class, items) of custom_jvp/custom_vjp
    self.tracer_class = None   # a tracer class the code reads (``finish``)

  stable = staticmethod(lambda f, module=None: is_stable(f))
  # a static argument as a dict key is keyed: atoms by exact type and bits,
  # values of jax, numpy and the standard library as they compare
  static_key = staticmethod(trees.key_atom)
  global_names = staticmethod(lambda code: code_plan(code).global_names)

  def identity(self, v, root: bool = False):
    if root:
      self.roots.append(v)
    return super().identity(v)

  def array(self, v):
    if self.in_object:   # inside an object it cannot copy: by identity
      return self.identity(v)
    return super().array(v)

  def module(self, v):
    if v is builtins:   # ``getattr(builtins, "print")``: by computed name
      raise Uncacheable("trace_effect", "reads the builtins module, whose "
                        "print, open and input a trace may call")
    return v   # what code reads of it is keyed by its attribute chains

  def other(self, v, t):
    if t is Tag:
      return v
    if t is Static:   # a launcher's or jit's static parameters, as stock
      return (Static, v)   # keys them (a simple part: matched by ==)
    part = self.foreign_array(v, t)
    if part is not None:
      return part
    if t is complex:   # by its parts' bits (a repr prints every NaN as nan)
      return (complex, (float_key(v.real), float_key(v.imag)))
    if t is set or t is frozenset:
      # its elements by exact type and bits, in the order a trace iterates
      # them (two equal sets may iterate differently)
      return (t, tuple([trees.key_atom(x) for x in v]))
    if t is bytearray:
      return (bytearray, bytes(v))
    if t is functools.partial:
      return self.partial(v)
    if t is types.MethodType:
      return (METHOD, self.value(v.__func__), self.value(v.__self__))
    if (t is types.BuiltinMethodType or t is types.MethodWrapperType) and (
        isinstance(v.__self__, _MUTABLE_OWNERS)):
      raise Uncacheable("trace_effect", f"holds {v.__qualname__} of a "
                        f"{type(v.__self__).__name__}: a trace calling it "
                        "may write to it, a write a hit would skip")
    if t is weakref.ReferenceType:
      return self.weakref(v)
    if t is _PyTreeDef and node_data_function(v) is not None:
      return (TREEDEF, self.node_parts(v))   # split from its leaves
    rule = wrapper_rules.get(t)
    if rule is None and "__keyed_as__" in t.__dict__:
      # a class keyed as a registered wrapper class it says it is (a fast
      # front's generated class, keyed as the wrapper class it extends);
      # read from the class's own namespace, never inherited
      t = t.__dict__["__keyed_as__"]
      rule = wrapper_rules[t]
    if rule is not None:
      return self.wrapper(v, t, rule)
    if t is type or isinstance(v, type):
      # a user class by its namespace (a trace may instantiate it and call
      # its methods); jax's, numpy's, the standard library's by identity;
      # one of a module whose answers read live state (jaxtyping's
      # ``Float[...]``, whose ``isinstance`` reads the thread's dimension
      # memo) is refused as a drawing module's function is
      if drawn_from(v):
        raise Uncacheable("drawn_state", f"a trace reads {v!r:.60}, whose "
                          "answers read state no key holds (stock reads it "
                          "again)")
      self.note_tracer_class(v)
      k = self.klass(v)
      if k is not v or t is type:
        return k
      return self.identity(v)
    return self.opaque(v, t)

  def opaque(self, v, t):
    """A registered pytree by its parts, a Python object by its state (its
    attributes or slots, whatever its ``__eq__``), a value type written in C
    by value, a library object by identity; anything else is refused."""
    if drawn_from(v):
      raise Uncacheable("drawn_state", (
          f"a trace reads {v!r:.60}, JAX's config or a setting no jit key "
          "holds (stock's trace reads it anew; read one setting by "
          "jax.config.<name>, which is keyed where JAX's jit key holds it)")
          if _compat.live_setting(v) else (
          f"a trace draws from {v!r:.60}, which gives a new value each time "
          "(stock draws again)"))
    try:
      leaves, treedef = _tree_flatten(v)
    except Exception as e:  # a custom flatten that fails: key it otherwise
      raise Uncacheable("unhashable", f"flattening {t.__name__} raised {e!r}")
    if not (len(leaves) == 1 and leaves[0] is v):
      if not self.flatten_covers(v, t, treedef):
        return self.state_object(v, t)   # nested ones: ``trees.layout``
      return self.tree_parts(leaves, treedef, trees.layout(v, treedef))
    h = t.__hash__
    if (h is not None and h is not object.__hash__
        and not _user_equality(t)):
      try:   # a library value type (a date, a Signature): by value
        hash(v)
      except Exception:   # unhashable (a writable memoryview raises
        pass              # ValueError)
      else:   # a user subclass (an Enum) with its class's namespace
        if library_class(t):
          try:
            return atoms.library_value_key(v, t)
          except atoms.Inexact as e:
            raise Uncacheable("user_equality", str(e)) from None
        if not isinstance(v, enum.Enum):
          base = next((b for b in _VALUE_BASES if isinstance(v, b)), None)
          if base is not None:
            return (t, self.value_subclass(v, t, base), self.klass(t))
        elif not trees.enum_member_has_state(v):
          return (t, v, self.klass(t))
        else:   # ``Mode.A.scale = 5.0``: state its == does not compare
          raise Uncacheable("user_equality", f"{t.__name__} member "
                            f"{v.name} has attributes of its own")
        return (t, v, self.klass(t))
    return self.state_object(v, t)

  @staticmethod
  def value_subclass(v, t, base):
    """A user subclass of a built-in value type (``class Tagged(int)``):
    its value as the base type's, by exact bits (``==`` takes ``0.0`` for
    ``-0.0``); refused where the instance keeps state of its own."""
    if getattr(v, "__dict__", None) or slot_members(t):
      raise Uncacheable("user_equality", f"a {t.__name__} (a {base.__name__} "
                        "subclass) keeps state of its own beside its value")
    # the value as the base type's own methods read it (a subclass's
    # ``__str__``, ``__int__`` or ``__iter__`` may say something else)
    return trees.key_atom(_VALUE_BASES[base](v))

  @staticmethod
  def flatten_covers(v, t, treedef) -> bool:
    """Whether a pytree node's flatten carries its whole state (see
    ``trees.covers_state``): always for dicts, lists, tuples and
    NamedTuples; a custom node only if each attribute is flattened as it
    is (never for one whose node data is itself, ``register_static``)."""
    if t in BUILTIN_NODES or t in _ORDERED_NODES or (
        isinstance(v, tuple) and hasattr(t, "_fields")):
      return True
    data = treedef.node_data()
    return data[1] is not v and trees.covers_state(v)

  def state_object(self, v, t):
    """A Python object by its state, a library object by identity, or a
    refusal (see ``opaque``)."""
    h = t.__hash__
    # A user class's own __eq__/__hash__ are never trusted (they may
    # compare a name only, or elementwise): its state is walked instead.
    if is_plain_type(t):
      return self.plain_object(v, t)
    members = slot_members(t)
    if members:   # state in __slots__: keyed by their values, not identity
      return self.plain_object(v, t, members)
    if h is not None and h is not object.__hash__:
      raise Uncacheable("user_equality", f"a {t.__name__} compares by its "
                        "own __eq__ and keeps state the key cannot read")
    if t is object:   # a bare sentinel (jax's ``no_axis_name``): no state
      return (LIBATTR, v)
    if h is object.__hash__ and kept_as_library_object(t):
      return self.identity(v, root=True)   # library state; arrays guarded
    if h is object.__hash__:
      # kept by identity, a change to its state would go unseen
      raise Uncacheable("opaque_object", f"a {t.__name__} keeps state the "
                        "key cannot read (a C base class, or a library "
                        "object not known to be read-only)")
    raise Uncacheable("unhashable", f"a {t.__name__} is unhashable, not a "
                      "pytree, and keeps state outside __dict__")

  def foreign_array(self, v, t):
    """The part of a tracer (refused), a jax array other than ``ArrayImpl``
    (lifted, or kept by identity), a NumPy array (keyed by value, or lifted)
    or a NumPy scalar; None for anything else."""
    if isinstance(v, _Tracer):
      raise Uncacheable("tracer", f"a {t.__name__} tracer is closed over")
    if isinstance(v, jax.Array):   # PRNG key arrays and other jax.Array types
      if self.in_object or getattr(v, _compat.COMMITTED, True):
        return self.identity(v)
      return self.lift(v)
    if isinstance(v, np.ndarray):
      if type(v) is not np.ndarray:
        # a masked array's mask, a matrix's algebra: not in its bytes
        raise Uncacheable("numpy_subclass", f"a {t.__name__} keeps state "
                          "the key of a NumPy array (dtype, shape, bytes) "
                          "does not cover")
      if self.in_object:   # baked: by its bytes, which a change in place
        # changes (an array of objects, a mesh's devices: by identity)
        return self.identity(v) if v.dtype.hasobject else self.numpy(v)
      if self.lift_numpy and not v.dtype.hasobject:
        return self.lift(v)
      return self.numpy(v)
    if isinstance(v, np.generic):
      return self.numpy_scalar(v)
    return None

  def numpy(self, v):
    """A NumPy array keyed by its bytes, which a trace must read too."""
    fresh_conversion(v)
    return _key.Walk.numpy(v)

  def tree(self, v):
    self.spend(len(v))   # a table too large to key, before flattening it
    try:
      leaves, treedef = _tree_flatten(v)
    except Exception as e:   # dict keys that do not sort
      raise Uncacheable("unhashable", f"flattening raised {e!r}") from e
    return self.tree_parts(leaves, treedef, trees.layout(v, treedef))

  def tree_parts(self, leaves, treedef, layout=()):
    """``(TREE, treedef, leaves' parts, layout)`` (``TreePart``);
    ``TREEAUX`` (``TreeAuxPart``) with the node parts first (the rebuild's
    order) where a node's data or class must be walked: a treedef compares
    node data with ``==``."""
    self.spend(len(leaves))
    value = self.value
    if not _walks_node_data(treedef):
      return (TREE, treedef, tuple([value(x) for x in leaves]), layout)
    parts = self.node_parts(treedef)   # walked first: the rebuild's order
    return (TREEAUX, parts, tuple([value(x) for x in leaves]), layout)

  def node_parts(self, treedef):
    """``(type, aux key, children's parts, class key)`` (``NodePart``) of
    each node of ``treedef`` (None for a leaf): a custom node's data walked
    like any value (a bound method by its function and ``self``), a
    built-in node's by value."""
    data = treedef.node_data()
    if data is None:
      return None
    t, aux = data
    if t in BUILTIN_NODES or t in _ORDERED_NODES:
      # dict keys: their order and exact types are in the layout
      aux_key, class_key = tuple(aux) if type(aux) is list else aux, None
      if t is collections.defaultdict:   # its factory: never lifted
        saved, self.in_object = self.in_object, True
        try:
          aux_key = (self.value(aux[0]), aux[1])
        finally:
          self.in_object = saved
    else:   # by value, never by ==; the class by its namespace
      aux_key = self.value(aux)
      class_key = self.klass(t)
    return (t, aux_key, tuple([self.node_parts(c)
                               for c in treedef.children()]), class_key)

  def enter(self, v):
    i = super().enter(v)
    if type(i) is not tuple and i > FUNCTION_BUDGET:
      name = getattr(v, "__qualname__", None) or type(v).__name__
      raise Uncacheable(
          "function_budget", f"more than {FUNCTION_BUDGET} functions and "
          f"objects are reachable through cells and globals (at {name}); a "
          "retrace could read any of them")
    return i

  def cells(self, f) -> tuple:
    written = code_plan(f.__code__).written_cells
    # (jax's own nested helpers keep bookkeeping in cells of a call that
    # has returned: nothing reads those after the trace)
    if (written and f.__closure__ is not None
        and not _compat.library_code(f.__code__)):
      # a trace-time write a hit would skip (a nonlocal trace counter)
      raise Uncacheable(
          "writes_cells", f"{f.__qualname__} assigns to the closed-over "
          f"variable {sorted(written)[0]!r} (nonlocal): stock's trace "
          "writes it, a hit would not")
    return super().cells(f)

  def reads(self, f) -> tuple[tuple, tuple]:
    plan = code_plan(f.__code__)
    g = f.__globals__
    value = self.value
    why = dynamic_reads(f, plan.global_names)
    if why:
      raise Uncacheable("dynamic_read", f"{f.__qualname__} calls {why}: what "
                        "it reads by a computed name is in no key")
    if plan.imports and not _compat.library_code(f.__code__):
      # (a global module's attributes are keyed by the chains its code
      # reads, and a library's compared by identity on every hit)
      raise Uncacheable("local_import", f"{f.__qualname__} imports "
                        f"{plan.imports[0] or 'from its package'} where it "
                        "runs: what it reads of that module is in no key")
    unkeyed = unkeyed_reads(plan)
    if unkeyed and not _compat.library_code(f.__code__):
      raise Uncacheable(
          "attributes", f"{f.__qualname__} reads "
          f"{', '.join(sorted(unkeyed))}, which no key holds (stock's "
          "trace reads it anew)")
    if plan.writes_globals and not _compat.library_code(f.__code__):
      raise Uncacheable(
          "writes_globals", f"{f.__qualname__} assigns to a global: stock's "
          "trace writes it, a hit would not")
    if _compat.library_code(f.__code__):
      value = self.library_global
    globs = tuple([(LIBATTR, g[n]) if n in g and self.config_by_chains(
                       g[n], plan, ("global", n)) else
                   value(g[n]) if n in g else self.builtin(f, n)
                   for n in plan.global_names])
    return globs, (tuple([self.chain(f, *c) for c in plan.chains])
                   if plan.chains else ())

  @staticmethod
  def config_by_chains(v, plan, place) -> bool:
    """Whether ``v`` is ``jax.config`` read only through attribute chains
    (``from jax import config``; ``config.jax_enable_x64``), each of which
    :meth:`chain` keys or refuses: then it is kept by identity
    (``LIBATTR``), a replacement seen. Read bare (``getattr(config, n)``,
    passed on), the walk refuses it (``values.drawn_from``)."""
    return v is _compat.JAX_CONFIG and place not in plan.bare

  def library_global(self, v):
    """A global that a function of jax's own code reads: a function of
    jax's own code there whose cells hold only the library's own constants
    (a module-level wrapper, such as an API function under jax's traceback
    filter) is kept by identity, as what a chain reads from a library
    module is (``LIBATTR``), so a replacement is seen; its globals are the
    library's own, as stock's trace cache, keyed on a function's identity,
    takes them. Anything else is walked (a wrapper of jax's around a user's
    function too)."""
    if (type(v) is _FunctionType and _compat.library_code(v.__code__)
        and all(map(_library_constant, v.__closure__ or ()))):
      return (LIBATTR, v)
    return self.value(v)

  @staticmethod
  def builtin(f, name: str):
    """A global name the module lacks: ``MISSING`` (a builtin, or a name
    not yet defined, as the matcher checks), or a refusal for a builtin a
    trace calls for its effect or what it reads (``print``, ``open``)."""
    if name in TRACE_EFFECT_NAMES:
      raise Uncacheable("trace_effect", f"{f.__qualname__} calls {name}(), "
                        "which stock's trace runs every time and a hit would "
                        "skip")
    if name in builtins.__dict__ and name not in _BUILTIN_NAMES:
      raise Uncacheable("dynamic_read", f"{f.__qualname__} reads {name}, "
                        "bound in builtins since this package was imported: "
                        "no key holds it")
    return MISSING

  @classmethod
  def difference(cls, a, b, path="") -> str:
    """Where keys ``a`` and ``b`` first differ (the closure key module's
    miss explanation, for JAX's ``pe.explain``), named as the package's own
    log names parts (``key/names.py``)."""
    diffs = key_names.differences(None, a, b)
    return diffs[0] if diffs else super().difference(a, b, path)

  def chain(self, f, kind, name, attributes):
    """The key of what an attribute chain reads (``Table.W``, ``mylib.W``,
    ``Cfg.table``): keyed like an object's attribute, so an array there is
    kept by identity (and such a function is stock's), never lifted."""
    obj = chain_value(f, kind, name, attributes)
    drawn = chain_draws(f, kind, name, attributes) if obj is NOCHAIN else None
    if drawn is not None:
      chain = f"{name}.{'.'.join(attributes)}"
      raise Uncacheable("drawn_state", (
          f"{f.__qualname__} reads {chain}, a JAX setting no jit key holds "
          "(stock's trace reads it anew, and a write through it changes "
          "it for what follows)") if drawn == "setting" else (
          f"{f.__qualname__} calls {chain}, which gives a new value each "
          "time (stock draws again)"))
    if obj is NOCHAIN:
      obj = library_value(f, kind, name, attributes)
      if obj is NOCHAIN or obj is MISSING:
        return obj
      if _library_object(obj):
        self.note_tracer_class(obj)
        return (LIBATTR, obj)   # checked by identity: a replacement is seen
    if obj is MISSING:
      return obj
    saved = self.in_object
    self.in_object = True
    try:
      return self.value(obj)
    finally:
      self.in_object = saved

  def plain_object(self, v, t, slots=None):
    i = self.enter(v)
    if type(i) is tuple:
      return i
    if slots is None:
      attrs, members = vars(v), contents(v)
    else:   # its slots, and its __dict__ if it has one
      attrs = {**getattr(v, "__dict__", {}), **slot_values(v, slots)}
      members = ()
    size = len(attrs) + len(members)
    if self.nesting == 0:   # a new outermost object gets fresh budgets
      self.budget_values = OBJECT_VALUES_BUDGET
      self.depth = OBJECT_DEPTH_BUDGET
    if self.depth <= 0 or size > self.budget_values:
      # kept by identity, a change to its attributes would go unseen
      raise Uncacheable(
          "object_budget", f"a {t.__name__} is too large to key by its "
          f"attributes (over {OBJECT_VALUES_BUDGET} values or "
          f"{OBJECT_DEPTH_BUDGET} nested objects)")
    saved = self.in_object, self.depth
    # An object the rebuild can copy keeps arrays lifted (the trace runs on
    # a shallow copy holding tracers); any other keeps them by identity.
    copyable = (slots is None and not self.in_object and not members
                and is_copyable_type(t))
    self.in_object = not copyable
    self.nesting += 1
    self.depth -= 1
    self.budget_values -= size   # shared by the whole outermost object
    try:
      value = self.value
      items = tuple([(k, value(x)) for k, x in attrs.items()])
      if members:
        items += (tuple([value(x) for x in members]),)
    finally:
      self.in_object, self.depth = saved
      self.nesting -= 1
    if t in _compat.CUSTOM_RULE_ATTRIBUTES:
      self.custom_rules.append((t, items))   # checked by :meth:`finish`
    return (COPY if copyable else OBJ, i, self.identity(t), items,
            self.klass(t))

  def note_tracer_class(self, v) -> None:
    if isinstance(v, type) and issubclass(v, _compat.Tracer):
      self.tracer_class = v

  def finish(self, key) -> None:
    """Refuse a key that lifts an array where its code reads a tracer class
    (``isinstance(w, jax.core.Tracer)``: a lifted array is a tracer, stock's
    closed-over array is not, and no trace shows the test), and a key whose
    custom differentiation rule (a ``custom_jvp``'s ``jvp``, a
    ``custom_vjp``'s ``fwd`` and ``bwd``) reaches a lifted array: JAX keeps
    the rule in the trace and runs it when it differentiates the trace, so
    a rule rebuilt for the lifted trace would run then with that trace's
    tracers."""
    if self.tracer_class is not None and self.leaves:
      raise Uncacheable(
          "tests_tracers", f"its code reads {self.tracer_class.__name__}, "
          "a class a lifted array is an instance of and stock's closed-over "
          "array is not")
    if not self.custom_rules:
      return
    r = _RuleReach(())
    r.find_leafy(key)
    for t, items in self.custom_rules:
      rules = _compat.CUSTOM_RULE_ATTRIBUTES[t]
      for name, part in items:
        if type(name) is str and name in rules and r.has_leaf(part):
          raise Uncacheable(
              "custom_rule_leaf", f"the {name} rule of a {t.__name__} reads "
              "a closed-over array, which the shared trace would hand it as "
              "a tracer of the trace")

  def klass(self, t):
    """A user class's namespace, as a plain object's key carries it: what
    its methods (walked like any function: their globals, cells, chains)
    and class attributes hold, through the MRO, since a retrace reads them
    through the instance (``self.k``, ``self.get()``), and its metaclass's
    (``type(self).scale``) and the flatten and unflatten functions it is
    registered with as a pytree (``_compat.pytree_node_functions``: a
    trace runs them on its values); a class of jax, numpy, the standard
    library or this package is keyed by identity."""
    if library_class(t) or own_module_level(t):
      return t
    i = self.enter(t)
    if type(i) is tuple:
      return i
    saved = self.in_object
    self.in_object = True   # arrays held by a class are kept by identity
    try:
      items = []
      for c in t.__mro__[:-1]:
        if library_class(c):
          continue
        for name, x in list(vars(c).items()):
          x = class_member(name, x)
          if x is not SKIP:
            items.append((c.__qualname__, name, self.value(x)))
      meta = type(t)
      if meta is not type and not library_class(meta):
        items.append(("", "<metaclass>", self.value(meta)))
      for f in _compat.pytree_node_functions(t) or ():
        items.append(("", "<pytree function>", self.value(f)))
    finally:
      self.in_object = saved
    # the class by identity, an anchor: a stored key holds it weakly, so a
    # class made per call dies with its functions (its entry with it)
    return (CLASS, i, self.identity(t), tuple(items))


#: Containers whose bound built-in methods (``append = LOG.append``) are
#: not keyed: the object the method writes to is not walked with it.
_MUTABLE_OWNERS = (list, dict, set, bytearray, collections.deque,
                   np.ndarray)

#: Builtins by name (read as globals the module lacks) whose call is an
#: effect or reads outside the process's values (``values.TRACE_EFFECTS``).
TRACE_EFFECT_NAMES = frozenset({"print", "open", "input", "breakpoint"})
#: The builtins' names when this module was imported (Python's own, and
#: those ``site`` or a shell adds at start-up); a name bound there later by
#: the user (``builtins.SCALE = 2.0``) is read by a trace and no key.
_BUILTIN_NAMES = frozenset(builtins.__dict__)

#: Nodes of the standard library whose node data is their keys (and a
#: defaultdict's factory), keyed by the layout.
_ORDERED_NODES = frozenset({collections.OrderedDict, collections.defaultdict})


#: What the rebuild keeps whole (arrays inside are kept by identity) and the
#: parts with a walk index, beside the closure key's functions.
REBUILD_KEPT = frozenset({OBJ})
REBUILD_INDEXED = frozenset({COPY, OBJ, CLASS})


class _RuleReach(_key.Rebuild):
  """The rebuild's rules of which parts reach a leaf (no rebuild made)."""
  KEPT_PARTS = REBUILD_KEPT
  INDEXED_PARTS = _key.Rebuild.INDEXED_PARTS | REBUILD_INDEXED


def fresh_conversion(arr) -> None:
  """Make a trace read ``arr``'s values: JAX converts a NumPy array of a
  64-bit dtype once and hands a trace that copy while anything holds it
  (``_compat.stale_conversion``), so after ``arr`` changed in place a trace
  would bake its old values where stock's, with nothing of the package
  holding the copy, reads the new ones. The package's entries that may hold
  it are released (stock keeps no such entries); where the copy is still
  held, by the user's own objects, stock's trace is stale too and answers
  (``Uncacheable``: an entry would keep the stale values past the user's)."""
  stale = _compat.stale_conversion(arr)
  if stale is None:
    return
  if not _compat.stale_conversion_kept(arr, stale):
    del stale
    cache.release_traces()
    stale = _compat.stale_conversion(arr)
    if stale is not None:
      del stale
      gc.collect()   # a jaxpr in a reference cycle
      stale = _compat.stale_conversion(arr)
    if stale is None:
      return
    _compat.note_stale_conversion_kept(arr, stale)
  raise Uncacheable("stale_numpy", "a NumPy array changed in place since "
                    "JAX converted it for a trace whose jaxpr is still alive: "
                    "stock traces it with that conversion")


def _walks_node_data(treedef) -> bool:
  """Whether a node of ``treedef`` is neither a dict, list, tuple or None
  nor a library's NamedTuple (:func:`library_class`: its class is keyed by
  identity): its node data (or a NamedTuple class's namespace) is then
  walked."""
  if node_data_function(treedef) is not None:
    return True
  return any(
      kind not in BUILTIN_NODES and kind not in _ORDERED_NODES and not (
          aux is None and hasattr(kind, "_fields") and library_class(kind))
      for kind, aux in node_datas(treedef))


def _library_object(obj) -> bool:
  """Whether an attribute of a library module is the library's own (a
  module, class, C function or jitted wrapper of jax, numpy or the standard
  library, or a function whose code was loaded from jax's or numpy's
  folder), kept by identity; anything else there (a user's replacement) is
  walked as any value. A function's ``__module__`` is not trusted."""
  if type(obj) is _FunctionType:
    return _compat.library_code(obj.__code__) or (
        obj.__closure__ is None and _compat.stdlib_code(obj.__code__))
  if type(obj) is _ModuleType:
    return stable_module(obj.__name__)
  return library_class(obj if isinstance(obj, type) else type(obj))


#: What a library function's cell may hold for it to be kept by identity
#: (``Analysis.library_global``): immutable atoms, and the library's own
#: closure-free functions, C functions, classes and modules.
_CONSTANT_ATOMS = ATOMS | {float}


def _library_constant(cell) -> bool:
  try:
    x = cell.cell_contents
  except ValueError:   # an empty cell
    return False
  t = type(x)
  if t in _CONSTANT_ATOMS:
    return True
  if t is _FunctionType:
    return x.__closure__ is None and _compat.library_code(x.__code__)
  if t is types.BuiltinFunctionType or t is _ModuleType or t is type:
    return _library_object(x)
  return False


def _user_equality(t: type) -> bool:
  """Whether ``t``'s ``__eq__`` or ``__hash__`` is written in Python
  outside the stable packages (jax, numpy, the standard library...)."""
  for name in ("__eq__", "__hash__"):
    owner = next((c for c in t.__mro__ if name in c.__dict__), object)
    if _python_function(owner.__dict__.get(name)) and not library_class(
        owner):
      return True
  return False


def _python_function(f) -> bool:
  return isinstance(f, types.FunctionType)


def analyse(fun: Callable, lift_numpy: bool = False,
            lift_arrays: bool = True) -> Analysis:
  """Key, lifted leaves, anchors and guard roots of ``fun`` (see module doc).

  With ``lift_arrays=False`` every array is keyed by identity and left in
  place, as inside a plain object.

  Raises:
    Uncacheable: ``fun`` closes over a tracer, or over a value that is
      neither hashable nor a pytree, or reading what it holds raised (a
      class attribute that raises when read: ``walk_error``, the call is
      stock's).
    TypeError: unhashable pytree metadata.
  """
  a = Analysis(lift_numpy, lift_arrays)
  try:
    if type(fun) is _FunctionType:
      a.key = a.function(fun)   # by contents even at module level
    else:
      a.key = a.value(as_method(fun) or fun)
  except (Uncacheable, TypeError):
    raise
  except Exception as e:   # the walk never fails a call stock makes
    raise Uncacheable("walk_error", f"reading what it holds raised "
                      f"{type(e).__name__}: {e}"[:200]) from None
  a.finish(a.key)
  return a


# -- the classes of a call's arguments -----------------------------------------

def argument_classes(treedef) -> tuple:
  """The classes of ``treedef``'s nodes (a call's arguments) whose code a
  trace may run and the key does not cover: every node class but a dict,
  list, tuple or None, an ordered or default dict, and a class of jax,
  numpy or the standard library. JAX's own cache keys them by identity; a
  method or ``tree_unflatten`` of theirs runs in the trace."""
  found = []
  for kind, _ in node_datas(treedef):
    if (kind not in BUILTIN_NODES and kind not in _ORDERED_NODES
        and kind not in found
        and (not library_class(kind) or _registered_by_user(kind))):
      found.append(kind)
  return tuple(found)


def _registered_by_user(kind) -> bool:
  """Whether a library's class (``types.SimpleNamespace``) was registered
  as a pytree with functions of the user's."""
  return any(map(user_function, _compat.pytree_node_functions(kind) or ()))


def class_key(cls: type) -> tuple:
  """``(key, anchors)``: what a trace can read of ``cls``, an argument's
  node class, as the walk keys a closed-over class (its namespace through
  the MRO: methods, class attributes and what their code reads) and the
  flatten and unflatten functions registered for it (where jax says which:
  ``_compat.pytree_node_functions``), with the objects whose ids the key
  holds; for a plain NamedTuple (:func:`plain_namedtuple`), whose only
  code is the standard library's, the class itself.

  Raises:
    Uncacheable: the walk cannot key the class.
  """
  if not _compat.pytree_node_functions(cls) and plain_namedtuple(cls):
    return (PLAIN_NAMEDTUPLE, cls), ()
  a = Analysis(lift_arrays=False)
  a.key = a.klass(cls)   # (a user class's registered functions included)
  if type(a.key) is not tuple:   # a library's class: the user's functions
    a.key = (a.key, tuple(map(a.value,
                              _compat.pytree_node_functions(cls) or ())))
  a.finish(a.key)
  return a.key, a.anchors


PLAIN_NAMEDTUPLE = Tag("plain_namedtuple")


def _namedtuple_codes() -> dict:
  """The code objects ``collections.namedtuple`` gives every class's
  methods (one per method, shared by all its classes)."""
  ref = collections.namedtuple("_Reference", "a")
  return {name: getattr(ref.__dict__[name], "__func__",
                        ref.__dict__[name]).__code__
          for name in ("_make", "_replace", "__repr__", "_asdict",
                       "__getnewargs__")}


_NAMEDTUPLE_CODES = types.MappingProxyType(_namedtuple_codes())
_TUPLEGETTER = type(collections.namedtuple("_Pair", "a").a)
#: What else a NamedTuple class's namespace holds, none of it read by a
#: trace (``__new__``'s defaults and ``_field_defaults`` only fill fields a
#: call leaves out; a tree's unflatten passes them all).
_NAMEDTUPLE_DATA = frozenset({
    "__doc__", "__slots__", "_fields", "_field_defaults", "__match_args__",
    "__module__", "__annotations__", "__orig_bases__", "__qualname__",
    "__firstlineno__", "__static_attributes__"})


def plain_namedtuple(cls) -> bool:
  """Whether ``cls`` is a NamedTuple (``collections.namedtuple`` or
  ``typing.NamedTuple``) with nothing of its own in its namespace but its
  fields: no method, property or class attribute a trace could read. Its
  code is then the standard library's, as made (checked by code object),
  and a trace reads nothing else of it."""
  if type(cls) is not type or cls.__bases__ != (tuple,):
    return False
  ns = cls.__dict__
  fields = ns.get("_fields")
  if type(fields) is not tuple:
    return False
  for name, v in ns.items():
    if name in fields:
      if type(v) is not _TUPLEGETTER:
        return False
    elif name in _NAMEDTUPLE_CODES:
      if getattr(getattr(v, "__func__", v), "__code__",
                 None) is not _NAMEDTUPLE_CODES[name]:
        return False
    elif name == "__new__":
      f = getattr(v, "__func__", None)   # a staticmethod of eval'd code
      if (type(f) is not _FunctionType or f.__closure__
          or f.__code__.co_names != ("_tuple_new",)
          or f.__globals__.get("_tuple_new") is not tuple.__new__):
        return False
    elif name not in _NAMEDTUPLE_DATA:
      return False
  return True
