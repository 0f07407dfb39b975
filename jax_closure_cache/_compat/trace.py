"""JAX's private seams that layer two (``lookup/``: the closure key inside
JAX's trace lookup) reads and replaces: ``pe.trace_to_jaxpr``, the pjit
functions around it, ``Traced.lower`` and ``Lowered``'s parts, cond's
constant dedup, and what evaluating a shared jaxpr needs.

Invariants: nothing else in the package imports these JAX modules (the
rest of the compat layer is ``_compat/__init__.py``); ``TRACE_LOOKUP_MISSING``
lists, by feature, every seam the running jax lacks, and layer two is
installed only where it is empty.
"""

from __future__ import annotations

import jax
import numpy as _np
from jax._src import api as _api
from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import pjit as _pjit
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import common as _control_flow_common
from jax._src import stages as _stages
import inspect as _inspect
import threading
import weakref as _weakref
try:   # 0.10: a class in tree_util, its constructors static methods
  from jax._src.tree_util import FlatTree as flat_trees
except ImportError:   # 0.11: a module of the same functions
  from jax._src import flattree as flat_trees

#: ``pe.trace_to_jaxpr`` (a ``weakref_lru_cache`` keyed on the function) and
#: the pjit functions around it, as JAX defines them.
STOCK_TRACE_TO_JAXPR = _pe.trace_to_jaxpr
STOCK_TRACE_FOR_JIT = _pjit._trace_for_jit
STOCK_GET_FASTPATH_DATA = _pjit._get_fastpath_data
#: ``cond``/``switch`` merge their branches' constants with this, cached on
#: the constants' ids (so on every call's own arrays).
STOCK_DEDUP_CONSTS = _control_flow_common._dedup_consts
#: ``Traced.lower``: its ``Lowered`` carries only the jaxpr's own hoisted
#: constants as the arguments ``Compiled`` passes first.
STOCK_TRACED_LOWER = _stages.Traced.lower
Lowered = _stages.Lowered


def lowering_of(lowered):
  """The lowering a ``Lowered`` compiles (its ``const_args`` passed first)."""
  return lowered._lowering


def set_lowering(lowered, lowering) -> None:
  lowered._lowering = lowering


def relowered(lowered, lowering, args_info, in_types):
  """A ``Lowered`` like ``lowered`` over ``lowering``, with its arguments'
  info and ``(in_tree, in_avals)`` replaced."""
  return Lowered(lowering, args_info, lowered.out_tree, lowered._no_kwargs,
                 in_types, lowered._out_types)


def lowered_in_types(lowered):
  """``(in_tree, in_avals)`` of a ``Lowered``'s flat arguments, or None."""
  return lowered._in_types


ClosedJaxpr = _core.ClosedJaxpr
Jaxpr = _core.Jaxpr
#: 0.11 merged ``ClosedJaxpr`` into ``Jaxpr``: a jaxpr carries its constants,
#: and closing one over new constants makes a new object.
MERGED_JAXPR = ClosedJaxpr is Jaxpr
tree_structure = jax.tree_util.tree_structure
separate_consts = getattr(_pe, "separate_consts", None)
typeof = _core.typeof
eval_jaxpr = _core.eval_jaxpr
trace_context = _config.trace_context


def separate_shared(closed, shared):
  """pjit's ``separate_consts`` for a closed jaxpr the trace lookup shares
  (``shared``: the jaxpr every closure of the key is closed from): the
  jaxpr taking the constants as its first arguments, the same object for
  every closure (so one lowering serves them all), and the constants."""
  if not MERGED_JAXPR:   # cached on ``closed.jaxpr``, which is ``shared``
    return separate_consts(closed)
  # 0.11 caches it on each closure's own jaxpr; ``shared``'s conversion is
  # cached on ``shared`` (0.11.2: ``shared`` itself, which has no constants
  # attached). pjit named ``closed``'s results.
  jaxpr = _pe.convert_constvars_jaxpr(shared)
  jaxpr._debug_info = jaxpr.debug_info._replace(
      result_paths=closed.debug_info.result_paths)
  return jaxpr, list(closed.consts)


def _trace_takes_context() -> bool:
  """Whether ``pe.trace_to_jaxpr`` takes a context for its cache key after
  the debug info (pjit passes its quasi-dynamic-data token there): 0.10 and
  0.11.0 do; 0.11.2's uncached trace has no such parameter."""
  nocache = getattr(_pe, "trace_to_jaxpr_nocache", None)
  return nocache is None or any(
      p.kind is p.VAR_POSITIONAL
      for p in _inspect.signature(nocache).parameters.values())


#: What pjit passes ``pe.trace_to_jaxpr`` after the debug info of a call
#: without mutable arrays (its quasi-dynamic-data token, 0, where it takes
#: one), which the front's key of a trace must match.
PJIT_TRACE_CONTEXT = (0,) if _trace_takes_context() else ()


def stateful_aval(aval) -> bool:
  """Whether pjit keys a trace on more than ``aval`` (a mutable array's
  quasi-dynamic data on 0.10); 0.11 dropped ``has_qdd``: anything but a
  plain array type counts."""
  has_qdd = getattr(aval, "has_qdd", None)
  return has_qdd if has_qdd is not None else type(aval) is not _core.ShapedArray


def donates(jit_info) -> bool:
  """Whether a jitted object's options donate arguments."""
  return bool(getattr(jit_info, "donate_argnums", ())
              or getattr(jit_info, "donate_argnames", ()))


def jit_debug_info(fun, args, kwargs):
  """The debug info pjit traces ``fun`` with (no static arguments)."""
  return _api_util.debug_info("jit", fun, args, kwargs)


def _pjit_cache_miss_code():
  """The code of the ``cache_miss`` that ``_cpp_pjit`` gives the C++ fast
  path: the one caller of ``_get_fastpath_data`` whose ``p`` (the params
  ``_infer_params`` returned) pairs its arguments with a shared jaxpr's
  constants. ``_pjit_call_impl`` calls ``_get_fastpath_data`` too, for a
  jaxpr bound as a primitive, whose arguments are all its own. None where
  no such code is found."""
  for c in getattr(_pjit, "_cpp_pjit").__code__.co_consts:
    if (isinstance(c, type(_pjit_cache_miss_code.__code__))
        and c.co_name == "cache_miss" and "p" in c.co_varnames
        and "_get_fastpath_data" in c.co_names):
      return c
  return None


#: ``_cpp_pjit``'s ``cache_miss`` code (see :func:`_pjit_cache_miss_code`).
PJIT_CACHE_MISS_CODE = _pjit_cache_miss_code()


def pjit_params_of_caller(frame):
  """The ``p`` of pjit's ``cache_miss`` if ``frame`` is one, else None."""
  if frame.f_code is not PJIT_CACHE_MISS_CODE:
    return None
  return frame.f_locals.get("p")


class UnknownStatics(Exception):
  """``in_avals`` holds parts :func:`static_values` does not know."""


def tree_of(in_avals):
  """The treedef of a trace's ``in_avals`` (the flat tree pjit passes
  ``pe.trace_to_jaxpr``), or None where it has none."""
  return getattr(in_avals, "tree", None)


def static_values(in_avals) -> list:
  """The static argument values inside a trace's ``in_avals`` (the flat
  tree pjit passes ``pe.trace_to_jaxpr``), in order; raises
  :class:`UnknownStatics` for a shape of flat tree this jax did not have.

  On 0.10 a ``FlatTree`` says which of its parts are static (``statics``,
  a tree-prefix of bools); on 0.11 a static is its own ``FTStatic`` node
  inside tuples and dicts of flat trees."""
  statics = getattr(in_avals, "statics", _NO_STATICS)
  if statics is not _NO_STATICS:   # 0.10
    if not _any_static(statics):
      return []
    found: list = []
    _pick_statics(in_avals.unflatten(), statics, found)
    return found
  found = []
  _static_nodes(in_avals, found)
  return found


_NO_STATICS = object()


def _any_static(statics) -> bool:
  if statics is True or statics is False:
    return statics
  if isinstance(statics, tuple):
    return any(map(_any_static, statics))
  if isinstance(statics, dict):
    return any(map(_any_static, statics.values()))
  raise UnknownStatics(type(statics).__name__)


def _pick_statics(tree, statics, found: list) -> None:
  if statics is True:
    found.append(tree)
  elif isinstance(statics, tuple):
    for t, s in zip(tree, statics):
      _pick_statics(t, s, found)
  elif isinstance(statics, dict):
    for k, s in statics.items():
      _pick_statics(tree[k], s, found)


def _static_nodes(ft, found: list) -> None:
  name = type(ft).__name__
  if name == "FTStatic":
    found.append(ft.val)
  elif name == "FTTuple":
    for elt in ft.elts:
      _static_nodes(elt, found)
  elif name == "FTDict":
    for elt in ft._vals:
      _static_nodes(elt, found)
  elif name not in ("FTPyTree", "FTSingleton"):
    raise UnknownStatics(name)


def _trace_lookup_seams() -> list[str]:
  """The seams layer two is written against that the running jax lacks
  (empty on 0.10.2): checked by feature, not by version string."""
  missing = [f"FlatTree's {name}" for name in
             ("pack", "flatten", "flatten_static_argnums_argnames")
             if not hasattr(flat_trees, name)]
  if PJIT_CACHE_MISS_CODE is None:
    missing.append("pjit's cache_miss (the caller of _get_fastpath_data "
                   "that holds the inferred params)")
  if not MERGED_JAXPR and not hasattr(_pe, "separate_consts"):
    missing.append("pe.separate_consts")
  if MERGED_JAXPR and not hasattr(Jaxpr, "with_consts"):
    missing.append("Jaxpr.with_consts (a merged jaxpr closed over new "
                   "constants)")
  return missing


#: Why layer two (the closure key inside JAX's trace lookup) cannot run on
#: this jax; empty where it can. Where it cannot, ``enable()`` installs the
#: front alone (layers one and three: ``jit``, control flow, static
#: functions), which reads none of these seams.
TRACE_LOOKUP_MISSING = _trace_lookup_seams()
TRACE_LOOKUP = not TRACE_LOOKUP_MISSING

#: ``pe.separate_consts``, which control flow and pjit call on every closed
#: jaxpr; from 0.11 it is cached on each closure's own jaxpr, and layer two
#: replaces it there (``MERGED_JAXPR``) to separate a shared one as its
#: shared jaxpr.
STOCK_SEPARATE_CONSTS = separate_consts

#: (module, attribute) of each function layer two replaces; callers look
#: them up as module globals at call time: ``pe.trace_to_jaxpr`` (and on
#: 0.11 ``pe.separate_consts``) from pjit and the control-flow modules, the
#: pjit ones from ``cache_miss`` and ``jit_trace``.
TRACE_PATCH_POINTS = ((_pe, "trace_to_jaxpr"), (_pjit, "_trace_for_jit"),
                      (_pjit, "_get_fastpath_data"),
                      (_control_flow_common, "_dedup_consts"),
                      (_stages.Traced, "lower")) + (
                          ((_pe, "separate_consts"),) if MERGED_JAXPR else ())


def stock_trace(fun, args, kwargs):
  """The closed jaxpr stock's ``jax.jit(fun)`` traces for ``fun(*args,
  **kwargs)`` (no static arguments), through JAX's own trace cache and
  none of the package's lookups: verify mode's reference."""
  args_ft = flat_trees.flatten_static_argnums_argnames(args, kwargs, (), ())
  in_avals = args_ft.map(typeof)
  debug_info = jit_debug_info(fun, args, kwargs)
  closed, _ = STOCK_TRACE_TO_JAXPR(fun, in_avals, debug_info,
                                   *PJIT_TRACE_CONTEXT)
  return closed


def call_signature(args, kwargs) -> tuple:
  """What a trace of ``fun(*args, **kwargs)`` is specialized to: the
  arguments' tree and each leaf's abstract value (its shape, dtype, weak
  type and sharding). Hashable where the tree's node data is."""
  leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
  return tree, tuple([typeof(x) for x in leaves])


def run_traced_eagerly(traced, args, kwargs):
  """A ``jit(...).trace(*args, **kwargs)`` result run as eager JAX runs
  its equations: one primitive at a time, each applied to concrete
  operands, the jaxpr's constants among them (an eager ``lax.cond``'s
  way, where ``jit`` would bake them into its module)."""
  args_flat = jax.tree_util.tree_leaves((args, kwargs))
  with _nan_hook_kept():
    out_flat = _core.jaxpr_as_fun(traced.jaxpr)(*args_flat)
  return jax.tree_util.tree_unflatten(traced.out_tree, out_flat)


# The state through which JAX's compiled calls check their outputs for NaNs
# (set per thread by ``jax.debug_nans`` contexts, globally by
# ``jax.config.update``): JAX's own ``debug_nans(False)`` context, exited,
# sets it to None for the thread where it was unset, so a later global
# update never reaches that thread's compiled calls. ``jaxpr_as_fun``
# enters one; stock's eager call of the same computation does not.
_POST_HOOK = getattr(_api, "_post_hook_state", None)
if not all(hasattr(_POST_HOOK, n) for n in ("get_local", "set_local")):
  _POST_HOOK = None


class _nan_hook_kept:
  """Keeps the thread's NaN-check hook state as it was across a block."""
  __slots__ = ("before",)

  def __enter__(self):
    self.before = None if _POST_HOOK is None else _POST_HOOK.get_local()

  def __exit__(self, *exc):
    if _POST_HOOK is not None and _POST_HOOK.get_local() is not self.before:
      _POST_HOOK.set_local(self.before)


# -- what a trace asks of a value that a closed-over array answers by value --
#
# A closed-over array is concrete in stock's trace and a tracer in a lifted
# one. JAX asks a value whether it is concrete (``core.is_concrete``,
# ``core.to_concrete_value``, ``concrete_or_error`` and the tracer's own
# ``__bool__``/``__int__``/``__index__``, all through ``to_concrete_value``),
# and raises one of the conversion errors below where a tracer is asked for
# its value (``float()``, ``np.asarray()``); stock's concrete array answers
# both from its value, so a trace that asks may take another path (an
# ``integer_pow`` of a concrete exponent, a ``scan`` for concrete loop
# bounds, a check that raises) in stock's. ``concreteness_patch_points``
# reports each such question to ``asked(tracer)``.

#: The errors JAX raises where a tracer is asked for its value; each
#: takes the tracer first.
VALUE_ERRORS = tuple(
    cls for cls in (getattr(jax.errors, n, None) for n in (
        "ConcretizationTypeError", "TracerArrayConversionError",
        "TracerIntegerConversionError", "TracerBoolConversionError"))
    if isinstance(cls, type) and "__init__" in vars(cls))


def _harmless_askers() -> dict:
  """The code of JAX's functions whose question changes nothing for some
  values, each with the test of the value asked (None: any value):
  ``lax._convert_element_type`` and ``jnp.array`` ask only a value already
  known to be a tracer (``isinstance(x, Tracer) and is_concrete(x)``) and
  do with a concrete array what they do with a non-concrete tracer;
  ``jnp.power`` asks of its exponent, and takes ``integer_pow`` only for a
  concrete integer scalar (a float or an array takes ``pow`` either way);
  ``device_put`` under a trace asks for a concrete value's sharding as
  the source it records (``srcs``), which only its transpose reads, never
  its lowering (``lowering.structure.NOT_LOWERED``)."""
  from jax._src import api as _api_module
  from jax._src.lax import lax as _lax
  from jax._src.numpy import array_constructors as _constructors
  from jax._src.numpy import ufuncs as _ufuncs

  def not_an_integer_scalar(tracer) -> bool:
    aval = tracer.aval
    return bool(aval.shape) or _np.issubdtype(aval.dtype, _np.inexact)
  found = {}
  for owner, name, test in ((_lax, "_convert_element_type", None),
                            (_constructors, "array", None),
                            (_api_module, "_infer_src_sharding", None),
                            (_ufuncs, "power", not_an_integer_scalar)):
    code = getattr(getattr(owner, name, None), "__code__", None)
    if code is not None:
      found[code] = test
  return found


_HARMLESS_ASKERS = _harmless_askers()
_ASKING = frozenset({"to_concrete_value", "is_concrete", "concrete_or_error"})


def _asked_harmlessly(frame, tracer) -> bool:
  # the first frame outside JAX's asking functions is the question's site
  while frame is not None and frame.f_code.co_name in _ASKING:
    frame = frame.f_back
  if frame is None or frame.f_code not in _HARMLESS_ASKERS:
    return False
  test = _HARMLESS_ASKERS[frame.f_code]
  return test is None or test(tracer)


def concreteness_patch_points(asked, watching, library_code) -> list:
  """``(owner, name, replacement)`` for JAX's concreteness questions, each
  reporting the tracer asked to ``asked(tracer)`` while ``watching()``,
  before doing what it did: ``to_concrete_value`` of the trace's own
  tracers (where their class finds it); the ``__init__`` of each of
  ``VALUE_ERRORS``; and, asked from code that is not ``library_code(code)``
  (the user's), what a tracer lacks that a concrete array has:
  ``sharding``, ``device``, an attribute JAX's tracer does not find, its
  ``repr`` (``str`` and f-strings too). ``jax.device_get`` asks each leaf
  for ``copy_to_host_async`` (a tracer comes back as it is, a concrete
  array as a NumPy array): reported too, under any name it is called by."""
  import sys
  getframe = sys._getframe
  points = []
  tracer_cls = _pe.DynamicJaxprTracer
  owner = next((c for c in tracer_cls.__mro__
                if "to_concrete_value" in vars(c)), None)
  if owner is not None:
    original = vars(owner)["to_concrete_value"]

    def to_concrete_value(self):
      if (watching() and type(self) is tracer_cls
          and not _asked_harmlessly(getframe(1), self)):
        asked(self)
      return original(self)
    points.append((owner, "to_concrete_value", to_concrete_value))
  for cls in VALUE_ERRORS:
    points.append((cls, "__init__", _reporting_init(cls.__init__, asked)))

  def by_user() -> bool:   # the caller of the caller: the question's site
    return not library_code(getframe(2).f_code)

  base = _core.Tracer
  for name in ("sharding", "device"):
    prop = vars(base).get(name)
    if isinstance(prop, property):
      points.append((base, name, property(
          _reporting_get(prop.fget, asked, watching, by_user),
          doc=prop.__doc__)))
  stock_getattr = vars(base).get("__getattr__")
  device_get_code = getattr(jax.device_get, "__code__", None)
  if stock_getattr is not None:
    def __getattr__(self, name):
      try:
        return stock_getattr(self, name)
      except AttributeError:
        if watching() and (by_user() or (
            name == "copy_to_host_async"
            and getframe(1).f_code is device_get_code)):
          asked(self)
        raise
    points.append((base, "__getattr__", __getattr__))
  stock_repr = vars(base).get("__repr__")
  if stock_repr is not None:
    def __repr__(self):
      if watching() and by_user():
        asked(self)
      return stock_repr(self)
    points.append((base, "__repr__", __repr__))
  points += _folding_window_points(asked, watching)
  return points


#: JAX's eager constant folding option, which ``jax.ensure_compile_time_eval``
#: sets for its block (None on a release without it).
_EAGER_FOLDING = getattr(_config, "eager_constant_folding", None)


def eager_folding() -> bool:
  """Whether JAX folds operations on concrete values at trace time now
  (``jax.ensure_compile_time_eval``, or the option set): a trace under it
  computes with a closed-over array's value where a lifted one stages."""
  return bool(_EAGER_FOLDING is not None and _EAGER_FOLDING.value)


def _folding_window_points(asked, watching) -> list:
  """The thread-local hook of JAX's eager constant folding option: while
  ``watching()``, the block it is on for (``ensure_compile_time_eval``)
  is a window, and each input of an equation the current trace staged in
  it is reported to ``asked`` at its end: stock's trace folds an
  operation on a closed-over array there (a concrete value the trace's
  own code may see), which a lifted trace stages (``asked`` keeps those
  computed from a lifted array). An option that already has a hook keeps
  it, called first; nothing where the release has no such hook."""
  state = _EAGER_FOLDING
  if state is None or not hasattr(state, "_update_thread_local_hook"):
    return []
  original = state._update_thread_local_hook
  windows = threading.local()   # .open: (trace, first equation) or None

  def hook(value):
    if original is not None:
      original(value)
    if watching():
      _folding_changed(value, windows, asked)
  return [(state, "_update_thread_local_hook", hook)]


def _folding_changed(value, windows, asked) -> None:
  opened = getattr(windows, "open", None)
  if value:   # a block entered (or one inside it left): a window if none
    if opened is None:
      frame = getattr(_core.trace_ctx.trace, "frame", None)
      eqns = getattr(frame, "tracing_eqns", None)
      windows.open = (eqns, len(eqns)) if type(eqns) is list else ((), 0)
    return
  windows.open = None
  if opened is None:
    return
  eqns, start = opened
  for made in eqns[start:]:
    eqn = made() if isinstance(made, _weakref.ReferenceType) else made
    for tracer in getattr(eqn, "in_tracers", ()):
      asked(tracer)


def _reporting_get(fget, asked, watching, by_user):
  def get(self):
    if watching() and by_user():
      asked(self)
    return fget(self)
  return get


def _reporting_init(original, asked):
  def __init__(self, tracer, *args, **kwargs):
    asked(tracer)
    original(self, tracer, *args, **kwargs)
  __init__.__wrapped__ = original
  return __init__


def computed_from(tracer, sources: set, memo: dict) -> bool:
  """Whether ``tracer`` (any JAX tracer) is one of the tracers whose ids
  are ``sources``, or was computed from one in this trace or an enclosing
  one: followed through the equations that made it (``parent``), an inner
  trace's constant to the outer value it stands for, and a JVP tracer to
  its primal. ``memo``: id -> (tracer, answer) of the tracers already
  answered, each kept alive with its answer (an id is never reused while
  the memo lives)."""
  todo, seen = [tracer], []
  found = False
  while todo:
    t = todo.pop()
    i = id(t)
    if i in sources:
      found = True
      break
    known = memo.get(i)
    if known is not None and known[0] is t:
      if known[1]:
        found = True
        break
      continue
    memo[i] = (t, False)
    seen.append(t)
    if isinstance(t, _pe.DynamicJaxprTracer):
      parent = t.parent
      if parent is not None:
        todo.extend(getattr(parent, "in_tracers", ()))
        continue
      try:   # a constant of an inner trace: the outer value it stands for
        outer = t._trace.frame.constvar_to_val.get(t.val)
      except (AttributeError, TypeError):
        outer = None
      if isinstance(outer, _core.Tracer):
        todo.append(outer)
      continue
    if any("primal" in getattr(c, "__slots__", ()) for c in type(t).__mro__):
      primal = t.primal   # a JVP or linearize tracer's (never __getattr__)
      if isinstance(primal, _core.Tracer):
        todo.append(primal)
  if found:
    for t in seen:
      memo[id(t)] = (t, True)
  return found
