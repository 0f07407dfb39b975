"""Layer two: the closure key inside JAX's memoized trace lookup.

JAX memoizes a trace in ``pe.trace_to_jaxpr``, a ``weakref_lru_cache`` keyed
on the function object: ``jax.jit``'s cache-miss path, ``.lower``, ``.trace``,
``.eval_shape`` and the control-flow functions (``while_loop``, ``scan``,
``cond``, ``switch``, ``fori_loop``, ``map``, custom solves) all trace
through it. A re-created closure is a new object, so each one traces again.

:func:`trace_to_jaxpr` puts a lookup keyed on the closure key
(``closure.analyse``) in front of it. For a function object it has not
answered before:

* the first object of a key is stock's own (identity first);
* the next one is traced once more with its lifted leaves (the arrays it
  closes over) as arguments, and the result is stored as a shared
  :class:`core.Jaxpr` in which those arguments are constvars;
* every later object with an equal key and equal leaf types gets a
  :class:`ClosedJaxpr` of that same ``Jaxpr`` closed over *its own* leaves.

A shared ``Jaxpr`` is what makes everything downstream share: the control-
flow functions ``pe.separate_consts`` it (cached on the ``Jaxpr``) and bind
their primitive with the same closed jaxprs, so eager dispatch
(``xla_primitive_callable``) finds one executable; and pjit, told by
:func:`separated` that the jaxpr is a shared one, passes the leaves as
arguments (the ``separate_consts`` branch of ``_trace_for_jit``) instead of
baking them, so one lowering and one executable serve every closure, and
the lowered text shows the leaves as parameters.

Invariants:

* A function object answered once is answered the same way again for the
  same signature (as stock's own cache would), whatever its closure holds
  later.
* An entry is stored only when the trace read nothing the key does not
  cover: no guard roots (objects kept by identity whose contents a trace
  may read), and no captured array other than a lifted leaf. Otherwise the
  trace is used for this call only.
* The store holds the shared jaxprs and their trace-time constants, and
  weak references to every object whose id is in a key: never a leaf.
"""

from __future__ import annotations

import threading
import types
import functools
import weakref
from typing import Any

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache import closure
from jax_closure_cache import closure_rebuild
from jax_closure_cache.closure import Uncacheable

# (closure key, leaf types, signature) -> _Shared
_store = cache.new_store("shared_traces")


class _Shared(cache.Entry):
  """A stored trace. For a key with leaves, ``closed`` is None while only
  the first object of the key has been seen (it went to stock); then the
  shared ``Jaxpr`` whose last ``n_leaves`` constvars are the leaves, the
  trace-time constants that precede them, the output types, and the
  separated form for pjit. For a key without, ``answer``: stock's."""
  __slots__ = ("closed", "consts", "out_avals", "lifted", "anchors",
               "n_leaves", "answer")

  def __init__(self):
    super().__init__()
    self.closed = None
    self.consts = ()
    self.out_avals = None
    self.lifted = None
    self.anchors = []
    self.n_leaves = 0
    self.answer = None   # with nothing to lift: stock's answer, shared


# Function objects routed to stock, and the answers given to the others,
# per signature: identity first, as stock's own cache would answer.
_stock_objects: "weakref.WeakSet" = weakref.WeakSet()
_answered: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
cache.register_clear_hook(_answered.clear)

# The separated form of each shared jaxpr (pjit reads it): Jaxpr -> _Shared.
_shared_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
cache.register_clear_hook(_shared_of.clear)

_lock = threading.Lock()
_HANDLED = (types.FunctionType, functools.partial)


# Code objects of this package's own traced wrappers (a shared entry's
# lifted function, a launcher's body): their closures are bookkeeping, not
# the user's, so they go straight to stock.
_own_codes: set = set()


def own_code(code) -> None:
  """Route functions with ``code`` to stock (see :data:`_own_codes`)."""
  _own_codes.add(code)


def trace_to_jaxpr(fun, in_avals, debug_info, *context_for_cache_key,
                   **options):
  """``pe.trace_to_jaxpr`` with the closure-keyed lookup in front."""
  stock = _compat.STOCK_TRACE_TO_JAXPR
  if (options or type(fun) not in _HANDLED
      or getattr(fun, "__code__", None) in _own_codes
      # jax's, numpy's and the standard library's own functions are one
      # object each: stock's cache on the object is all they need
      or (type(fun) is types.FunctionType and fun.__closure__ is None
          and closure.is_stable(fun))):
    return stock(fun, in_avals, debug_info, *context_for_cache_key, **options)
  try:
    if fun in _stock_objects:
      return stock(fun, in_avals, debug_info, *context_for_cache_key)
    sig = (in_avals, debug_info, context_for_cache_key,
           _compat.trace_context())
    memo = _answered.get(fun)
    if memo is not None:
      found = memo.get(sig)
      if found is not None:
        return found
  except TypeError:   # an unhashable static argument: stock's error
    return stock(fun, in_avals, debug_info, *context_for_cache_key)
  out, then_store = _lookup(fun, in_avals, debug_info, context_for_cache_key,
                            sig)
  if out is None:
    _stock_objects.add(fun)
    out = stock(fun, in_avals, debug_info, *context_for_cache_key)
    if then_store is not None:
      _store_stock_answer(*then_store, out)
    return out
  _answered.setdefault(fun, {})[sig] = out
  return out


def _lookup(fun, in_avals, debug_info, ctx, sig):
  """``(answer, None)`` from the store (tracing the lifted form once when
  the key has been seen before), or ``(None, then_store)`` for stock: the
  first object of a key, or one the key cannot serve. ``then_store`` is
  ``(key, analysis)`` when stock's answer itself is to be shared (a key
  with nothing to lift: any object with it traces the same)."""
  try:
    a = closure.analyse(fun)
  except (Uncacheable, TypeError):
    return None, None
  if a.roots:
    return None, None   # objects whose contents the key does not cover
  try:
    leaf_types = tuple(map(_compat.typeof, a.leaves))
    key = (a.key, leaf_types, sig)
    shared = _store.get(key)
  except TypeError:
    return None, None
  if not a.leaves:
    if shared is None:
      return None, (key, a)
    return shared.answer, None
  if shared is None:
    # The first object of this key: stock's own. Remember the key was seen.
    first = _Shared()
    held = _hold(key, first, a.anchors)
    if held is not None:
      first.anchors = held
      _store.put(key, first)
    return None, None
  if shared.closed is None:
    traced = _trace_lifted(fun, a, leaf_types, in_avals, debug_info, ctx)
    if traced is None:
      return None, None
    shared = _store_trace(key, a, traced) or traced
  return (_compat.ClosedJaxpr(shared.closed, [*shared.consts, *a.leaves]),
          shared.out_avals), None


def call_shared(fun, a, leaves, args, kwargs):
  """Inside a trace (a shared entry's lifted function): ``fun(*args,
  **kwargs)`` with ``fun``'s lifted leaves (``a``, its analysis) replaced by
  ``leaves``, evaluated from the shared jaxpr of its key, which is traced
  (and stored) here if it is not stored yet. The store is the one pjit's
  lookup reads, with pjit's own signature (``jit`` debug info, no static
  arguments), so ``.trace``, ``.lower`` and ``.eval_shape`` of any closure
  of the key find what calls stored. Returns None when the lifted trace
  fails (the caller traces ``fun`` itself, which raises as stock would)."""
  args_ft = _compat.FlatTree.flatten_static_argnums_argnames(
      args, kwargs, (), ())
  in_avals = args_ft.map(_compat.typeof)
  if any(aval.has_qdd for aval in in_avals):
    return None
  debug_info = _compat.jit_debug_info(fun, args, kwargs)
  ctx = (0,)   # pjit's quasi-dynamic-data index, 0 without mutable arrays
  try:
    sig = (in_avals, debug_info, ctx, _compat.trace_context())
    leaf_types = tuple(map(_compat.typeof, leaves))
    key = (a.key, leaf_types, sig)
    shared = _store.get(key)
  except TypeError:
    return None
  if shared is None or shared.closed is None:
    traced = _trace_lifted(fun, a, leaf_types, in_avals, debug_info, ctx)
    if traced is None:
      return None
    shared = _store_trace(key, a, traced) or traced
  out = _compat.eval_jaxpr(shared.closed, [*shared.consts, *leaves],
                           *args_ft.vals)
  return shared.out_avals.update(out).unflatten()


def _store_stock_answer(key, a, answer) -> None:
  """Share stock's answer for a key with nothing to lift, if its trace
  captured no array (one the key does not cover could change)."""
  closed, _ = answer
  if not _covered(closed.consts, a):
    return
  shared = _Shared()
  shared.answer = answer
  held = _hold(key, shared, a.anchors)
  if held is None:
    return
  shared.anchors = held
  _store.put(key, shared)


def _covered(consts, a) -> bool:
  """Whether every captured constant is a value the key covers: no tracer,
  and no array but the analysed function's own leaves and anchors."""
  covered = {id(x) for x in a.anchors}
  covered.update(id(x) for x in a.leaves)
  for c in consts:
    if isinstance(c, _compat.Tracer):
      return False
    if isinstance(c, _compat.jax.Array) and id(c) not in covered:
      return False
  return True


def _trace_lifted(fun, a, leaf_types, in_avals, debug_info, ctx):
  """Trace ``fun`` with its leaves as arguments; a :class:`_Shared` (not
  stored yet), or None if that trace fails (then stock traces it)."""
  key = a.key

  def lifted(leaves, *args, **kwargs):
    return closure_rebuild.rebuild(fun, key, leaves)(*args, **kwargs)
  _own_codes.add(lifted.__code__)

  args_ft, kwargs_ft = in_avals.unpack()
  lifted_in = _compat.FlatTree.pack(
      ((_compat.FlatTree.flatten(list(leaf_types)), *args_ft.unpack()),
       kwargs_ft))
  names = debug_info.arg_names
  lifted_debug = debug_info._replace(
      arg_names=None if names is None else ("",) * len(leaf_types) + names)
  try:
    closed, out_avals = _compat.STOCK_TRACE_TO_JAXPR(
        lifted, lifted_in, lifted_debug, *ctx)
  except Exception:
    # The trace needs a leaf's value (a Python ``if`` on it, ``float(w)``):
    # stock traces this object with its arrays as constants.
    return None
  n = len(leaf_types)
  jaxpr = closed.jaxpr
  leaf_vars, arg_vars = jaxpr.invars[:n], jaxpr.invars[n:]
  shared = _Shared()
  shared.n_leaves = n
  shared.consts = tuple(closed.consts)
  shared.out_avals = out_avals
  # The user's own debug info (arg names without the leaves), with the
  # result paths the trace found.
  result_debug = debug_info._replace(
      result_paths=jaxpr.debug_info.result_paths)
  shared.closed = jaxpr.replace(
      constvars=[*jaxpr.constvars, *leaf_vars], invars=arg_vars,
      debug_info=result_debug)
  shared.lifted = closed
  return shared


def _store_trace(key, a, shared: _Shared):
  """Store ``shared`` under ``key`` if its trace read only what the key
  covers; returns it, or None (then it serves this call only)."""
  if not _covered(shared.consts, a):
    return None   # an array the key does not cover: it could change
  held = _hold(key, shared, a.anchors)
  if held is None:
    return None
  shared.anchors = held
  with _lock:
    _shared_of[shared.closed] = shared
    _lifted_jaxprs.add(shared.lifted)
  _store.put(key, shared)
  return shared


def _hold(key, entry, anchors):
  from jax_closure_cache import closure_jit
  held = closure_jit._hold_weakly(_store, key, entry, anchors)
  return None if isinstance(held, str) else held


def separated(closed_jaxpr):
  """For a :class:`ClosedJaxpr` this module answered with: the shared
  jaxpr with the leaves as its first arguments (and the trace-time
  constants still closed over), and the leaves; else None."""
  shared = _shared_of.get(closed_jaxpr.jaxpr)
  if shared is None:
    return None
  consts = closed_jaxpr.consts
  return shared.lifted, list(consts[len(consts) - shared.n_leaves:])


# -- pjit: the leaves as arguments of one executable ---------------------------

_lifted_jaxprs: "weakref.WeakSet" = weakref.WeakSet()   # every shared.lifted
_pending = threading.local()   # the leaves of the call pjit is inferring


def trace_for_jit(fun, ji, ctx_mesh, dbg, avals, args, kwargs):
  """pjit's ``_trace_for_jit``, then, for a shared jaxpr, its
  ``separate_consts`` branch: the leaves become the first arguments (with
  unspecified shardings and layouts, never donated) of the one lowering
  every closure of the key uses."""
  p = _compat.STOCK_TRACE_FOR_JIT(fun, ji, ctx_mesh, dbg, avals, args, kwargs)
  if p.consts:
    return p
  found = separated(p.params["jaxpr"])
  if found is None:
    return p
  lifted, leaves = found
  n = len(leaves)
  params = dict(p.params)
  params["jaxpr"] = lifted
  params["in_shardings"] = (_compat.UNSPECIFIED,) * n + p.params["in_shardings"]
  params["in_layouts"] = (None,) * n + p.params["in_layouts"]
  params["donated_invars"] = (False,) * n + p.params["donated_invars"]
  return p._replace(consts=leaves, params=params)


def infer_params(fun, ji, args, kwargs):
  """pjit's ``_infer_params``, noting the leaves a shared jaxpr takes, for
  :func:`get_fastpath_data` right after."""
  _pending.consts = None
  p, args_flat = _compat.STOCK_INFER_PARAMS(fun, ji, args, kwargs)
  if p.consts and p.params["jaxpr"] in _lifted_jaxprs:
    # weakly: ``.trace()`` infers too, and nothing consumes it then
    try:
      _pending.consts = [weakref.ref(c) for c in p.consts]
    except TypeError:   # then no C++ fast path (get_fastpath_data)
      pass
  return p, args_flat


def get_fastpath_data(executable, out_tree, args_flat, out_flat, effects,
                      consts_for_constvars, pgle_profiler, const_args):
  """pjit's ``_get_fastpath_data``; for a shared jaxpr the leaves go into
  the C++ fast path's ``const_args`` (which it passes before the call's own
  arguments), so later calls of this jitted object pass them too."""
  consts = getattr(_pending, "consts", None)
  _pending.consts = None
  n = len(consts) if consts else 0
  if n and len(args_flat) >= n and all(
      a is c() for a, c in zip(args_flat, consts)):
    if not all(type(c) is _compat.ArrayImpl for c in consts):
      return None   # the C++ path takes arrays only: stay on Python's
    return _compat.STOCK_GET_FASTPATH_DATA(
        executable, out_tree, args_flat[n:], out_flat, effects,
        consts_for_constvars, pgle_profiler, [*const_args, *args_flat[:n]])
  return _compat.STOCK_GET_FASTPATH_DATA(
      executable, out_tree, args_flat, out_flat, effects,
      consts_for_constvars, pgle_profiler, const_args)


def dedup_consts(jaxpr, num_consts, const_ids):
  """The control-flow ``_dedup_consts``, cached on which constants are the
  same object rather than on their ids: the jaxpr it builds depends only on
  that pattern, so branches closed over new arrays with the same sharing
  find the jaxpr built before (the same one, as eager dispatch needs)."""
  first: dict = {}
  pattern = tuple([first.setdefault(i, k) for k, i in enumerate(const_ids)])
  return _compat.STOCK_DEDUP_CONSTS(jaxpr, num_consts, pattern)


def traced_lower(traced, **options):
  """``Traced.lower``; for a shared jaxpr, the ``Lowered`` passes the
  closure's leaves after the jaxpr's own hoisted constants, so
  ``.lower(x).compile()(x)`` takes the user's arguments alone. The lowering
  itself (cached, shared by every closure of the key) is not modified."""
  lowered = _compat.STOCK_TRACED_LOWER(traced, **options)
  if traced._consts and traced.jaxpr in _lifted_jaxprs:
    lowered._lowering = _WithLeaves(lowered._lowering, traced._consts)
  return lowered


class _WithLeaves:
  """A lowering seen with a closure's leaves appended to its
  ``const_args``; everything else is the shared lowering's."""

  def __init__(self, lowering, leaves):
    self._shared = lowering
    self.const_args = [*lowering.const_args, *leaves]

  def __getattr__(self, name):
    return getattr(self._shared, name)


#: The replacement of each of ``_compat.TRACE_PATCH_POINTS``.
REPLACEMENTS = {"trace_to_jaxpr": trace_to_jaxpr,
                "_trace_for_jit": trace_for_jit,
                "_infer_params": infer_params,
                "_get_fastpath_data": get_fastpath_data,
                "_dedup_consts": dedup_consts,
                "lower": traced_lower}
