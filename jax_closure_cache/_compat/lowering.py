"""JAX's private seams that the shared lowering (``lowering/``, tier A)
reads and replaces: pjit's memoized lowering (``_pjit_lower``), the one
caller whose lowering it shares (``_pjit_call_impl_python``, a call), and
what building a jaxpr with its constants as arguments needs.

Invariants: chosen by feature, never by version string (0.11 merged
``ClosedJaxpr`` into ``Jaxpr``); ``LOWERING_MISSING`` lists each seam the
running jax lacks, and tier A is installed only where it is empty.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any, Mapping, NamedTuple

import numpy as np

from jax._src import config as _config
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import pjit as _pjit
from jax._src import linear_util as _linear_util
from jax._src import util as _util
from jax._src.tree_util import tree_structure as jax_tree_structure
from jax._src.interpreters import partial_eval as _pe
from jax._src.lib import _jax as _jaxlib_ext

#: pjit's lowering of a closed jaxpr for a jit call, a ``weakref_lru_cache``
#: keyed on the jaxpr object: re-created functions never share it.
STOCK_PJIT_LOWER = _pjit._pjit_lower
#: The caller whose lowering tier A shares: a call (``jit(f)(x)``, eager
#: control flow through ``xla_primitive_callable``), never ``.lower()``.
CALL_IMPL_CODE = getattr(getattr(_pjit, "_pjit_call_impl_python", None),
                         "__code__", None)
RESOLVE_AND_LOWER_CODE = getattr(getattr(_pjit, "_resolve_and_lower", None),
                                 "__code__", None)
UNSPECIFIED = _pjit.UNSPECIFIED
ArrayImpl = _jaxlib_ext.ArrayImpl
try:   # (jax 0.10 and 0.11 keep it here)
  from jax._src.random.prng import PRNGKeyArray as _PRNGKeyArray
except ImportError:   # pragma: no cover - a release that moved it
  _PRNGKeyArray = None
#: The concrete types of a jax array whose values never change once made:
#: ``ArrayImpl``, and a typed PRNG key array (``jax.random.key``) where
#: this JAX has that type where it is looked for.
IMMUTABLE_ARRAYS = (ArrayImpl,) + (
    (_PRNGKeyArray,) if isinstance(_PRNGKeyArray, type) else ())
Literal = _core.Literal
Var = _core.Var
Jaxpr = _core.Jaxpr
ClosedJaxpr = _core.ClosedJaxpr
Tracer = _core.Tracer
MERGED_JAXPR = ClosedJaxpr is Jaxpr
#: An effect tied to an input's position (a ``Ref`` argument's): moving the
#: constants to the front would renumber it.
JaxprInputEffect = _effects.JaxprInputEffect
trace_context = _config.trace_context
weakref_lru_cache = _util.weakref_lru_cache
register_cache = _util.register_cache
#: ``JAX_ENABLE_PGLE``: profile-guided recompiles are per function object.
enable_pgle = _config.enable_pgle


def oracle_muted():
  """JAX's test counters muted (verify mode's own lowering)."""
  from jax_closure_cache import _compat
  return _compat.oracle_muted()


def executable_nbytes(executable) -> int:
  """Bytes a compiled executable keeps: the backend's count of its generated
  code or, where it reports none (XLA:CPU reports 0), the size of its
  optimized HLO modules, an estimate of the same order. 0 if unreadable."""
  try:
    xla = executable.xla_executable
    n = xla.get_compiled_memory_stats().generated_code_size_in_bytes
    if n <= 0:
      n = sum(len(m.as_serialized_hlo_module_proto())
              for m in xla.hlo_modules())
    return int(n)
  except Exception:   # a backend without these reports
    return 0


def called_for_a_call(frame) -> bool:
  """Whether ``frame`` (``_pjit_lower``'s caller) lowers for a call:
  ``_resolve_and_lower`` called by ``_pjit_call_impl_python``."""
  return (frame.f_code is RESOLVE_AND_LOWER_CODE
          and frame.f_back is not None
          and frame.f_back.f_code is CALL_IMPL_CODE)


def closed_parts(closed):
  """``(open jaxpr, constants)`` of a closed jaxpr, on either release."""
  return closed.jaxpr, closed.consts


def with_leading_inputs(open_jaxpr, invars, eqns, outvars, n_new: int,
                        constvars=(), consts=()):
  """A closed jaxpr whose inputs are ``invars`` (the first ``n_new`` of
  them new: the former constants and lifted literals), computing ``eqns``
  into ``outvars``, closed over ``consts`` (as ``constvars``; by default,
  none); its debug info names the new inputs with empty names, as pjit
  names hoisted constants."""
  dbg = open_jaxpr.debug_info
  names = dbg.arg_names
  dbg = dbg._replace(arg_names=None if names is None
                     else ("",) * n_new + tuple(names))
  if MERGED_JAXPR:
    return open_jaxpr.replace(constvars=list(constvars), invars=invars,
                              eqns=eqns, outvars=outvars, debug_info=dbg,
                              consts=list(consts))
  return ClosedJaxpr(open_jaxpr.replace(
      constvars=list(constvars), invars=invars, eqns=eqns, outvars=outvars,
      debug_info=dbg), list(consts))


def jaxpr_inputs(jaxpr) -> list:
  """The inputs of a jaxpr, closed or open."""
  return getattr(jaxpr, "jaxpr", jaxpr).invars


def with_inputs_in_order(closed, order: list):
  """``closed`` (a closed jaxpr, or an open one: ``remat2``'s) taking as
  its ``i``-th input its former input ``order[i]``; None where an effect
  is tied to an input's position."""
  if isinstance(closed, _core.Jaxpr):
    if any(isinstance(e, JaxprInputEffect) for e in closed.effects):
      return None
    dbg = closed.debug_info
    names = dbg.arg_names
    return closed.replace(
        invars=[closed.invars[k] for k in order],
        debug_info=dbg._replace(arg_names=None if names is None
                                else tuple(names[k] for k in order)))
  jaxpr = closed.jaxpr
  if any(isinstance(e, JaxprInputEffect) for e in jaxpr.effects):
    return None
  dbg = jaxpr.debug_info
  names = dbg.arg_names
  dbg = dbg._replace(arg_names=None if names is None
                     else tuple(names[k] for k in order))
  invars = [jaxpr.invars[k] for k in order]
  if MERGED_JAXPR:
    return closed.replace(invars=invars, debug_info=dbg)
  return ClosedJaxpr(jaxpr.replace(invars=invars, debug_info=dbg),
                     closed.consts)


def used_inputs(closed) -> list:
  """Which inputs of a closed jaxpr without constants its outputs use (the
  inputs pjit keeps when ``keep_unused`` is off)."""
  jaxpr = closed.jaxpr
  return _pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))[1]


def committed(x) -> bool:
  """Whether a jax array was placed on a device explicitly."""
  return bool(getattr(x, "_committed", True))


def single_device(x) -> bool:
  try:
    return len(x.sharding.device_set) == 1
  except Exception:   # an array without a concrete sharding
    return False


@functools.lru_cache(maxsize=1024)
def _defined_by_jax(module_name: str) -> bool:
  module = sys.modules.get(module_name)
  path = getattr(module, "__file__", None) or ""
  return any(path.startswith(root) for root in _JAX_ROOTS)


_JAX_ROOTS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                   for m in (sys.modules["jax"], sys.modules["jaxlib"]))


def jax_code(code) -> bool:
  """Whether ``code`` was loaded from jax's or jaxlib's own folder."""
  return code.co_filename.startswith(_JAX_ROOTS)


#: JAX's treedef class (its instances compare by JAX's own equality, which
#: compares a custom node's data with that data's ``__eq__``)
PyTreeDef = type(jax_tree_structure((0,)))


def _hi_prim_class():
  try:
    from jax._src import hijax
  except ImportError:   # a release without hijax primitives
    return None
  # (``HiPrim`` on 0.11; ``VJPHiPrimitive`` on 0.10, whose subclasses
  # carry ``jax_remat3``'s checkpoints, ``vmap``'s and custom rules')
  return (getattr(hijax, "HiPrim", None)
          or getattr(hijax, "VJPHiPrimitive", None))


#: the base class of the objects a ``call_hi_primitive`` equation holds as
#: its ``_prim`` parameter (a ``custom_root``'s, a ``scan``'s on newer
#: releases, a checkpoint's under ``jax_remat3``): made afresh by every
#: trace; None where JAX has none
HI_PRIM = _hi_prim_class()

#: a transformation's function JAX runs later (a ``custom_lin``'s ``bwd``)
_WrappedFun = _linear_util.WrappedFun


def _traced_class():
  from jax._src import stages
  traced = getattr(stages, "Traced", None)
  has_jaxpr = isinstance(getattr(traced, "jaxpr", None), property)
  return traced if has_jaxpr else None


#: ``jax.stages.Traced``, whose ``jaxpr`` a hijax primitive's trace of its
#: function holds; None on a release without it
TRACED = _traced_class()


def defined_by_jax(cls) -> bool:
  """Whether ``cls`` is defined in a module loaded from jax's or jaxlib's
  own folder (decided by where the module was loaded from, never by a
  ``__module__`` a decorator may have copied): a C type of such a module,
  or a class that module holds by its qualified name (a user's class given
  jax's ``__module__`` is not). A class whose attributes raise is not."""
  try:
    module = cls.__module__
    return (type(module) is str and _defined_by_jax(module)
            and held_by_its_module(cls))
  except Exception:
    return False


def held_by_its_module(cls) -> bool:
  """Whether ``cls`` is a static C type, or a class the module its
  ``__module__`` names holds by its qualified name or by its name (or the
  name's last part: jax names ``jax.Array`` ``jaxlib._jax.Array`` and
  exports it as ``jax.Array``): a user's class given a library's
  ``__module__`` is not. Raises where ``cls``'s attributes do."""
  if not type.__dict__["__flags__"].__get__(cls) & HEAPTYPE:
    return True
  module = cls.__module__
  return (module_holds(module, cls.__name__.rpartition(".")[2], cls)
          or module_holds(module, cls.__qualname__, cls))


def module_holds(module_name, path, obj) -> bool:
  """Whether the imported module named ``module_name`` holds ``obj`` under
  ``path`` (a name, or a dotted qualified name): its first name read from
  the module's namespace, never through a module ``__getattr__`` (which
  runs code: a lazy import, a deprecation warning), the rest as
  attributes of what that holds. False for names that are not strings.
  Raises where an attribute along the path does."""
  if type(module_name) is not str or type(path) is not str:
    return False
  names = getattr(sys.modules.get(module_name), "__dict__", None)
  if type(names) is not dict:
    return False
  first, _, rest = path.partition(".")
  reached = names.get(first, _ABSENT)
  for name in rest.split(".") if rest else ():
    reached = getattr(reached, name, _ABSENT)
  return reached is obj


_ABSENT = object()


HEAPTYPE = 1 << 9   # Py_TPFLAGS_HEAPTYPE: made at run time, not in C


def _lowering_seams() -> list[str]:
  missing = []
  if CALL_IMPL_CODE is None:
    missing.append("pjit._pjit_call_impl_python")
  if RESOLVE_AND_LOWER_CODE is None:
    missing.append("pjit._resolve_and_lower")
  if not hasattr(STOCK_PJIT_LOWER, "cache_clear"):
    missing.append("pjit._pjit_lower as a weakref_lru_cache")
  return missing


LOWERING_MISSING = _lowering_seams()

#: (module, attribute) tier A replaces.
LOWERING_PATCH_POINTS = ((_pjit, "_pjit_lower"),)

np_generic = np.generic


#: Parameters no lowering runs (a custom rule's differentiation functions,
#: made afresh by every trace of any function with such a rule).
_RULE_PARAMETERS = {
    "custom_jvp_call": frozenset({"jvp_jaxpr_fun", "jvp_jaxpr_thunk"}),
    "custom_vjp_call": frozenset({"fwd_jaxpr_thunk", "bwd", "out_trees"}),
}


#: Primitives whose equations JAX numbers when it transforms the jaxpr,
#: memoizing the transformed jaxpr by the jaxpr object: checkify draws each
#: ``check``'s error code from a global counter, and the error it reports
#: is the failing check with the smallest code, so a jaxpr shared by later
#: function objects keeps its first codes where each stock trace draws new
#: ones (an inner check then wins over a later outer one).
_NUMBERED_PER_TRACE = frozenset({"check"})
#: The parameter of ``jax.debug.print``'s equation holding numpy's print
#: options, read from numpy's global state when the trace ran: a shared
#: trace would print later objects' arrays with the first trace's options.
_PRINTS = "np_printoptions"


def forwarded_inputs(jaxpr, skip: int) -> tuple | None:
  """``(output index, input index - skip)`` for each output of ``jaxpr``
  that is one of its inputs past the first ``skip`` (the value returned as
  it was passed), or None if none is."""
  open_jaxpr = (closed_parts(jaxpr)[0] if isinstance(jaxpr, ClosedJaxpr)
                else jaxpr)
  position = {id(v): i for i, v in enumerate(open_jaxpr.invars)}
  found = tuple((o, position[id(v)] - skip)
                for o, v in enumerate(open_jaxpr.outvars)
                if position.get(id(v), -1) >= skip)
  return found or None


def eager_weak_types(jaxpr) -> str | None:
  """Where a top-level equation of ``jaxpr`` gives other weak types run
  eagerly than staged, or None. ``custom_linear_solve``'s eager
  implementation returns what its solve computes (``b.astype(float32)``
  is not weakly typed), where its staged outputs take the right-hand
  side's types: an eager launcher compiled as one module would answer with
  the staged ones."""
  open_jaxpr = (closed_parts(jaxpr)[0] if isinstance(jaxpr, ClosedJaxpr)
                else jaxpr)
  for e in open_jaxpr.eqns:
    if e.primitive.name != "custom_linear_solve":
      continue
    solve = getattr(e.params.get("jaxprs"), "solve", None)
    staged = [getattr(v.aval, "weak_type", False) for v in e.outvars]
    if solve is None or [getattr(a, "weak_type", False)
                         for a in solve.out_avals] != staged:
      return ("its custom_linear_solve's solve returns other weak types "
              "than its right-hand side's, which stock's eager call returns "
              "and a compiled launcher would not")
  return None


def runtime_callable(jaxpr) -> str | None:
  """The primitive of the first equation (nested jaxprs included) whose
  lowered parameters hold a Python callable its computation calls when it
  runs (``pure_callback``, ``io_callback``, ``debug.callback``: the
  user's function, or JAX's closure over it), a rule JAX runs when it
  transforms the trace, or that JAX numbers per trace (a checkify
  ``check``), or that holds a user's object for when it runs
  (``debug.print``'s static arguments, formatted at run time; a pytree
  node's data), or None. Such a callable, number or object is the trace's
  own: a trace stored for other function objects would call this object's
  callback (its log, its state) from theirs, print its objects, or report
  its checks."""
  return _CallableSearch().jaxpr(jaxpr, 0)


class _CallableSearch:
  """The walk of :func:`runtime_callable`, one method per kind of value
  met."""
  __slots__ = ()

  def jaxpr(self, jaxpr, depth: int) -> str | None:
    if depth > 64:
      return None
    open_jaxpr = (closed_parts(jaxpr)[0] if isinstance(jaxpr, ClosedJaxpr)
                  else jaxpr)
    for e in open_jaxpr.eqns:
      if e.primitive.name in _NUMBERED_PER_TRACE or _PRINTS in e.params:
        # (a print keeps numpy's print options as its trace read them)
        return e.primitive.name
      rules = _RULE_PARAMETERS.get(e.primitive.name, ())
      for name, p in e.params.items():
        if name in rules:
          # a user's differentiation rule: JAX runs it when it
          # differentiates the stored trace, with this trace's values
          # (tracers of a lifted trace included); a rule of jax's own holds
          # nothing of a trace's
          if self.reaches_user_code(p, 4):
            return e.primitive.name
        elif self.param(p, depth):
          return e.primitive.name
    return None

  def param(self, p, depth: int) -> bool:
    """Whether an equation's parameter holds such a callable."""
    if isinstance(p, (ClosedJaxpr, Jaxpr)):
      return self.jaxpr(p, depth + 1) is not None
    if isinstance(p, (tuple, list)):
      return any(self.param(x, depth) for x in p)
    if isinstance(p, dict):
      return any(self.param(x, depth) for x in p.values())
    if isinstance(p, types.FunctionType):
      # a module-level function of jax (a PRNG implementation's) holds
      # nothing of a trace's; JAX's closure over a user's callback does
      return (p.__closure__ is not None
              or not p.__code__.co_filename.startswith(_JAX_ROOTS))
    if isinstance(p, (types.MethodType, functools.partial)):
      return True
    if HI_PRIM is not None and isinstance(p, HI_PRIM):
      return self.hi_prim(p, depth)
    if isinstance(p, _WrappedFun):
      # a rule JAX runs when it transforms the trace (``custom_lin``'s
      # ``bwd``, a linearized ``custom_vjp``'s): of the user's or not
      return self.reaches_user_code(p, 4)
    if isinstance(p, type) or not callable(p):
      return _user_value(p, 4)
    # JAX's own callable values (a mesh, a sharding) run nothing of the
    # user's; its callback wrappers and rule objects (``custom_vmap``'s)
    # hold the user's function
    if not defined_by_jax(type(p)):
      return True
    if getattr(p, "callback_func", None) is not None:
      return True
    return self.reaches_user_code(p, 4)

  def hi_prim(self, prim, depth: int) -> bool:
    """Whether a hijax primitive object (a ``custom_vjp``'s under
    ``jax_custom_vjp3``, a checkpoint's under ``jax_remat3``) holds a rule
    reaching a user's function (JAX runs it when it transforms the trace
    holding the object: the user's ``fwd``/``bwd``, a user's checkpoint
    policy), or a trace whose jaxpr calls a callable when it runs."""
    if depth > 64:
      return False
    return any(self.state(v, depth + 1) for v in vars(prim).values())

  def state(self, v, depth: int) -> bool:
    if isinstance(v, (ClosedJaxpr, Jaxpr)):
      return self.jaxpr(v, depth) is not None
    if TRACED is not None and type(v) is TRACED:
      return self.jaxpr(v.jaxpr, depth) is not None
    if isinstance(v, (tuple, list)):
      return any(self.state(x, depth) for x in v)
    if isinstance(v, dict):
      return any(self.state(x, depth) for x in v.values())
    if HI_PRIM is not None and isinstance(v, HI_PRIM):
      return self.hi_prim(v, depth)
    return _rule_like(v) and self.reaches_user_code(v, 4)

  def reaches_user_code(self, f, depth: int) -> bool:
    """Whether a rule (a function, a ``WrappedFun``, a ``partial``, a
    callable object of jax's such as ``custom_vmap``'s ``ClosedRule``) is
    or holds, through cells, arguments and attributes, a function whose
    code lies outside jax's folders or a callable object of a class
    outside them."""
    if isinstance(f, functools.partial):
      held = (f.func, *f.args, *f.keywords.values())
    elif isinstance(f, types.FunctionType):
      if not f.__code__.co_filename.startswith(_JAX_ROOTS):
        return True
      # its cells, and what ``functools.update_wrapper`` set (``__wrapped__``)
      held = (*_filled_cells(f), *f.__dict__.values())
    elif not defined_by_jax(type(f)):
      return callable(f) and not _stateless_builtin(f)
    else:   # an object of jax's: what its attributes hold
      held = _attribute_values(f)
    return depth > 0 and any(self.reaches_user_code(v, depth - 1)
                             for v in held if _rule_like(v))


#: Parameter values that are no user's object: atoms, and the standard
#: library's immutable values of atoms (walked by :func:`_user_value`).
_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None),
                    type(Ellipsis), range})


def _user_value(p, depth: int) -> bool:
  """Whether a non-callable parameter value is or holds an object of a
  user's class, or a user's class (what a primitive keeps by identity
  for when it runs): anything but atoms, numpy's values and dtypes, and
  jax's own values, through containers and a pytree's node data."""
  t = type(p)
  if t in _ATOMS:
    return False
  if depth <= 0:
    return True
  if (t is tuple or t is list or t is frozenset or t is set or t is slice
      or (isinstance(p, tuple) and defined_by_jax(t))):
    return any(_user_value(x, depth - 1) for x in (
        (p.start, p.stop, p.step) if t is slice else p))
  if t is dict:
    return any(_user_value(k, depth - 1) or _user_value(v, depth - 1)
               for k, v in p.items())
  if t is PyTreeDef:
    return _user_node_data(p, depth)
  if isinstance(p, type):
    return not (p.__module__ in ("builtins", "numpy")
                or defined_by_jax(p) or issubclass(p, np.generic))
  if isinstance(p, np.dtype):
    return False
  if isinstance(p, (np.generic, np.ndarray)):
    return p.dtype.hasobject
  return not defined_by_jax(t)


def _user_node_data(treedef, depth: int) -> bool:
  """Whether a treedef's nodes hold a user's class or node data."""
  pending = [treedef]
  while pending:
    node = pending.pop()
    data = node.node_data()
    if data is not None and (_user_value(data[0], depth - 1)
                             or _user_value(data[1], depth - 1)):
      return True
    pending.extend(node.children())
  return False


def _rule_like(v) -> bool:
  return not isinstance(v, type) and (
      callable(v) or isinstance(v, _WrappedFun))


def _stateless_builtin(f) -> bool:
  """A module's builtin function (``operator.mul``, ``math.exp``) or a
  NumPy ufunc: no user's code, no user's state (a builtin method bound to
  a user's object, ``log.append``, is the user's)."""
  if isinstance(f, np.ufunc):
    return True
  return isinstance(f, types.BuiltinFunctionType) and (
      f.__self__ is None or isinstance(f.__self__, types.ModuleType))


def _filled_cells(f) -> list:
  values = []
  for cell in f.__closure__ or ():
    try:
      values.append(cell.cell_contents)
    except ValueError:   # an empty cell
      pass
  return values


def _attribute_values(obj) -> list:
  """An object's attribute values: its ``__dict__``'s and its slots'."""
  values = list(getattr(obj, "__dict__", {}).values())
  for cls in type(obj).__mro__:
    slots = cls.__dict__.get("__slots__", ())
    for name in (slots,) if isinstance(slots, str) else slots:
      if name not in ("__dict__", "__weakref__"):
        try:
          values.append(getattr(obj, name))
        except AttributeError:   # an unset slot
          pass
  return values


#: Calls whose callee keeps the arrays its function closes over as its own
#: constants in stock's trace (measured: ``jax.jit(lambda: d * 1e-10)()``
#: inside a jit), which XLA folds inside the callee.
_CALLS_KEEPING_CONSTANTS = frozenset({"jit", "pjit", "closed_call",
                                      "core_call"})


def call_operand(jaxpr, inputs, depth: int = 0) -> str | None:
  """The primitive of the first call (nested jaxprs included) that takes
  one of ``inputs`` (vars of ``jaxpr``, followed into the jaxprs an
  equation holds, positionally where known) as an operand, where stock's
  trace of the same function keeps that array inside the callee as a
  constant (:data:`_CALLS_KEEPING_CONSTANTS`): XLA folds with it there,
  and not with an operand, across the call. An equation holding jaxprs
  whose operands this does not map counts as such a call. None if none
  does."""
  if not inputs:
    return None
  if depth > 64:
    return "a jaxpr nested too deep to read"
  open_jaxpr = (closed_parts(jaxpr)[0] if isinstance(jaxpr, ClosedJaxpr)
                else jaxpr)
  for e in open_jaxpr.eqns:
    hit = [i for i, v in enumerate(e.invars)
           if type(v) is not Literal and v in inputs]
    if not hit:
      continue
    name = e.primitive.name
    if name in _CALLS_KEEPING_CONSTANTS:
      return name
    inner = _operand_map(e)
    if inner is None:
      if any(isinstance(q, (Jaxpr, ClosedJaxpr)) for p in e.params.values()
             for q in (p if isinstance(p, (tuple, list)) else (p,))):
        return name
      continue
    for sub, mapping in inner:
      found = call_operand(sub, {mapping[i] for i in hit if i in mapping},
                           depth + 1)
      if found is not None:
        return found
  return None


def _operand_map(e):
  """``[(jaxpr, {operand index: its var})]`` for the jaxprs ``e`` holds
  (a loop's, a branch's, one taking every operand in order), or None."""
  p = e.params
  opened = lambda j: closed_parts(j)[0] if isinstance(j, ClosedJaxpr) else j
  if "cond_jaxpr" in p and "body_jaxpr" in p:
    cond, body = opened(p["cond_jaxpr"]), opened(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    carry = len(e.invars) - nc - nb
    return [(cond, {**{i: cond.invars[i] for i in range(nc)},
                    **{nc + nb + k: cond.invars[nc + k]
                       for k in range(carry)}}),
            (body, {**{nc + i: body.invars[i] for i in range(nb)},
                    **{nc + nb + k: body.invars[nb + k]
                       for k in range(carry)}})]
  if "branches" in p:
    return [(b, {k + 1: v for k, v in enumerate(b.invars)})
            for b in map(opened, p["branches"])]
  subs = [opened(q) for q in p.values() if isinstance(q, (Jaxpr, ClosedJaxpr))]
  if len(subs) == 1 and len(subs[0].invars) == len(e.invars):
    return [(subs[0], dict(enumerate(subs[0].invars)))]
  return None


def param_tracer(jaxpr, depth: int = 0) -> str | None:
  """The primitive of the first equation (nested jaxprs included) whose
  parameters hold a tracer: a closed jaxpr's constant (a primitive bound
  with its jaxpr as a parameter, as ``apply_primitive``'s function binds a
  transformed ``scan``), which a trace with lifted values makes of a
  lifted one; it dies with that trace. None if there is none."""
  if depth > 64:
    return None
  open_jaxpr = (closed_parts(jaxpr)[0] if isinstance(jaxpr, ClosedJaxpr)
                else jaxpr)
  for e in open_jaxpr.eqns:
    if any(_holds_tracer(p, depth) for p in e.params.values()):
      return e.primitive.name
  return None


def _holds_tracer(p, depth: int) -> bool:
  if isinstance(p, Tracer):
    return True
  if isinstance(p, ClosedJaxpr):
    return (any(isinstance(c, Tracer) for c in closed_parts(p)[1])
            or param_tracer(p, depth + 1) is not None)
  if isinstance(p, Jaxpr):
    return param_tracer(p, depth + 1) is not None
  if isinstance(p, (tuple, list)):
    return any(_holds_tracer(x, depth) for x in p)
  if isinstance(p, dict):
    return any(_holds_tracer(x, depth) for x in p.values())
  if HI_PRIM is not None and isinstance(p, HI_PRIM) and depth < 64:
    return any(_holds_tracer(x, depth + 1) for x in vars(p).values())
  return False


from jax._src import dtypes as _dtypes   # noqa: E402


def extended_dtype(dtype) -> bool:
  """Whether ``dtype`` is one of JAX's extended dtypes (a typed PRNG
  key's); False for None or anything else."""
  if dtype is None:
    return False
  try:
    return bool(_dtypes.issubdtype(dtype, _dtypes.extended))
  except Exception:
    return False


def inexact_dtype(dtype) -> bool:
  """Whether ``dtype`` is a floating or complex type, JAX's own (bfloat16,
  float8) included; False for any dtype NumPy cannot read (a PRNG key's)."""
  try:
    return bool(_dtypes.issubdtype(dtype, np.inexact))
  except Exception:
    return False


def exact_conversion(old, new) -> bool:
  """Whether converting values of dtype ``old`` to ``new`` keeps which of
  them are 1, -1, 0 or an infinity (never rounds one to 1 or 0, truncates
  it, wraps it, or overflows it to an infinity; a large integer may round
  to another): a widening of a float (its mantissa and exponent range
  covered), an integer to one covering its range or to a float whose
  range covers it, a boolean to anything; False for any other (a float to
  an integer or a boolean, a narrowing, a complex's real part) or a dtype
  NumPy cannot read."""
  if old is None or new is None:
    return False
  try:
    old, new = np.dtype(old), np.dtype(new)
    if old == new or old == np.bool_:
      return True
    if _dtypes.issubdtype(old, np.integer):
      if _dtypes.issubdtype(new, np.integer):
        return bool(np.can_cast(old, new, "safe"))
      if _dtypes.issubdtype(new, np.inexact):
        return float(_dtypes.iinfo(old).max) < float(_dtypes.finfo(new).max)
      return False
    if not _dtypes.issubdtype(old, np.inexact) or not _dtypes.issubdtype(
        new, np.inexact) or (_dtypes.issubdtype(old, np.complexfloating)
                             and not _dtypes.issubdtype(
                                 new, np.complexfloating)):
      return False
    a, b = _dtypes.finfo(old), _dtypes.finfo(new)
    return b.nmant >= a.nmant and b.maxexp >= a.maxexp and b.minexp <= a.minexp
  except Exception:
    return False


_LARGEST_FINITE = types.MappingProxyType({
    np.dtype(t): float(np.finfo(t).max)
    for t in (np.float32, np.float64, np.complex64, np.complex128)})


def largest_finite(dtype) -> float:
  """The largest finite value of a floating (or complex: of its parts)
  dtype, JAX's own (bfloat16, float8) included."""
  found = _LARGEST_FINITE.get(dtype)
  if found is None:
    found = float(_dtypes.finfo(dtype).max)
  return found


_SMALLEST_NORMAL = types.MappingProxyType({
    np.dtype(t): float(np.finfo(t).tiny)
    for t in (np.float32, np.float64, np.complex64, np.complex128)})


def smallest_normal(dtype) -> float:
  """The smallest positive normal value of a floating (or complex: of its
  parts) dtype, JAX's own included: XLA's CPU runtime flushes what is
  below it to zero (an argument's too), where its compile-time evaluation
  keeps it."""
  found = _SMALLEST_NORMAL.get(dtype)
  if found is None:
    found = float(_dtypes.finfo(dtype).tiny)
  return found


def holds_subnormal(c) -> bool:
  """Whether a constant (an array or a Python number) of a floating or
  complex type holds a subnormal value (nonzero, below
  :func:`smallest_normal`, in either part): baked, XLA folds it exactly;
  as an argument the runtime reads it as a zero. Never an error (False
  where the values cannot be read)."""
  if type(c) in (float, complex):
    return any(0 < abs(p) < smallest_normal(np.float64)
               for p in (c.real, c.imag))
  a = _inexact_values(c)
  if a is None:
    return False
  tiny = smallest_normal(c.dtype)
  parts = (a.real, a.imag) if a.dtype.kind == "c" else (a,)
  return any(bool(((p != 0) & (np.abs(p) < tiny)).any()) for p in parts)


def _inexact_values(c):
  """A constant's values as a NumPy array of a floating or complex type
  (bfloat16 and float8 as float32, which holds them), or None: not of such
  a type, or its values cannot be read."""
  dtype = getattr(c, "dtype", None)
  if dtype is None or not inexact_dtype(dtype):
    return None
  try:
    a = np.asarray(c)
    return a if a.dtype.kind in "fc" else a.astype(np.float32)
  except Exception:
    return None


_HOST_TO_DEVICE_GUARD = getattr(_config, "transfer_guard_host_to_device",
                                None)
#: The host-to-device transfer guard's config state (``.value``: None or a
#: level), for a hot path reading it directly; None in a release without
#: guards.
HOST_TO_DEVICE_GUARD = _HOST_TO_DEVICE_GUARD


def transfers_guarded() -> bool:
  """Whether a host-to-device transfer guard other than ``"allow"`` is in
  force (``jax.transfer_guard``, its config options, flag or environment
  variable; thread-local contexts included): the transfers the package
  makes where stock's baked constants make none (a lifted NumPy array,
  tier A's constants and literals passed as arguments), and those it
  spares where stock makes them (eager control flow's static Python
  bounds), would be logged or refused otherwise than stock's. (Those are
  all host-to-device: a device array the package passes is where stock's
  computation reads it.)"""
  if _HOST_TO_DEVICE_GUARD is None:   # a release without guards
    return False
  level = _HOST_TO_DEVICE_GUARD.value
  return level is not None and level != "allow"


def transfers_allowed():
  """A context in which the package's own host-to-device transfers (a
  lifted NumPy array put on the device, as stock's compile puts a baked
  constant) pass whatever guard is in force."""
  return _config.transfer_guard_host_to_device("allow")


def checks_nans_or_infs() -> bool:
  """Whether ``jax_debug_nans`` or ``jax_debug_infs`` is on: a computation
  that gives one is re-run by JAX op by op, which reports as it goes."""
  return bool(_config.debug_nans.value or _config.debug_infs.value)


#: The config states ``checks_nans_or_infs`` reads (``.value``), for a hot
#: path reading them directly.
DEBUG_NANS, DEBUG_INFS = _config.debug_nans, _config.debug_infs


class _Off:
  """A config state this JAX lacks, read as off."""
  value = False


#: ``jax_log_checkpoint_residuals`` (``.value``): while it is on, JAX logs,
#: at each trace that differentiates a ``jax.checkpoint``, what it saves.
LOG_RESIDUALS = getattr(_config, "log_checkpoint_residuals", _Off())


#: The PRNG options a trace of ``jax.random`` reads (``.value``), which
#: JAX's trace context leaves out: a stock jitted object called again after
#: one changed answers from its earlier trace, a new object traces under
#: the new one (another key shape; a warning or an error for a raw key).
#: Any trace may read them (``jax.eval_shape`` of a key leaves no equation).
PRNG_IMPL = getattr(_config, "default_prng_impl", _Off())
CUSTOM_PRNG = getattr(_config, "enable_custom_prng", _Off())
LEGACY_KEYS = getattr(_config, "legacy_prng_key", _Off())
#: ``LEGACY_KEYS.value`` while raw keys are neither warned of nor refused.
KEYS_ALLOWED = getattr(getattr(_config, "LegacyPrngKeyState", None), "ALLOW",
                       False)


def prng_options() -> tuple:
  """The PRNG options in force, as one value (compared with ``==``)."""
  return (PRNG_IMPL.value, CUSTOM_PRNG.value, LEGACY_KEYS.value)


class StockReport(NamedTuple):
  """An option under which stock reports something as it traces or first
  runs each new function object: while ``test`` (a Python expression over
  ``states``, the config states it reads by name) is true, no shared trace,
  stored entry or canonical object answers a new object, whose call is
  stock's, said so as ``reason`` with ``detail``."""
  reason: str
  states: Mapping[str, Any]
  test: str
  detail: str


#: The options under which stock reports per trace. One table: the front
#: inlines :data:`REPORTS_TEST` in its generated refusal, the slow paths
#: call :func:`stock_reports`, the trace lookup :func:`reports_per_trace`.
#: Adding an option means adding a row.
STOCK_REPORTS = (
    StockReport(
        "debug_nans", {"DEBUG_NANS": DEBUG_NANS, "DEBUG_INFS": DEBUG_INFS},
        "DEBUG_NANS.value or DEBUG_INFS.value",
        "jax_debug_nans or jax_debug_infs is on: JAX re-runs a computation "
        "that gives one op by op, and stock's own function reports it"),
    StockReport(
        "log_checkpoint_residuals", {"LOG_RESIDUALS": LOG_RESIDUALS},
        "LOG_RESIDUALS.value",
        "jax_log_checkpoint_residuals is on: JAX logs what each trace's "
        "differentiated checkpoints save, and a shared trace is not traced "
        "again"),
    StockReport(
        "legacy_prng_key",
        {"LEGACY_KEYS": LEGACY_KEYS, "KEYS_ALLOWED": KEYS_ALLOWED},
        "LEGACY_KEYS.value is not KEYS_ALLOWED",
        "jax_legacy_prng_key warns of or refuses raw keys: each trace that "
        "uses one warns or raises for itself"),
)
#: Any row of :data:`STOCK_REPORTS` asked now, as one expression over
#: :data:`REPORTS_NAMES`.
REPORTS_TEST = " or ".join(f"({r.test})" for r in STOCK_REPORTS)
REPORTS_NAMES = types.MappingProxyType(
    {k: v for r in STOCK_REPORTS for k, v in r.states.items()})
_asked = tuple(
    (r.reason, r.detail,
     eval(compile(f"lambda: {r.test}", __file__, "eval"), dict(r.states)))
    for r in STOCK_REPORTS)
#: Whether any row of :data:`STOCK_REPORTS` is asked now.
reports_per_trace = eval(compile(f"lambda: bool({REPORTS_TEST})", __file__,
                                 "eval"), dict(REPORTS_NAMES))


def stock_reports() -> tuple[str, str] | None:
  """The first row of :data:`STOCK_REPORTS` asked now, as ``(reason,
  detail)``; None while none is."""
  for reason, detail, asked in _asked:
    if asked():
      return reason, detail
  return None


#: ``jax_captured_constants_warn_bytes``: ``WARN_BYTES.value``, read on a
#: stored entry's hit (a threshold lowered since the entry was stored makes
#: a new object's lowering warn, which the hit would skip).
WARN_BYTES = _config.captured_constants_warn_bytes


def constants_bytes(arrays=()) -> int:
  """The bytes stock's lowering counts of ``arrays`` against
  ``jax_captured_constants_warn_bytes`` (those without ``nbytes``: 0)."""
  return sum(getattr(x, "nbytes", 0) for x in arrays)


def captured_constants_warning(arrays=(), nbytes: int = 0) -> str | None:
  """Why stock's lowering of a trace capturing ``arrays`` (any values;
  those without ``nbytes`` count 0) plus ``nbytes`` more bytes warns of its
  captured constants, or None. JAX warns from
  ``jax_captured_constants_warn_bytes`` on (-1, exactly: never; any other
  negative value: always), at every lowering, which a shared lowering's
  hit skips: every route that shares one asks this, and shares none that
  it answers."""
  warn = _config.captured_constants_warn_bytes.value
  if warn == -1:
    return None
  total = nbytes + constants_bytes(arrays)
  if total < warn:
    return None
  return (f"its captured constants ({total} bytes) reach "
          f"jax_captured_constants_warn_bytes ({warn}): stock's lowering "
          "warns of them at every call, which a shared one would not")


def holds_zero(c, negative_only: bool = False,
               inexact_only: bool = True) -> bool:
  """Whether a constant holds a zero: of a floating or complex type (of
  either sign, or only -0.0), or, without ``inexact_only``, of any numeric
  or boolean type (``False`` too). XLA treats such a constant, baked into
  a module, by value (``-0.0 == 0.0``): it folds ``x + zeros`` to ``x``,
  stores ``[-0.0, 1.0]`` as an iota and ``x * mask`` as a product, where
  with an argument it sums, keeps the sign, or selects; so a baked zero's
  sign can reach the result otherwise than an argument's. Never an error:
  a PRNG key's extended dtype is no numeric type."""
  if type(c) in (float, int, bool, complex):
    if type(c) is not float and inexact_only:
      return False
    return c == 0 and (not negative_only or bool(np.signbit(c.real)))
  dtype = getattr(c, "dtype", None)
  if dtype is None:
    return False
  if not inexact_dtype(dtype):
    if inexact_only or negative_only:
      return False
    try:
      return bool(_dtypes.issubdtype(dtype, np.number)
                  or _dtypes.issubdtype(dtype, np.bool_)) and bool(
                      np.any(np.asarray(c) == 0))
    except Exception:
      return False
  a = np.asarray(c)
  if a.dtype.kind == "c":
    a = np.concatenate([a.real.ravel(), a.imag.ravel()])
  elif a.dtype.kind != "f":   # bfloat16, float8: compared as float32
    a = a.astype(np.float32)
  zero = a == 0
  return bool(np.any(zero & np.signbit(a) if negative_only else zero))


def all_zero(c, *, booleans: bool = False, unknown: bool = False,
             partly: bool = False) -> bool:
  """Whether a constant (an array or a Python number) is all zeros, of a
  numeric type, or with ``booleans`` of a boolean one too (``False``): XLA
  folds ``x + c`` to ``x`` for such a constant baked into a module, and so
  keeps a ``-0.0`` of ``x`` that the addition of an argument holding those
  zeros makes ``0.0``. ``unknown`` is the answer where the values cannot be
  read (an extended dtype, a conversion that fails). ``partly``: whether
  any element is a zero. Never an error."""
  if type(c) in (int, float, complex) or (booleans and type(c) is bool):
    return c == 0
  dtype = getattr(c, "dtype", None)
  if dtype is None:
    return False
  try:
    if not (_dtypes.issubdtype(dtype, np.number)
            or (booleans and _dtypes.issubdtype(dtype, np.bool_))):
      return unknown
    a = np.asarray(c)
    if a.dtype.kind not in "biufc":   # bfloat16, float8: as float32
      a = a.astype(np.float32)
    if partly:   # (any element zero: a slice of it may be all zeros)
      return a.size > 0 and not np.all(a)
    return a.size > 0 and not np.any(a)
  except Exception:
    return unknown


def all_one_value(c, *, unknown: bool = True) -> bool:
  """Whether a constant array of more than one element has every element
  equal by value to its first (``-0.0 == 0.0``): XLA's simplifier makes
  such a baked constant a scalar's broadcast. ``unknown`` is the answer
  where the values cannot be read (an extended dtype). Never an error."""
  try:
    if extended_dtype(getattr(c, "dtype", None)):
      return unknown
    a = np.asarray(c)
    if a.size <= 1:
      return False
    if a.dtype.kind not in "biufc":   # bfloat16, float8: as float32
      a = a.astype(np.float32)
    flat = a.ravel()
    return bool(np.all(flat == flat[0]))
  except Exception:
    return unknown


#: The values XLA's simplifier removes an operation by, once it sees a
#: constant all of one of them: ``x * 1``, ``x / 1`` and ``x * -1`` (a
#: negation), ``max(x, -inf)``, ``min(x, inf)``, a clamp between infinities.
#: The runtime's operation with an argument holding them flushes a
#: subnormal ``x`` to zero and keeps a NaN's sign, where stock's module
#: returns ``x`` (or its negation) as it is.
IDENTITY_VALUES = (1.0, -1.0, float("inf"), float("-inf"))


def all_identity(c, partly: bool = False) -> bool:
  """Whether a constant (an array or a Python number) of a numeric type
  is all one of :data:`IDENTITY_VALUES` (a complex one with a zero
  imaginary part; an integer one all 1 or all -1, which a conversion to a
  float folded in stock's module makes a float one); with ``partly``,
  whether any element is one (a slice of it may be all one). Never an
  error (False where the values cannot be read)."""
  if type(c) in (float, int):
    return c in IDENTITY_VALUES
  if type(c) is complex:
    return c.imag == 0 and c.real in IDENTITY_VALUES
  a = _inexact_values(c)
  if a is None:
    dtype = getattr(c, "dtype", None)
    try:
      if dtype is None or not _dtypes.issubdtype(dtype, np.integer):
        return False
      a = np.asarray(c)
    except Exception:
      return False
  if a.size == 0:
    return False
  if a.dtype.kind == "c":
    if partly:
      return bool(np.any((a.imag == 0) & np.isin(a.real, IDENTITY_VALUES)))
    if np.any(a.imag):
      return False
    a = a.real
  if partly:
    return bool(np.any(np.isin(a, IDENTITY_VALUES)))
  first = a.flat[0]
  return bool(first in IDENTITY_VALUES and np.all(a == first))


def holds_nan(c) -> bool:
  """Whether a constant (an array or a Python number) of a floating or
  complex type holds a NaN: XLA folds a baked NaN (``max(x, nan)``) to
  a NaN of another sign than it computes with an argument. Never an
  error (False where the values cannot be read)."""
  if type(c) in (float, complex):
    return c != c
  a = _inexact_values(c)
  return a is not None and bool(np.isnan(a).any())


def scan_groups(params) -> tuple[int, int] | None:
  """How many of a ``scan``'s operands are constants and how many its
  carry (the rest are scanned): ``num_consts``/``num_carry`` on jax 0.10,
  the flat trees ``ft_in`` (constants, carry, scanned) on 0.11; None for
  another equation."""
  if "num_consts" in params and "num_carry" in params:
    return params["num_consts"], params["num_carry"]
  ft_in = params.get("ft_in")
  if ft_in is None or "jaxpr" not in params:
    return None
  try:
    # a tuple of tuples, or jax's flat tree of them (``FTTuple``, whose
    # parts count their leaves in ``vals``)
    parts = ft_in if type(ft_in) is tuple else ft_in.unpack()
    if len(parts) != 3:
      return None
    consts, carry = (len(p) if type(p) is tuple else len(list(p.vals))
                     for p in parts[:2])
  except Exception:   # another form: unknown
    return None
  return consts, carry
