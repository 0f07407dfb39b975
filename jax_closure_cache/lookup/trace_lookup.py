"""Layer two: the closure key inside JAX's memoized trace lookup, glued in.

The lookup itself is ``lookup/closure_cache.py`` over the key of
``key/closure_key.py``. This module puts it into JAX by replacing the
functions involved (``_compat.trace.TRACE_PATCH_POINTS``):

* ``pe.trace_to_jaxpr``: looked up by closure key first
  (``closure_cache.trace_to_jaxpr``); jit's cache-miss path, ``.trace``,
  ``.lower``, ``.eval_shape`` and every control-flow function trace
  through it, so re-created closures share one ``Jaxpr``.
* pjit's ``_trace_for_jit``: a shared jaxpr's constants (trace-time ones and
  the closure's arrays) become arguments, as its ``separate_consts`` branch
  does for tracers, so one lowering serves every closure of the key;
  ``_get_fastpath_data`` gives the C++ fast path of
  each jitted object those arguments as its ``const_args``.
* ``Traced.lower``: the ``Lowered`` passes them first, so
  ``.lower(x).compile()(x)`` takes the user's arguments alone.
* control flow's ``_dedup_consts``: keyed on which constants are the same
  object rather than on their ids.

:func:`call_shared` is the front's way in (layer three): a shared entry's
lifted function evaluates the shared jaxpr, so calls and ahead-of-time use
share one trace.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import threading
import types

from jax_closure_cache import _compat
from jax_closure_cache._compat import lowering as _lowering
from jax_closure_cache import cache
from jax_closure_cache.key import closure
from jax_closure_cache.key import rebuild

from jax_closure_cache.key import closure_key   # noqa: F401 (patching reads it here)
from jax_closure_cache.lookup import closure_cache



#: The walk and rebuild the closure key uses while enabled (a patch point in
#: both modes): the package's, which key what JAX's leave to stock (plain
#: objects, attribute chains, classes by namespace, this package's own
#: module-level functions by identity) with the rules of ``key/``.
RULES = cache.STORE.own("trace_lookup.RULES", [closure.Analysis, rebuild.Rebuild],
                        cache.Store.REGISTRY)


def is_shared(closed_jaxpr) -> bool:
  """The trace lookup's ``is_shared`` while the front is installed (a patch
  point in both modes): a shared jaxpr met by pjit in an *eager* call is
  treated as stock's. The front's own entries answer re-created closures
  there (and hand long-lived ones to stock); a stock jitted object that
  reaches pjit eagerly (made before ``enable()``, or by library code) keeps
  stock's executable with its constants in it, since passing a closure's
  arrays as arguments on every call of a long-lived object costs about a
  microsecond per array (1 ms for 1,000 arrays against stock's 9 µs).
  Inside a trace the shared jaxpr's constants become operands of the outer
  computation, which costs nothing per call."""
  return _STOCK_IS_SHARED(closed_jaxpr) and not _compat.trace_state_clean()


_STOCK_IS_SHARED = closure_cache.is_shared


def own_code(code) -> None:
  """Route functions with ``code`` (this package's own traced wrappers,
  whose closures are bookkeeping) to stock."""
  closure_cache.own_codes.add(code)


#: Set while pjit traces for a jitted object that donates arguments: XLA
#: warns of unusable donated buffers at every compile, and stock compiles
#: per function object, so such traces are never shared (a shared jaxpr
#: would find pjit's executable and skip the compile and its warning).
_unshared = threading.local()


@contextlib.contextmanager
def unshared():
  """Within: every trace is stock's own (verify mode's answer on a
  mismatch), never a shared one."""
  saved, _unshared.on = getattr(_unshared, "on", False), True
  try:
    yield
  finally:
    _unshared.on = saved


def _looked_up(fun, in_avals, debug_info, *context_for_cache_key, **options):
  _calls.n = getattr(_calls, "n", 0) + 1
  # (stock's while stock reports per trace, ``STOCK_REPORTS``: with NaN or
  # Inf checks on, an eager primitive run on a trace this lookup shares is
  # answered by JAX's cache of that primitive, whose compiled call skips
  # the checks a new trace's first call makes; a shared trace logs no
  # checkpoint residuals and warns of no raw key)
  if getattr(_unshared, "on", False) or _lowering.reports_per_trace():
    traced = _compat.trace.STOCK_TRACE_TO_JAXPR(
        fun, in_avals, debug_info, *context_for_cache_key, **options)
  else:
    traced = closure_cache.trace_to_jaxpr(
        _compat.trace.STOCK_TRACE_TO_JAXPR, fun, in_avals, debug_info,
        *context_for_cache_key, **options)
  if getattr(fun, "__code__", None) in closure_cache.own_codes:
    # A lifted function's trace lives as long as its stored entry, longer
    # than the user's function would keep stock's. JAX converts a NumPy
    # constant through a cache keyed weakly on the array, whose answer
    # lives while anything holds it: this trace (in pjit's caches and this
    # one) keeps copies, so a later stock trace over the array, changed in
    # place since, converts it again as it would without the package.
    _compat.own_constants_in_place(traced[0])
  return traced


# The closure-keyed lookup inside a cache on the function object: identity
# first.
_cached = _compat.weakref_lru_cache(_looked_up)
# dropped by clear() (and so by ``jax.clear_caches()``, as stock's
# ``trace_to_jaxpr`` cache), not by release_traces(): stock keeps these
cache.STORE.own("trace_lookup.cached", _cached, cache.Store.CALLS)


def trace_to_jaxpr(fun, in_avals, debug_info, *context_for_cache_key,
                   **options):
  """``pe.trace_to_jaxpr`` with the closure-keyed lookup for a function it
  has not answered; ``clear_cache()`` of a jitted function (``evict_weakref``)
  and JAX's tests (``cache_clear``, ``cache_info``) reach both caches."""
  before = getattr(_calls, "n", 0)
  out = _cached(fun, in_avals, debug_info, *context_for_cache_key, **options)
  if getattr(_calls, "n", 0) == before:   # JAX's cache of ``fun`` answered
    closure_cache.note_cached_answer(fun)
  seen = getattr(_collected, "jaxprs", None)
  if seen is not None and _compat.trace_state_clean():
    seen.append(out[0])
  return out


@contextlib.contextmanager
def collecting():
  """Within, on this thread: the jaxprs every trace lookup made outside
  any other trace returns (traced or answered by a cache) are appended to
  the list yielded; nested blocks see their own. What stock's eager
  control flow traced of a body, read after it ran, with no trace of its
  own. (A trace made inside another, such as JAX's lowering of the eager
  primitive, may close over that trace's tracers: kept here, they would
  outlive it, which ``jax.checking_leaks()`` reports; a jaxpr inside the
  body's is read with it.)"""
  saved, _collected.jaxprs = getattr(_collected, "jaxprs", None), []
  try:
    yield _collected.jaxprs
  finally:
    _collected.jaxprs = saved


_collected = threading.local()


# traces looked up on this thread (``_looked_up`` calls): unchanged across a
# call of ``_cached``, its cache answered
_calls = threading.local()


def _evict_weakref(fun) -> None:
  _cached.evict_weakref(fun)
  _compat.trace.STOCK_TRACE_TO_JAXPR.evict_weakref(fun)
  closure_cache.evict(fun)


def _cache_clear() -> None:
  _cached.cache_clear()
  _compat.trace.STOCK_TRACE_TO_JAXPR.cache_clear()


trace_to_jaxpr.evict_weakref = _evict_weakref
trace_to_jaxpr.cache_clear = _cache_clear


def call_shared(fun, a, leaves, args, kwargs):
  """Inside a trace (a shared entry's lifted function): ``fun(*args,
  **kwargs)`` with ``fun``'s arrays replaced by ``leaves`` (tracers, in the
  order of ``a``, the front's analysis of ``fun``), evaluated from the
  shared jaxpr of ``fun``'s closure key if the lookup stores one (put there
  by ``.trace``/``.lower`` through the lookup, or by :func:`publish` after
  an entry's own trace). None otherwise, or when the trace lookup cannot
  serve ``fun`` (as on a jax without layer two's seams): then the caller
  traces ``fun`` itself, so an entry's miss traces once, as stock's does."""
  found = _stored(fun, a, args, kwargs)
  if found is None:
    return None
  args_ft, shared = found
  out = _compat.trace.eval_jaxpr(shared.jaxpr, [*shared.consts, *leaves],
                                 *args_ft.vals)
  return shared.out_avals.update(out).unflatten()


def publish(fun, a, traced, args, kwargs) -> None:
  """Store a front entry's own trace as the shared trace of ``fun``'s key:
  ``traced`` is the ``Traced`` of the entry's lifted function (leaves first,
  then ``args`` and ``kwargs``), which is what the lookup's own lifted
  trace makes. Then ``.trace``, ``.lower`` and ``.eval_shape`` of any
  closure of the key find it, and no second trace is made for them. Only
  outside a trace and for a trace that separated no constants; a key that
  has a stored trace, or whose trace captured what it does not cover, is
  left as it is (``closure_cache.trace_shared`` decides, as for its own).
  The front stores an entry, and publishes it, only where the key taken
  after its trace is the one it was looked up under."""
  if (not _compat.trace.TRACE_LOOKUP or not _compat.trace_state_clean()
      or _compat.separated_constants(traced)
      # its output's classes would unflatten types (user code, run where
      # stock runs none)
      or closure.argument_classes(traced.out_tree)):
    return
  found = _key_of(fun, a, args, kwargs, list(traced.jaxpr.in_avals))
  if found is None or found[1][3] is not None:
    return
  _, (key, leaves, anchors, _), in_avals, debug_info = found
  tree_util = _compat.jax.tree_util
  out_avals = _compat.trace.flat_trees.flatten(tree_util.tree_unflatten(
      traced.out_tree, traced.jaxpr.out_avals))
  closure_cache.trace_shared(
      lambda *_: (traced.jaxpr, out_avals), None, closure.as_method(fun) or fun,
      key, leaves, anchors, in_avals, debug_info,
      _compat.trace.PJIT_TRACE_CONTEXT, checked_after=True)


def _stored(fun, a, args, kwargs):
  """``(the arguments' FlatTree, the stored shared trace)`` of ``fun``'s key
  for these arguments, or None."""
  found = _key_of(fun, a, args, kwargs)
  if found is None or found[1][3] is None:
    return None
  args_ft, (key, leaves, anchors, shared), in_avals, debug_info = found
  shared = closure_cache.trace_shared(None, shared, fun, key, leaves, anchors,
                                      in_avals, debug_info,
                                      _compat.trace.PJIT_TRACE_CONTEXT)
  return None if shared is None else (args_ft, shared)


def _key_of(fun, a, args, kwargs, avals=None):
  """``(args FlatTree, closure_cache.find's answer, in_avals, debug_info)``
  for ``fun`` (walked as ``a``) called with ``args`` and ``kwargs`` as pjit
  calls it (``jit`` debug info, no static arguments; ``avals``: the flat
  leaves' and arguments' types, else the arguments' own), or None."""
  if not _compat.trace.TRACE_LOOKUP:
    return None
  args_ft = _compat.trace.flat_trees.flatten_static_argnums_argnames(
      args, kwargs, (), ())
  in_avals = (args_ft.map(_compat.trace.typeof) if avals is None else
              args_ft.update(avals[len(a.leaves):]))
  if any(map(_compat.trace.stateful_aval, in_avals)):
    return None
  debug_info = _compat.trace.jit_debug_info(fun, args, kwargs)
  try:
    sig = closure_cache.signature(in_avals, debug_info,
                                  _compat.trace.PJIT_TRACE_CONTEXT)
  except closure_key.Unkeyable:   # (the entry's trace is not shared)
    return None
  found = closure_cache.find(closure.as_method(fun) or fun, sig,
                             (a.key, a.leaves, a.anchors), RULES)
  if found is None or not found[1]:
    return None
  return args_ft, found, in_avals, debug_info


# -- pjit: the leaves as arguments of one executable ---------------------------

def _shared_constants(consts) -> bool:
  """Whether pjit's separated constants are a shared jaxpr's: outside a trace only a shared jaxpr separates constants that are
  all arrays (stock separates tracers, and references with their state)."""
  return bool(consts) and all(type(c) is _compat.ArrayImpl for c in consts)


def trace_for_jit(fun, ji, ctx_mesh, dbg, avals, args, kwargs):
  """pjit's ``_trace_for_jit``, then, for a shared jaxpr, its
  ``separate_consts`` branch: the constants become the first arguments
  (with unspecified shardings and layouts, never donated) of the one
  lowering every closure of the key uses."""
  if _compat.trace.donates(ji):
    saved, _unshared.on = getattr(_unshared, "on", False), True
    try:
      return _compat.trace.STOCK_TRACE_FOR_JIT(
          fun, ji, ctx_mesh, dbg, avals, args, kwargs)
    finally:
      _unshared.on = saved
  p = _compat.trace.STOCK_TRACE_FOR_JIT(fun, ji, ctx_mesh, dbg, avals, args, kwargs)
  if (p.consts or not closure_cache.is_shared(p.params["jaxpr"])
      # inside another trace the constants stay the callee's, as stock's
      # trace keeps them: XLA folds with them there, not with operands
      # (``jax.jit(lambda: d * 1e-10)()`` in a jit: a subnormal kept)
      or not _compat.trace_state_clean()):
    return p
  jaxpr, consts = _compat.trace.separate_shared(
      p.params["jaxpr"], closure_cache.shared_jaxpr(p.params["jaxpr"]))
  n = len(consts)
  params = dict(p.params)
  params["jaxpr"] = jaxpr
  params["in_shardings"] = (_compat.UNSPECIFIED,) * n + p.params["in_shardings"]
  params["in_layouts"] = (None,) * n + p.params["in_layouts"]
  params["donated_invars"] = (False,) * n + p.params["donated_invars"]
  return p._replace(consts=list(consts), params=params)


def separate_consts(jaxpr):
  """``pe.separate_consts`` where a closed jaxpr is its own object (0.11):
  a shared one is separated as the jaxpr its key's closures share, so
  control flow and pjit see one jaxpr for all of them."""
  shared = closure_cache.shared_jaxpr(jaxpr)
  if shared is None:
    return _compat.trace.STOCK_SEPARATE_CONSTS(jaxpr)
  return _compat.trace.separate_shared(jaxpr, shared)


def get_fastpath_data(executable, out_tree, args_flat, out_flat, effects,
                      consts_for_constvars, pgle_profiler, const_args):
  """pjit's ``_get_fastpath_data``; for a shared jaxpr the leaves go into
  the C++ fast path's ``const_args`` (which it passes before the call's own
  arguments), so later calls of this jitted object pass them too.

  Only for the call from pjit's ``cache_miss``, whose own ``p`` (the params
  it inferred, read from its frame) says which leading arguments are the
  shared jaxpr's constants: ``_pjit_call_impl`` calls this too, for a jaxpr
  bound as a primitive (under ``jvp``, say), and there every argument is
  the primitive's own, whatever an enclosing call inferred."""
  p = _compat.trace.pjit_params_of_caller(sys._getframe(1))
  consts = () if p is None else p.consts
  n = len(consts)
  if _shared_constants(consts):
    if len(args_flat) >= n and all(map(operator.is_, args_flat, consts)):
      return _compat.trace.STOCK_GET_FASTPATH_DATA(
          executable, out_tree, args_flat[n:], out_flat, effects,
          consts_for_constvars, pgle_profiler, [*const_args, *args_flat[:n]])
    return None   # no fast path: every call takes cache_miss, as it must
  return _compat.trace.STOCK_GET_FASTPATH_DATA(
      executable, out_tree, args_flat, out_flat, effects,
      consts_for_constvars, pgle_profiler, const_args)


def dedup_consts(jaxpr, num_consts, const_ids):
  """The control-flow ``_dedup_consts``, cached on which constants are the
  same object rather than on their ids: the jaxpr it builds depends only on
  that pattern, so branches closed over new arrays with the same sharing
  find the jaxpr built before (the same one, as eager dispatch needs)."""
  first: dict = {}
  pattern = tuple([first.setdefault(i, k) for k, i in enumerate(const_ids)])
  return _compat.trace.STOCK_DEDUP_CONSTS(jaxpr, num_consts, pattern)


def traced_lower(traced, **options):
  """``Traced.lower``; for a shared jaxpr, the ``Lowered`` passes the
  closure's leaves after the jaxpr's own hoisted constants, so
  ``.lower(x).compile()(x)`` takes the user's arguments alone. The lowering
  itself (cached, shared by every closure of the key) is not modified."""
  lowered = _compat.trace.STOCK_TRACED_LOWER(traced, **options)
  consts = _compat.separated_constants(traced)
  if _shared_constants(consts):
    _compat.trace.set_lowering(lowered,
                         _WithLeaves(_compat.trace.lowering_of(lowered), consts))
  return lowered


def lowered_with_leaves(lowered, leaves):
  """``lowered`` (of a lifted function taking ``leaves`` first) as the
  ``Lowered`` of the user's function: its arguments' info without the
  leaves, which it passes after the lowering's own constants. The lowering
  (pjit's cached one, whose executable the calls compiled) is not
  modified."""
  (_, *args_info), kwargs_info = lowered.args_info
  args_info = (tuple(args_info), kwargs_info)
  in_types = _compat.trace.lowered_in_types(lowered)
  if in_types is not None:
    in_types = (_compat.trace.tree_structure(args_info), in_types[1][len(leaves):])
  return _compat.trace.relowered(
      lowered, _WithLeaves(_compat.trace.lowering_of(lowered), leaves), args_info,
      in_types)


class _WithLeaves:
  """A lowering seen with a closure's leaves appended to its
  ``const_args``; everything else is the shared lowering's, but for what
  ``Lowered.in_avals`` reads of its ``compile_args``, where the leaves (the
  first arguments of the shared lowering) are taken out as constants are."""

  def __init__(self, lowering, leaves):
    self._shared = lowering
    self._n = len(leaves)
    self.const_args = [*lowering.const_args, *leaves]

  @property
  def compile_args(self):
    args = dict(self._shared.compile_args)
    n = self._n
    args["global_in_avals"] = list(args["global_in_avals"])[n:]
    args["kept_var_idx"] = {i - n for i in args["kept_var_idx"] if i >= n}
    args["all_args_info"] = _ArgsInfo(args["all_args_info"].in_avals[n:])
    return args

  def __getattr__(self, name):
    return getattr(self._shared, name)


class _ArgsInfo:
  """What ``Lowered.in_avals`` reads of pxla's ``all_args_info``."""

  def __init__(self, in_avals):
    self.in_avals = in_avals


def _with_cache_api(replacement, original):
  """``replacement`` with the cache methods ``original`` (a JAX cache)
  offers and it lacks, calling through to it (JAX's own tests clear caches
  by name)."""
  for name in ("cache_clear", "cache_info", "cache_keys", "evict_weakref"):
    if hasattr(original, name) and not hasattr(replacement, name):
      setattr(replacement, name, getattr(original, name))
  return replacement


_with_cache_api(trace_to_jaxpr, _cached)
_with_cache_api(dedup_consts, _compat.trace.STOCK_DEDUP_CONSTS)


#: The replacement of each of ``_compat.trace.TRACE_PATCH_POINTS``.
REPLACEMENTS = types.MappingProxyType({"trace_to_jaxpr": trace_to_jaxpr,
                "_trace_for_jit": trace_for_jit,
                "_get_fastpath_data": get_fastpath_data,
                "_dedup_consts": dedup_consts,
                "lower": traced_lower,
                "separate_consts": separate_consts})
