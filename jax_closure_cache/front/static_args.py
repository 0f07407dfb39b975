"""Functions passed as static arguments, keyed by their closure key.

Stock ``jax.jit(f, static_argnums=0)`` keys a static argument by its hash,
which for a function is its identity: ``apply(lambda v: w @ v, x)`` traces
and compiles on every call, and so does every library that hands a fresh
function to a jitted wrapper as a static argument (``odeint`` passes the
output of ``closure_convert``; solvers pass objectives).

Here a call whose static arguments hold a function (a plain function, a
``functools.partial``, a bound method, a jitted function of this package,
or a tuple of those) binds them into a small closure over the user's
function::

    call_with_static_arguments(*dynamic_args, **dynamic_kwargs)

whose cells are the user's function, the function-valued static arguments
(walked like any closure: their arrays are lifted) and a
:class:`~jax_closure_cache.key.values.Static` of the other static values (keyed
by value, as stock keys them). The commonest call, one function at one
position and no other static value, binds through
``call_with_static_function_at``, whose cells are the user's function, the
static function and the position (an int), and which reads no global. That
closure goes through the cache like any re-created closure, so a fresh
function with an equal key hits one shared executable.

Invariants:
* Identity first, per static function object: the first object of a code is
  answered by stock's jitted function (stock then caches it by identity, as
  without the cache); a function object called before is answered as its
  first call was -- by stock, or by the entry it hit with the arrays it read
  then -- and is handed to stock after ``PROMOTE_AFTER_CALLS`` calls if its
  closure still reads the same values.
* Plain static values are keyed exactly, never by ``==``: a call whose
  static arguments hold no function binds them the same way, over the
  wrapper's own function (whose row, ``_PLAIN``, keeps identity first for
  it: stock's own cache answers an object stock traced, with stock's
  ``==``). Calls with no static value, and every option this module does
  not re-index (anything but ``static_argnums``, ``static_argnames``,
  ``donate_argnums``), are the jit wrapper's usual path.
"""

from __future__ import annotations

import inspect
import types
import typing

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache.front import entries
from jax_closure_cache.front import identity
from jax_closure_cache.front import inline
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.front import wrapper
from jax_closure_cache.key import values
from jax_closure_cache.key import jaxpr as jaxpr_key  # noqa: F401  (registers the jaxpr rules)

# What a static argument may hold for this route: a function whose identity
# is fresh per call in the patterns above (``values.fresh_function``: a
# closure, a partial, a bound method, a callable object, a jitted function
# of this package, a jaxpr made by ``jax.make_jaxpr``), alone, in tuples
# nested up to ``_NESTING`` deep (a filtering jit's ``((leaves, treedef),
# tag)``), in the node data of a treedef (a flattened ``Partial``), or in a
# hashable registered pytree's leaves or node data.
# Closure-free functions of jax, numpy and the standard library
# (``jnp.sin``) are long-lived: stock's identity hash already hits for them.
# Only tuples are looked into: a list or dict is not hashable, and stock's
# error for it must stay.
_NESTING = 8
_PyTreeDef = _compat.jax.tree_util.PyTreeDef
_tree_flatten = _compat.jax.tree_util.tree_flatten


def _is_function(v) -> bool:
  return values.fresh_function(v, 0) is not None


_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None)})


def _function_in(v, depth: int = _NESTING):
  """The first such function in ``v``, or None: in a tuple's items, in a
  treedef's node data, or in a registered pytree's leaves and node data (a
  hashable static of a pytree class)."""
  t = type(v)
  if t in _ATOMS:
    return None
  if t is _PyTreeDef:
    return values.node_data_function(v)
  if depth and isinstance(v, tuple):
    for x in v:
      found = _function_in(x, depth - 1)
      if found is not None:
        return found
    return None
  found = values.fresh_function(v, 0)
  if found is not None or not depth:
    return found
  try:
    leaves, treedef = _tree_flatten(v)
  except Exception:   # a flatten that fails: stock's path
    return None
  if len(leaves) == 1 and leaves[0] is v:
    return None   # not a pytree node
  found = values.node_data_function(treedef)
  for x in leaves:
    if found is not None:
      break
    found = _function_in(x, depth - 1)
  return found


def _binder(fun, functions, shape, static_values):
  """``fun`` with its static arguments bound: ``functions`` (walked by the
  key), ``shape``, a Static of (positions, names, ()) saying which is a
  function, and ``static_values``, the other static values (None for
  none; the cell ``key/names.BINDER_VALUES_CELL`` names), a tuple the key
  walks
  as it walks any closed-over value (atoms by exact type and bits, objects
  by their state: never by a user's ``==``, which stock's own cache of one
  jitted function uses, but which cannot say that a fresh function's trace
  would be the same)."""
  def call_with_static_arguments(*args, **kwargs):
    positions, names, _ = shape.value
    values = iter(functions)
    plain_values = iter(static_values or ())
    full = list(args)
    for i, is_function in positions:
      full.insert(i, next(values) if is_function else next(plain_values))
    for name, is_function in names:
      kwargs[name] = next(values) if is_function else next(plain_values)
    if names:   # in stock's order: its flat tree's, sorted by name
      kwargs = dict(sorted(kwargs.items()))
    return fun(*full, **kwargs)
  return call_with_static_arguments


def _binder_at(fun, function, position):
  """:func:`_binder` for the commonest call: one function, at positional
  index ``position``, the only static argument. Its code reads no global
  and no shape, so its key and its matcher are the user's function, the
  function's own parts and ``position`` (an int, keyed by type and
  value)."""
  def call_with_static_function_at(*args, **kwargs):
    return fun(*args[:position], function, *args[position:], **kwargs)
  return call_with_static_function_at


def _binder_of_one(fun, function, shape, static_values):
  """:func:`_binder` for one function among the static arguments, held in
  its own cell: the key walks it directly, and its matcher checks it with
  no pytree of functions to flatten."""
  def call_with_static_function(*args, **kwargs):
    positions, names, _ = shape.value
    plain_values = iter(static_values or ())
    full = list(args)
    for i, is_function in positions:
      full.insert(i, function if is_function else next(plain_values))
    for name, is_function in names:
      kwargs[name] = function if is_function else next(plain_values)
    if names:   # in stock's order: its flat tree's, sorted by name
      kwargs = dict(sorted(kwargs.items()))
    return fun(*full, **kwargs)
  return call_with_static_function


class _Bound(wrapper.ClosureJitted):
  """The binder of one call; its stock form is the user's stock jitted
  function called with the static arguments back in place, and its user
  (whose code decides first-object-is-stock's) the static function.
  ``outer_stock``: a callable giving that stock jitted function (made on
  first need)."""
  __slots__ = ("_user_fun", "_outer_stock", "_static_args")

  def __init__(self, binder, options: dict, options_key: tuple,
               lift_numpy: bool, user, outer_stock, static_args):
    super().__init__(binder, options, options_key, lift_numpy)
    self._bind(user, outer_stock, static_args)

  def _bind(self, user, outer_stock, static_args):
    # where this class's slots are set (and ``made``, spelled out)
    self._user_fun = user
    self._outer_stock = outer_stock
    self._static_args = static_args   # (positions, names, values)

  @classmethod
  def made(cls, binder, options: dict, options_key: tuple, lift_numpy: bool,
           user, outer_stock, static_args) -> "_Bound":
    """The binder's wrapper: of its code's front class (a generated
    ``__call__``, made without ``__init__``) where one is filed for these
    options, which a front's are when they are the defaults' (the jitted
    function's only options were its static arguments), else of this
    class."""
    w = (_front_of(binder)
         if not options_key and lift_numpy == _hot_spec[0].lift_numpy
         else None)
    if w is None:
      return cls(binder, options, options_key, lift_numpy, user, outer_stock,
                 static_args)
    # (``_bind``, spelled out: one frame fewer on the hit path)
    w._user_fun, w._outer_stock, w._static_args = (user, outer_stock,
                                                   static_args)
    return w

  @staticmethod
  def _front_home():
    return _Bound, _fronts

  def _user(self):
    return self._user_fun

  def decided(self) -> list | None:
    """The row this call's first object got (its entry, key and leaves)
    where it was answered by a shared entry; None where stock answered."""
    row = self._row
    return row if type(row) is identity.Pinned else None

  def resume(self, row: identity.Pinned, args, kwargs):
    """Call the entry of ``row`` (an earlier binder's ``decided()``) for
    this binder's static function, as that binder's later calls would."""
    return self._call_entry(row.entry, row.key, row.leaves, args, kwargs)

  def _presented(self):
    """The user's jitted function as stock's trace names it: its name,
    source line and signature without the static arguments (the jaxpr's
    debug info, the HLO module's name)."""
    fun = self._outer_stock()
    fun = getattr(fun, "__wrapped__", fun)
    positions, names, _ = self._static_args
    try:
      sig = inspect.signature(fun)
    except (TypeError, ValueError):
      return None
    params = list(sig.parameters.values())
    static = {params[i].name for i in positions if i < len(params)} | set(
        names)
    return entries.Presented(
        fun, sig.replace(parameters=[p for p in params
                                     if p.name not in static]))

  def stock(self):
    if self._stock is not None:
      return self._stock
    outer, (positions, names, values) = self._outer_stock, self._static_args

    def in_place(args, kwargs):   # the static arguments back in place
      full = list(args)
      it = iter(values)
      for i in positions:
        full.insert(i, next(it))
      for name in names:
        kwargs[name] = next(it)
      return full, kwargs

    def stock_call(*args, **kwargs):
      full, kwargs = in_place(args, kwargs)
      return outer()(*full, **kwargs)

    def trace(*args, **kwargs):   # stock's ``.trace()`` of the same call
      full, kwargs = in_place(args, kwargs)
      return outer().trace(*full, **kwargs)
    stock_call.trace = trace
    self._stock = stock_call
    return stock_call


_fronts = inline.client_fronts
_hot_spec = jit_options.hot_spec_cell()
_front_of = wrapper.front_maker(_fronts, _Bound)


class _Layout:
  """How one set of options splits a call (cached per options key), and
  the bound call's options and options key per set of static positions."""
  __slots__ = ("argnums", "argnames", "inner_options", "bound", "positions")

  def __init__(self, options: dict, resolved: tuple | None = None):
    nums = options.get("static_argnums")
    names = options.get("static_argnames")
    nums = () if nums is None else nums
    names = () if names is None else names
    self.argnums = (nums,) if isinstance(nums, int) else tuple(nums)
    self.argnames = (names,) if isinstance(names, str) else tuple(names)
    if resolved is not None:   # as stock's jit() resolved them (see _layout)
      self.argnums, self.argnames = resolved
    self.inner_options = {k: v for k, v in options.items()
                          if k not in ("static_argnums", "static_argnames")}
    self.bound: dict[tuple, tuple[dict, tuple]] = {}
    self.positions: dict[int, tuple] = {}

  def positions_of(self, n: int) -> tuple:
    """The static positions of a call with ``n`` positional arguments,
    ascending (``static_argnums`` may be negative or out of range)."""
    found = self.positions.get(n)
    if found is None:
      found = tuple(sorted({i % n for i in self.argnums if -n <= i < n}))
      if len(self.positions) < 64:
        self.positions[n] = found
    return found

  def bound_options(self, positions: tuple) -> tuple[dict, tuple]:
    found = self.bound.get(positions)
    if found is None:
      options = _inner_options(self, positions)
      found = self.bound[positions] = (
          options, jit_options.options_key(options) if options else ())
    return found


_layouts: dict[tuple, _Layout] = cache.STORE.table("static_args.layouts",
                                                  cache.Store.FACTS)


def _layout(spec, resolved: tuple | None) -> _Layout:
  """The layout of ``spec``'s options for a function whose stock ``jit()``
  resolved its static arguments to ``resolved`` (``static_argnums``
  gains the positions of ``static_argnames``, and ``static_argnames`` the
  names of ``static_argnums``, from the function's signature)."""
  key = (spec.key, resolved)
  layout = _layouts.get(key)
  if layout is None:
    if len(_layouts) >= 1 << 12:
      _layouts.clear()
    layout = _layouts[key] = _Layout(spec.options, resolved)
  return layout


def _inner_options(layout: _Layout, positions: list[int]) -> dict:
  """Options of the bound call: donate_argnums re-indexed past the removed
  static positions (a donated static argument is stock's error anyway)."""
  options = layout.inner_options
  donate = options.get("donate_argnums")
  if donate is None:
    return options
  donate = (donate,) if isinstance(donate, int) else tuple(donate)
  removed = sorted(positions)
  shifted = tuple(d - sum(1 for p in removed if p < d) for d in donate
                  if d not in removed)
  return dict(options, donate_argnums=shifted)


# options key -> {weakref(jitted user function): {weakref(static function):
# (params, state)}}; state None: stock's; else the ``identity.Pinned`` row
# its first call decided. Rows are per user function: the same static
# function given to two jitted functions is two different computations.
_tables: dict[tuple, dict] = cache.STORE.table(
    "static_args.tables", cache.Store.TRACES, empty=lambda: _clear())



# The row of a wrapper's function called with plain static values only
_PLAIN = "plain static values"


class _Owned:
  """The last static function of a wrapper that stock answered: the
  wrapper's calls with ``function`` at ``position`` go straight to stock's
  jitted object; ``calls`` counts them toward ``PROMOTE_AFTER_CALLS``."""
  __slots__ = ("position", "function", "calls")

  def __init__(self, position: int, function):
    self.position = position
    self.function = function
    self.calls = 0


class _Quick(typing.NamedTuple):
  """The shape of a wrapper's last call whose one static argument was a
  fresh plain function (``_call_quick``): ``n`` positional arguments, the
  function at ``position``, the static parameters ``params``, and the
  bound call's ``options`` and ``options_key``."""
  n: int
  position: int
  params: object
  options: dict
  options_key: tuple


class StaticArgsJitted(wrapper.ClosureJitted):
  """A jitted function with static arguments; functions among them are
  keyed by their closure key (see the module docstring).

  ``_owned`` (an :class:`_Owned`) is the last static function answered by
  stock: calls with it go straight to stock's jitted object, and
  after ``PROMOTE_AFTER_CALLS`` of them the wrapper is stock's for
  good (no frame of ours per call, as for any long-lived jitted function).
  It holds the function as stock's own cache does.
  """
  __slots__ = ("_owned", "_quick", "_resolved", "_calls", "_rows")

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._owned = None
    # the :class:`_Quick` shape of the last call whose one static
    # argument was a fresh plain function, with or without a closure: a
    # later call of that shape skips the search for functions among the
    # static values and the identity lookup (``_call_quick``)
    self._quick = None
    self._resolved = self._resolve()
    self._calls = 0   # of this wrapper with a static function's row
    self._rows = None   # the identity rows' table, once looked up

  def _resolve(self) -> tuple | None:
    """The static arguments of this wrapper's function and options, as
    stock's ``jit()`` resolves them against the function's signature.
    Stock's own jitted object is made for the first wrapper of a function
    and options: its argument validation raises then, at ``jit()`` time,
    as stock's does (an unknown static_argnames, an out-of-range
    static_argnums, static and donated names intersecting). A later
    wrapper of them (``jax.jit(f, static_argnums=1)(x, g)`` in a loop)
    reads what that one parsed (``wrapper.parsed_options``): making
    stock's object costs as much as stock's whole call of a new wrapper."""
    info = wrapper.parsed_options(self._fun, self._spec)
    if info is None:
      return _compat.jit_static_arguments(self.stock())
    return _compat.jit_static_arguments_of(info)

  def __call__(self, *args, **kwargs):
    owned = self._owned
    if owned is not None:
      i = owned.position
      if i < len(args) and args[i] is owned.function:
        owned.calls += 1
        if owned.calls >= identity.PROMOTE_AFTER_CALLS:
          self._go_direct(self.stock())
        return self.stock()(*args, **kwargs)
    quick = self._quick
    if quick is not None and not kwargs and len(args) == quick.n:
      fun = args[quick.position]
      if (type(fun) is types.FunctionType
          and not identity.getweakrefcount(fun)
          and not _compat.DISABLE_JIT.value):
        return self._call_quick(quick, fun, args)
    layout = _layout(self._spec, self._resolved)
    positions = layout.positions_of(len(args))
    names = [k for k in layout.argnames if k in kwargs] if kwargs else []
    static_values = [args[i] for i in positions]
    if names:
      static_values += [kwargs[k] for k in names]
    if not static_values or _compat.DISABLE_JIT.value:
      return wrapper.ClosureJitted.__call__(self, *args, **kwargs)
    # the first function each static value holds (None: a plain value)
    found = [_function_in(v) for v in static_values]
    return self._call_bound(layout, args, kwargs, positions, names,
                            static_values, found)

  def _call_bound(self, layout: _Layout, args, kwargs, positions, names,
                  static_values, found):
    dynamic = tuple([a for i, a in enumerate(args) if i not in positions])
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names} \
        if kwargs else {}
    flags = [f is not None for f in found]
    functions = tuple([v for v, f in zip(static_values, flags) if f])
    plain = tuple([v for v, f in zip(static_values, flags) if not f])
    params = values.Static(
        tuple(zip(positions, flags[:len(positions)])),
        tuple(zip(names, flags[len(positions):])), plain)
    # (stock's jitted object is made only where a path calls it: making it
    # costs as much as stock's whole call of a new wrapper)
    try:   # stock hashes every static value: an unhashable one is its error
      hash(params)
      hash(functions)
    except Exception:
      unhashable = True
    else:
      unhashable = False
    if unhashable:   # (called outside the block: no chained refusal)
      return self.stock()(*args, **kwargs)
    user = next((f for f in found if f is not None), None)
    if user is None or not callable(user):
      # plain values only, or a jaxpr: the user's function is the one
      # reported, and whose code decides first-object-is-stock's
      user = self._fun
    # Identity first: one function static argument, called before by this
    # wrapper's function (another jitted function given the same static
    # function computes something else: its row is its own); with plain
    # values only, the wrapper's function itself, whose row is ``_PLAIN``
    # in its own table.
    single = (not functions
              or len(functions) == 1 and _is_function(functions[0]))
    table = self._table() if single else None
    row = ref = None
    if table is not None:
      try:
        ref = identity.ref(functions[0], table.pop) if functions else _PLAIN
        row = table.get(ref)
      except TypeError:
        single = False
    seen, state = row if row is not None else (None, None)
    if row is not None and state is None and not functions:
      # the wrapper's function is stock's: so is every call of it
      stock = self.stock()
      self._go_direct(stock)
      return stock(*args, **kwargs)
    if row is not None and seen == params:
      if state is None:
        if not names and len(positions) == 1:
          self._owned = _Owned(positions[0], functions[0])
        return self.stock()(*args, **kwargs)
      # This wrapper's own calls only: a jitted function made anew for each
      # call (``jax.jit(f, static_argnums=1)(x, g)`` in a loop) keeps no
      # stock object alive, and stock's path for a new one costs twice the
      # entry's.
      self._calls += 1
      # (nor while the entry is warned of: stock's object would lower now
      # and warn of its constants, where stock's lowered at the first call)
      if (self._calls >= identity.PROMOTE_AFTER_CALLS and not plain
          and not (type(state) is identity.Pinned
                   and state.entry.warned())):
        # long-lived: stock's from now on (not with plain values: stock's
        # object would trace a value equal under == to the first call's,
        # which stock's own cache of the object answers with that trace)
        table[ref] = (params, None)
        return self.stock()(*args, **kwargs)
      bound = self._make_bound(layout, positions, names, static_values,
                               functions, params, user, self.stock)
      return bound.resume(state, dynamic, dyn_kwargs)
    if row is not None:
      # The same static function with other plain values: stock's own cache
      # answers, as it would (it reuses the trace of an earlier value equal
      # under ==, where a shared entry would trace this one's).
      return self.stock()(*args, **kwargs)
    bound = self._make_bound(layout, positions, names, static_values,
                             functions, params, user, self.stock)
    out = self._first_call(bound, dynamic, dyn_kwargs, params,
                           table if single else None, ref)
    if single:
      if (not names and not plain and len(positions) == 1
          and type(user) is types.FunctionType):
        self._quick = _Quick(len(args), positions[0], params,
                             *layout.bound_options(tuple(positions)))
    return out

  def _call_quick(self, quick, fun, args):
    """:meth:`_call_bound` for a call shaped as ``quick`` whose static
    function ``fun`` is a plain function nothing refers to weakly (a fresh
    lambda, closing over values or not), so no identity
    row can name it: its first call, decided as the general path decides
    one (the same binder, options and parameters, its row recorded)."""
    _, position, params, options, options_key = quick
    bound = _Bound.made(_binder_at(self._fun, fun, position), options,
                        options_key, self._spec.lift_numpy, fun, self.stock,
                        ((position,), (), (fun,)))
    # Its row, whether or not anything else holds ``fun`` now: a count of
    # references cannot tell (``J(*t)`` passes the caller's tuple as the
    # call's own, ``J.__call__(g, x)`` makes none). (``_first_call``,
    # spelled out: this is the hit path of a fresh static closure.)
    table = self._table()
    if position == 0 and len(args) == 2:
      out = bound(args[1])
    else:
      out = bound(*args[:position], *args[position + 1:])
    if table is not None:
      table[identity.ref(fun, table.pop)] = (params, bound.decided())
    return out

  @staticmethod
  def _first_call(bound, dynamic, dyn_kwargs, params, table, ref):
    """The first call of a static function under this wrapper: its binder's
    wrapper ``bound`` called, its decision recorded as the function's row in
    ``table`` under ``ref`` (``table`` None: no row is kept)."""
    out = bound(*dynamic, **dyn_kwargs)
    if table is not None:
      table[ref] = (params, bound.decided())
    return out

  def _make_bound(self, layout, positions, names, static_values, functions,
                  params, user, outer_stock) -> _Bound:
    options, options_key = layout.bound_options(tuple(positions))
    positions_of, names_of, plain = params.value
    # the binder's key walks the plain values themselves (``_binder``);
    # with none, its cell holds None (a matcher's check by identity, where
    # an empty tuple would cost a pytree check)
    shape = params if not plain else values.Static(positions_of, names_of, ())
    plain = plain or None
    if len(functions) != 1:
      binder = _binder(self._fun, functions, shape, plain)
    elif plain is None and not names_of and len(positions_of) == 1:
      binder = _binder_at(self._fun, functions[0], positions_of[0][0])
    else:
      binder = _binder_of_one(self._fun, functions[0], shape, plain)
    return _Bound.made(binder, options, options_key,
                       self._spec.lift_numpy, user, outer_stock,
                       (positions, names, static_values))

  def _cache_size(self) -> int:
    """Executables compiled for this function: stock's own object's, and
    those of the shared entries its rows were answered by."""
    n = _compat.cache_size(self.stock())
    table = self._table()
    seen = set()
    for _, state in list(table.values()) if table else ():
      if type(state) is identity.Pinned:
        jitted = state.entry.jitted
        if id(jitted) not in seen:
          seen.add(id(jitted))
          n += _compat.cache_size(jitted)
    return n

  def clear_cache(self):
    """Stock's ``clear_cache()``, and the rows of this wrapper's function
    forgotten: its next calls decide afresh, reading what the static
    functions' closures hold now, as stock's next trace does."""
    wrapper.ClosureJitted.clear_cache(self)
    self._owned = self._quick = None
    table = self._table()
    if table is not None:
      table.clear()

  def _table(self) -> dict | None:
    """The identity rows of this wrapper's function under its options; None
    if that function cannot be weakly referenced (then no rows are kept).
    Kept by the wrapper once looked up: the table lives while the function
    does (its entry goes when the function dies), and is emptied in place,
    never replaced (``_clear``)."""
    if self._rows is not None:
      return self._rows
    by_user = _tables.get(self._spec.key)
    if by_user is None:
      by_user = _tables[self._spec.key] = {}
    try:
      table = by_user.get(identity.ref(self._fun))
      if table is None:
        table = by_user[identity.ref(self._fun, by_user.pop)] = {}
    except TypeError:
      return None
    self._rows = table
    return table


def _clear() -> None:
  # the rows go; each function's table stays, emptied (wrappers keep it)
  for by_user in _tables.values():
    for table in list(by_user.values()):
      table.clear()


values.register_wrapper(StaticArgsJitted, *wrapper.WALK_RULE,
                        label="jitted")
wrapper.register_static_arguments_kind(StaticArgsJitted)
