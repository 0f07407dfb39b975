"""Eager control flow through one cached launcher per closure key.

Called outside any trace, ``while_loop(cond_fun, body_fun, init_val)`` (and
``fori_loop``, ``scan``, ``cond``, ``switch``, ``map``, ``custom_linear_solve``,
``custom_root``) builds a *launcher*: a
small closure over the function arguments and the static parameters (length,
reverse, unroll, Python-int loop bounds, ...) that calls stock control flow
on the dynamic operands. The launcher goes through the closure-aware jit, so
a fresh ``body_fun`` whose key equals an earlier one reuses that executable;
arrays the functions close over are lifted as for any closure.

Invariants:
* Under a trace, under ``jax.disable_jit()``, or with an argument form this
  module does not route (``operand=``), every function is exactly stock.
* A launcher's stock form is the launcher itself called eagerly, which is the
  stock call; fallbacks and retries therefore give stock's result or error.
* Identity first, per user function, where stock keys its trace caches on
  the function objects (``while_loop``, ``fori_loop``, ``scan``, ``cond``,
  ``switch``): a function launched before with the same functions and
  static parameters is answered as its first launch was -- by stock, or by
  the entry it hit, with the arrays it read then -- whatever its closure
  holds now (:class:`_Row`). A function nothing else holds (a lambda written
  in the call) cannot be launched again, and gets no row. ``map`` and the
  custom solves trace their functions afresh at every stock call, so every
  launch of theirs is keyed afresh.

Example::

    >>> import jax.numpy as jnp
    >>> from jax_closure_cache import lax
    >>> def generate(w, x):   # fresh closures every call, one compile
    ...   return lax.while_loop(lambda c: c[0] < 3,
    ...                         lambda c: (c[0] + 1, c[1] @ w), (0, x))[1]
    >>> generate(jnp.eye(2), jnp.ones(2))
    Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

import functools
import sys
import types
import weakref

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache import atoms
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache.front import identity
from jax_closure_cache.key import values
from jax_closure_cache.front import inline
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.front import wrapper

_stock_while_loop = _compat.STOCK_CONTROL_FLOW["while_loop"]
_stock_fori_loop = _compat.STOCK_CONTROL_FLOW["fori_loop"]
_stock_scan = _compat.STOCK_CONTROL_FLOW["scan"]
_stock_map = _compat.STOCK_CONTROL_FLOW["map"]
_stock_cond = _compat.STOCK_CONTROL_FLOW["cond"]
_stock_switch = _compat.STOCK_CONTROL_FLOW["switch"]
_stock_custom_linear_solve = _compat.STOCK_CONTROL_FLOW["custom_linear_solve"]
_stock_custom_root = _compat.STOCK_CONTROL_FLOW["custom_root"]
_DISABLE_JIT = _compat.DISABLE_JIT
_top_level = _compat.trace_state_clean
_transfers_guarded = _lowering.transfers_guarded


class _Launcher(wrapper.ClosureJitted):
  """A cached launcher; its stock form is itself, called eagerly."""
  __slots__ = ("_user_fun",)
  _constants_are_operands = True
  #: Its front classes also generate ``launch`` (``generated.front_class``):
  #: this class's, with the hit inline.
  front_launches = True

  def __init__(self, launcher, user, lift_numpy: bool):
    super().__init__(launcher, {}, (), lift_numpy)
    self._set_user(user)

  def _set_user(self, user):   # the one place this class's slot is set
    self._user_fun = user if callable(user) else self._fun

  @classmethod
  def made(cls, launcher, user) -> "_Launcher":
    """The wrapper of ``launcher`` (with the defaults' options): of its
    code's front class where one is filed (a generated ``__call__``, made
    without ``__init__``, as ``jit``'s hot case makes a front's wrapper),
    else of this class."""
    w = _front_of(launcher)
    if w is None:
      return cls(launcher, user, jit_options.lift_numpy_default())
    w._user_fun = user if callable(user) else launcher   # as ``_set_user``
    return w

  def _user(self):
    return self._user_fun

  def stock(self):
    return self._fun

  @staticmethod
  def _front_home():
    return _Launcher, _fronts

  def launch(self, operands, lone: int):
    """Call this launcher wrapper: its user function's row first (if it
    has one), else the launch, then the row recorded where something other
    than this launch holds the function (more than ``lone`` references,
    counted from here: it may be launched again). A front class's
    ``launch`` is this one with the hit inline (``generated.LAUNCHED``)."""
    user = self._user_fun
    if type(user) is not types.FunctionType:
      # rows are for plain functions: a callable object's hash and == are
      # its class's own, never run by the cache
      return self(*operands)
    if _getweakrefcount(user):
      out = self.answer_again(operands)
      if out is not _AGAIN:
        return self._as_forwarded(operands, out)
    out = self(*operands)
    if _getrefcount(user) > lone:
      self.remember()
    return self._as_forwarded(operands, out)

  def _launch_rowless(self, operands):
    """Call this launcher wrapper, keeping no row for its user function
    (one stock's cache never answers by identity: ``map`` wraps it anew
    for its ``scan``), its forwarded operands the caller's own."""
    return self._as_forwarded(operands, self(*operands))

  def _as_forwarded(self, operands, out):
    """``out``, where the entry that answered returns an operand as it was
    passed (a carry a loop passes through, a ``scan``'s ``xs`` as its
    ``ys``), with the caller's own object there, as stock's eager loop
    returns it: a jax array itself; a Python scalar or NumPy array as it
    is for a carry (a ``scan`` puts a NumPy ``xs`` on the device, as the
    entry's output already is; a ``map``'s operand is its ``xs``). Stock's
    eager ``cond`` and ``switch`` return an operand every branch returns
    unchanged through ``asarray``: a jax array itself, anything else a
    new array, as the entry's output already is."""
    row = self._row
    if type(row) is not identity.Pinned:
      return out
    entry = row.entry
    if entry.forwarded is None or self._fun.__code__ not in _FORWARDING_CODES:
      return out   # (the common case first: hashing a code object costs)
    # (the forwarding of this call's signature: a shared entry traces one
    # per signature, and each may forward other carries)
    forwarded = entry.forwarded_for(operands, {})
    if forwarded is None:
      return out
    given = _tree_leaves(operands)
    code = self._fun.__code__
    carries = (len(_tree_leaves(operands[0])) if code is _SCAN_CODE
               else 0 if code in _ARRAYS_ONLY_CODES else len(given))
    leaves, tree = _tree_flatten(out)
    for o, i in forwarded:
      x = given[i]
      if type(x) is _compat.ArrayImpl or i < carries:
        leaves[o] = x
    return _tree_unflatten(tree, leaves)

  def answer_again(self, operands):
    """The answer of a launch of a user's function launched before: as its
    first launch decided where this launch is that one's again (its row),
    else stock's (whose cache answers the function with its first trace,
    whatever its closure holds now, beside the launch's other functions);
    ``_AGAIN`` for a function not launched before."""
    user = self._user_fun
    row = _rows.get(_ref(user), _AGAIN)
    if row is _AGAIN:
      return _AGAIN
    if not row.answers(self._fun, user):
      return self._fun(*operands)   # the stock call
    pinned = row.pinned
    if pinned is None:
      return self._fun(*operands)
    # (this launch's wrapper answers by the row's entry: so it forwards what
    # that entry's traces forward, ``_as_forwarded``)
    self._row = pinned
    return self._call_entry(pinned.entry, pinned.key, pinned.leaves,
                            operands, {})

  def remember(self) -> None:
    """Record what this launch decided as its user function's row."""
    decided = self._row
    if type(decided) is identity.Pinned:
      pinned = decided
    elif type(decided) is identity.OWNED:
      pinned = None
    else:   # no decision (an error, a disabled jit)
      return
    launcher, user = self._fun, self._user_fun
    try:
      row = _Row(user, _drop_row)   # goes with the function
      row.code, row.pinned = launcher.__code__, pinned
      row.parts = tuple([
          _USER if v is user else v if v is None or type(v) is _StaticType
          else _hold(v, user)
          for v in [c.cell_contents for c in launcher.__closure__]])
      _rows[row] = row
    except TypeError:   # a function that cannot be referenced weakly: no row
      pass


_fronts = inline.client_fronts
_front_of = wrapper.front_maker(_fronts, _Launcher)


#: ``_wrap(launcher, user)``: the cached wrapper of ``launcher``
#: (``_Launcher.made``); ``user`` is the user's function the diagnostics
#: name and whose code decides first-object-is-stock's. Called as
#: ``_wrap(...)(*operands)``: while the wrapper runs, nothing but the
#: wrapper holds ``launcher``, so a hit has no row to publish (nothing else
#: can wrap this launcher again).
_wrap = _Launcher.made


def _routable_by_calls() -> bool:
  # (under a transfer guard, stock's own transfers: it moves the Python
  # bounds and operands a launcher keeps static; with NaN or Inf checks on,
  # stock's eager loop checks each primitive's outputs as it runs it, and
  # reports a bad value as that primitive's, where a launch's executable
  # would report it as a jitted function's and re-run it de-optimized)
  return (_top_level() and not _DISABLE_JIT.value
          and not _transfers_guarded()
          and not _lowering.checks_nans_or_infs())


if (_compat.TOP_LEVEL_READS is not None
    and _lowering.HOST_TO_DEVICE_GUARD is not None):
  # ``_routable`` as config reads (it runs before every eager launch)
  _TRACE, _EVAL, _AXES, _TOP_AXES, _EMPTY_CLEAN = _compat.TOP_LEVEL_READS
  _GUARD = _lowering.HOST_TO_DEVICE_GUARD
  _UNGUARDED = (None, "allow")
  _NANS, _INFS = _lowering.DEBUG_NANS, _lowering.DEBUG_INFS

  def _routable() -> bool:   # ``_routable_by_calls``, read directly
    trace = _TRACE.value
    return ((trace is _EVAL and _AXES.value is _TOP_AXES
             or trace is None and _EMPTY_CLEAN)
            and not _DISABLE_JIT.value and _GUARD.value in _UNGUARDED
            and not _NANS.value and not _INFS.value)
else:
  _routable = _routable_by_calls


# -- identity first, per user function ------------------------------------------

class _Row(weakref.ref):
  """What the first launch of a user's function decided, for its later
  launches with the same functions and static parameters; a weak
  reference to the function (its own key in ``_rows``, dropping itself
  as the function dies). ``code``: the launcher's (None once another of
  the launch's functions died: every later launch is stock's); ``parts``:
  its cells as :func:`_hold` holds them; ``pinned``: the
  ``identity.Pinned`` row of the entry it hit, or None (stock answered).
  Holds the user's functions weakly; the leaves while the function lives,
  as a jit's identity row does."""
  __slots__ = ("code", "parts", "pinned")

  def answers(self, launcher, user) -> bool:
    """Whether ``launcher`` launches what this row's first launch of
    ``user`` did: the same code, the same function objects, equal static
    parameters."""
    if launcher.__code__ is not self.code:
      return False
    for held, cell in zip(self.parts, launcher.__closure__):
      if not _same(held, cell.cell_contents, user):
        return False
    return True


#: A row's part for the user function itself (its key holds it weakly).
_USER = object()


def _hold(v, user):
  """A launcher cell's content as the row of ``user`` holds it: the
  function itself as ``_USER``, a static parameter or None as it is, a
  tuple (``switch``'s branches) item by item, anything else weakly, its
  death leaving the row answering nothing; raises TypeError where it
  cannot be."""
  if v is user:
    return _USER
  if v is None or type(v) is _StaticType:
    return v
  if type(v) is tuple or type(v) is list:
    return (type(v), tuple([_hold(x, user) for x in v]))
  # (the callback names the row by a plain reference to its function: one
  # to the row itself would make a cycle keeping its pinned arrays alive
  # until a collection)
  return _ref(v, functools.partial(_forget_row, _ref(user)))


def _same(held, v, user) -> bool:
  if held is _USER:
    return v is user
  if held is None:
    return v is None
  if type(held) is _StaticType:
    return type(v) is _StaticType and held == v
  if type(held) is tuple:
    kind, items = held
    return (type(v) is kind and len(v) == len(items)
            and all(_same(h, x, user) for h, x in zip(items, v)))
  return held() is v


# _Row (a weak reference to its user function) -> itself, found by a plain
# weak reference to the function: the store's, in ``identity``
_rows = identity.launch_rows
_ref = weakref.ref
_getweakrefcount = weakref.getweakrefcount
_StaticType = values.Static


def _drop_row(row) -> None:
  _rows.pop(row, None)


def _forget_row(user_ref, _) -> None:
  # the function stays launched, its launches stock's; the arrays the row
  # pinned go
  try:
    row = _rows.get(user_ref)
  except TypeError:   # the function died first: its row went with it
    return
  if row is not None:
    row.code = row.parts = row.pinned = None

_getrefcount = getattr(sys, "getrefcount", lambda _: 1 << 30)
_tree_leaves = _compat.jax.tree_util.tree_leaves
_tree_flatten = _compat.jax.tree_util.tree_flatten
_tree_unflatten = _compat.jax.tree_util.tree_unflatten


_AGAIN = object()


_launch_rowless = _Launcher._launch_rowless


#: References to a user function that a launch holds alone, counted in
#: :meth:`_Launcher.launch` (and a front's, before its match): the cached
#: function's parameter (a call from Python moves the caller's reference
#: there), the launcher's cell, the wrapper's ``_user_fun``, ``launch``'s
#: local and getrefcount's argument; one fewer for ``switch``, whose first
#: branch its sequence holds for all three.
_LONE = 5


# Each launcher factory's inner function has one code object for the whole
# process, so its closure (the user's functions and static parameters) is
# the whole cache key. It calls stock through a module-level function of
# this module (``_run_*``), which the key holds by identity, as it holds
# jax's: stock's own functions are wrapped by jax's traceback filter, a
# closure whose globals a matcher would otherwise check on every hit.

def _run_while_loop(cond_fun, body_fun, init_val):
  return _stock_while_loop(cond_fun, body_fun, init_val)


def _while_launcher(cond_fun, body_fun):
  def launch_while_loop(init_val):
    return _run_while_loop(cond_fun, body_fun, init_val)
  return launch_while_loop


@functools.wraps(_stock_while_loop)
def while_loop(cond_fun, body_fun, init_val):
  if not _routable():
    return _stock_while_loop(cond_fun, body_fun, init_val)
  return _wrap(_while_launcher(cond_fun, body_fun), body_fun).launch(
      (init_val,), _LONE)


def _static_bound(bound):
  """A Python or NumPy integer bound stays static and exactly itself (its
  type matters: stock rejects an int16 lower with an int32 upper)."""
  if isinstance(bound, (int, np.integer)) and not isinstance(bound, bool):
    return bound
  return None


# A launcher's static parameters (loop bounds, ``length``, ``unroll``...) are
# keyed by value and exact types and never made dynamic.
_Static = values.Static.of
_StaticInts = values.Static.of_ints


def _run_fori_loop(params, lower, upper, body_fun, init_val):
  static_lower, static_upper, unroll = params.value
  return _stock_fori_loop(static_lower if lower is None else lower,
                          static_upper if upper is None else upper,
                          body_fun, init_val, unroll=unroll)


def _run_static_fori_loop(params, body_fun, init_val):
  lower, upper, unroll = params.value
  return _stock_fori_loop(lower, upper, body_fun, init_val, unroll=unroll)


def _fori_launcher(static_lower, static_upper, body_fun, unroll):
  params = _Static(static_lower, static_upper, unroll)
  if static_lower is not None and static_upper is not None:
    return _static_fori_launcher(params, body_fun)
  return _fori_launcher_of(params, body_fun)


def _fori_launcher_of(params, body_fun):
  def launch_fori_loop(lower, upper, init_val):
    return _run_fori_loop(params, lower, upper, body_fun, init_val)
  return launch_fori_loop


def _static_fori_launcher(params, body_fun):
  """The launcher of a loop with both bounds static (the commonest: Python
  ints), its only operand the carry (a None operand costs JAX's dispatch
  a pytree node per call)."""
  def launch_static_fori_loop(init_val):
    return _run_static_fori_loop(params, body_fun, init_val)
  return launch_static_fori_loop


def _array_bounds(lower, upper):
  """Both bounds as Python ints where one is a concrete jax array and stock
  would specialize on them (``int()`` of each, its scan path: so the
  launcher holds them as static cells, as stock traces each value):
  integer scalars of one dtype; None for anything else, which stock
  answers as it is (its dtype rules and errors)."""
  types_ = set()
  for b in (lower, upper):
    if isinstance(b, _compat.ArrayImpl) and b.shape == ():
      types_.add(b.dtype)
    elif isinstance(b, np.integer) and not isinstance(b, bool):
      types_.add(b.dtype)
    else:
      return None
  if len(types_) != 1 or not np.issubdtype(types_.pop(), np.integer):
    return None
  return int(lower), int(upper)


@functools.wraps(_stock_fori_loop)
def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
  if not _routable():
    return _stock_fori_loop(lower, upper, body_fun, init_val, unroll=unroll)
  if type(lower) is int and type(upper) is int and unroll is None:
    # the common case, at once (the bounds' Static by their values alone)
    return _wrap(_static_fori_launcher(_StaticInts(lower, upper, None),
                                       body_fun), body_fun).launch(
        (init_val,), _LONE)
  static_lower, static_upper = _static_bound(lower), _static_bound(upper)
  if ((static_lower is None or static_upper is None)
      and (isinstance(lower, _compat.ArrayImpl)
           or isinstance(upper, _compat.ArrayImpl))):
    # concrete array bounds: stock specializes on their values
    bounds = _array_bounds(lower, upper)
    if bounds is None:
      return _stock_fori_loop(lower, upper, body_fun, init_val, unroll=unroll)
    static_lower, static_upper = bounds
  # A Python int bound is a static cell (stock unrolls to a scan of known
  # length); an array bound is an operand, so new values never recompile.
  launcher = _fori_launcher(static_lower, static_upper, body_fun, unroll)
  if static_lower is not None and static_upper is not None:
    return _wrap(launcher, body_fun).launch((init_val,), _LONE)
  return _wrap(launcher, body_fun).launch(
      (None if static_lower is not None else lower,
       None if static_upper is not None else upper, init_val), _LONE)


def _run_scan(params, f, init, xs):
  length, reverse, unroll, split_transpose = params.value
  return _stock_scan(f, init, xs, length=length, reverse=reverse,
                     unroll=unroll, _split_transpose=split_transpose)


def _scan_launcher(f, length, reverse, unroll, split_transpose):
  if (length is None and reverse is False and type(unroll) is int
      and unroll == 1 and split_transpose is False):
    params = _SCAN_DEFAULTS   # (the common call: no Static.of to look up)
  else:
    params = _Static(length, reverse, unroll, split_transpose)

  def launch_scan(init, xs):
    return _run_scan(params, f, init, xs)
  return launch_scan


_SCAN_DEFAULTS = values.Static(None, False, 1, False)
_SCAN_CODE = _scan_launcher(None, None, False, 1, False).__code__


@functools.wraps(_stock_scan)
def scan(f, init, xs=None, length=None, reverse=False, unroll=1,
         _split_transpose=False):
  if not _routable():
    return _stock_scan(f, init, xs, length=length, reverse=reverse,
                       unroll=unroll, _split_transpose=_split_transpose)
  return _wrap(_scan_launcher(f, length, reverse, unroll, _split_transpose),
               f).launch((init, xs), _LONE)


def _run_map(params, f, xs):
  return _stock_map(f, xs, batch_size=params.value[0])


def _map_launcher(f, batch_size):
  params = _Static(batch_size)

  def launch_map(xs):
    return _run_map(params, f, xs)
  return launch_map


_MAP_CODE = _map_launcher(None, None).__code__


@functools.wraps(_stock_map)
def map(f, xs, *, batch_size=None):   # noqa: A001 -- mirrors jax.lax.map
  if not _routable():
    return _stock_map(f, xs, batch_size=batch_size)
  return _launch_rowless(_wrap(_map_launcher(f, batch_size), f), (xs,))


_NO_OPERAND = object()


def _run_cond(pred, true_fun, false_fun, operands):
  return _stock_cond(pred, true_fun, false_fun, *operands)


def _cond_launcher(true_fun, false_fun):
  def launch_cond(pred, *operands):
    return _run_cond(pred, true_fun, false_fun, operands)
  return launch_cond


@functools.wraps(_stock_cond)
def cond(pred, true_fun, false_fun, *operands, operand=_NO_OPERAND):
  if operand is not _NO_OPERAND or not _routable():
    if operand is _NO_OPERAND:
      return _stock_cond(pred, true_fun, false_fun, *operands)
    return _stock_cond(pred, true_fun, false_fun, *operands, operand=operand)
  return _wrap(_cond_launcher(true_fun, false_fun), true_fun).launch(
      (pred, *operands), _LONE)


def _first(branches):
  try:
    return branches[0]
  except Exception:   # stock reports what is wrong with ``branches``
    return None


def _run_switch(index, branches, operands):
  return _stock_switch(index, branches, *operands)


def _switch_launcher(branches):
  def launch_switch(index, *operands):
    return _run_switch(index, branches, operands)
  return launch_switch


#: The launchers whose stock call returns an operand its functions pass
#: through as given (a loop's carry; ``map``: its ``xs``, a ``scan``'s,
#: returned as its result; ``cond`` and ``switch``: one every branch
#: returns unchanged), and those of them that return a jax array operand
#: alone so (``_as_forwarded``).
_ARRAYS_ONLY_CODES = frozenset({
    _MAP_CODE, _cond_launcher(None, None).__code__,
    _switch_launcher(None).__code__})
_FORWARDING_CODES = frozenset({
    _SCAN_CODE, _while_launcher(None, None).__code__,
    _fori_launcher_of(None, None).__code__,
    _static_fori_launcher(None, None).__code__, *_ARRAYS_ONLY_CODES})


@functools.wraps(_stock_switch)
def switch(index, branches, *operands, operand=_NO_OPERAND):
  if operand is not _NO_OPERAND or not _routable():
    if operand is _NO_OPERAND:
      return _stock_switch(index, branches, *operands)
    return _stock_switch(index, branches, *operands, operand=operand)
  if type(branches) not in (list, tuple) or len(branches) == 1:
    # (a generator or map: stock's own error; one branch: stock calls it
    # itself, op by op)
    return _stock_switch(index, branches, *operands)
  return _wrap(_switch_launcher(branches), _first(branches)).launch(
      (index, *operands), _LONE - 1)


# Custom solves trace their functions into jaxprs on every eager call and
# bind a primitive whose implementation runs an inner while_loop: a fresh
# matvec (``jax.scipy.sparse.linalg.cg``) or objective meant a compile per
# call. Their launchers make the whole solve one cached executable.

def _run_linear_solve(params, matvec, b, solve, transpose_solve):
  symmetric, has_aux = params.value
  return _stock_custom_linear_solve(matvec, b, solve, transpose_solve,
                                    symmetric=symmetric, has_aux=has_aux)


def _linear_solve_launcher(matvec, solve, transpose_solve, symmetric, has_aux):
  params = _Static(symmetric, has_aux)

  def launch_custom_linear_solve(b):
    return _run_linear_solve(params, matvec, b, solve, transpose_solve)
  return launch_custom_linear_solve


@functools.wraps(_stock_custom_linear_solve)
def custom_linear_solve(matvec, b, solve, transpose_solve=None,
                        symmetric=False, has_aux=False):
  if not _routable():
    return _stock_custom_linear_solve(matvec, b, solve, transpose_solve,
                                      symmetric, has_aux)
  return _wrap(_linear_solve_launcher(matvec, solve, transpose_solve,
                                      symmetric, has_aux), matvec)(b)


def _run_root(params, f, initial_guess, solve, tangent_solve):
  return _stock_custom_root(f, initial_guess, solve, tangent_solve,
                            has_aux=params.value[0])


def _root_launcher(f, solve, tangent_solve, has_aux):
  params = _Static(has_aux)

  def launch_custom_root(initial_guess):
    return _run_root(params, f, initial_guess, solve, tangent_solve)
  return launch_custom_root


@functools.wraps(_stock_custom_root)
def custom_root(f, initial_guess, solve, tangent_solve, has_aux=False):
  if not _routable():
    return _stock_custom_root(f, initial_guess, solve, tangent_solve, has_aux)
  return _wrap(_root_launcher(f, solve, tangent_solve, has_aux), f)(
      initial_guess)


# JAX's iterative solvers set themselves up eagerly before their custom
# linear solve: an initial guess of zeros, a device_put, shape checks. A
# cached solve alone leaves that set-up, several times the solve's own run
# at small sizes, on every call. Where the set-up is exact (``cg`` and
# ``bicgstab``: allocation, placement and checks, no arithmetic; ``gmres``
# computes norms eagerly, and stays stock around its cached solve), the
# launcher makes the whole call one cached executable. Its initial guess
# is closed over, as stock's solve closes over it: a concrete array stock's
# trace hands the operator (``A(x0)``), lifted here (a trace asking its
# value is stock's), the zeros kept per kind of right-hand side
# (``values.zeros_like``). The tolerances and ``maxiter`` are static, by
# exact type and bits.

_stock_solvers = _compat.STOCK_SOLVERS
_exact_key = atoms.exact_key
_tree_map = _compat.jax.tree_util.tree_map


def _run_iterative(params, A, M, x0, b):
  name, tol, atol, maxiter, made = params.value[:5]
  if made and _top_level():
    # the stock form, run eagerly: stock's own zeros (the kept ones are
    # never handed to the user's operator, which could keep or delete them)
    x0 = None
  return _stock_solvers[name](A, b, x0, tol=tol, atol=atol, maxiter=maxiter,
                              M=M)


def _iterative_launcher(name, A, M, x0, made, tol, atol, maxiter):
  # (the caller checked the types: floats or ints, an int or None, a bool)
  tol_key, atol_key = _exact_key(tol, None), _exact_key(atol, None)
  params = values.exactly(
      (name, tol_key, atol_key, type(maxiter), maxiter, made),
      name, tol, atol, maxiter, made, tol_key, atol_key)

  def launch_iterative_solve(b):
    return _run_iterative(params, A, M, x0, b)
  return launch_iterative_solve


_TOLERANCE_TYPES = (float, int)


def _initial_guess(b, x0):
  """The initial guess stock's set-up closes over: ``x0`` where it is jax
  arrays alone (as stock's ``device_put`` leaves them), or zeros like
  ``b`` where every leaf's are kept (``values.zeros_like``: small); None
  for anything else, which stock answers as it is (its solve launched:
  zeros made here as well as by stock's set-up would cost a call more)."""
  if x0 is None and type(b) is _compat.ArrayImpl:   # the common call
    return values.zeros_like(b)
  if type(x0) is _compat.ArrayImpl:
    return x0
  try:
    if x0 is None:
      zeros = [values.zeros_like(x) for x in _tree_leaves(b)]
      if any(z is None for z in zeros):
        return None
      zeros = iter(zeros)
      return _tree_map(lambda _: next(zeros), b)
    leaves = _tree_leaves(x0)
  except Exception:   # stock's own error
    return None
  if all(type(x) is _compat.ArrayImpl for x in leaves):
    return x0
  return None


def _iterative(name):
  stock = _stock_solvers[name]

  @functools.wraps(stock)
  def solve(A, b, x0=None, *, tol=1e-5, atol=0.0, maxiter=None, M=None):
    if (not _routable() or type(tol) not in _TOLERANCE_TYPES
        or type(atol) not in _TOLERANCE_TYPES
        or maxiter is not None and type(maxiter) is not int):
      # (an array or NumPy tolerance: stock's, as it is)
      return stock(A, b, x0, tol=tol, atol=atol, maxiter=maxiter, M=M)
    guess = _initial_guess(b, x0)
    if guess is None:
      return stock(A, b, x0, tol=tol, atol=atol, maxiter=maxiter, M=M)
    return _wrap(_iterative_launcher(name, A, M, guess, x0 is None, tol, atol,
                                     maxiter), A)(b)
  return solve


#: name -> the cached solver, for the patch registry.
SOLVERS = types.MappingProxyType({name: _iterative(name)
                                  for name in _stock_solvers})


#: name -> the cached function, for the patch registry and ``lax``.
CACHED = types.MappingProxyType({"while_loop": while_loop, "fori_loop": fori_loop, "scan": scan,
          "map": map, "cond": cond, "switch": switch,
          "custom_linear_solve": custom_linear_solve,
          "custom_root": custom_root})
