"""The one package that touches JAX's private internals (this module, and
``trace`` for layer two's seams in pjit, the trace lookup and stages).

Supports the releases in ``SUPPORTED_RELEASES``: every name imported from
``jax._src`` or ``jaxlib`` below was read against jax 0.10.2, and where a
later release changed it the seam is chosen by feature detection (never by
version string: 0.11.0 and 0.11.2 differ inside one minor release).
Retargeting to another release starts here (see CONTRIBUTING.md); nothing
else in the package imports a private JAX module.
"""

from __future__ import annotations

import jax
import jaxlib
from jax._src import api as _api
from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import source_info_util as _source_info_util
from jax._src import traceback_util as _traceback_util
from jax._src import util as _util
from jax._src.lib import _jax as _jaxlib_ext
import contextlib as _contextlib
import types as _types
import gc as _gc
import os as _os
import sys as _sys
import threading as _threading

import numpy as _np

# JAX hides its own frames from user tracebacks, and from the source
# information it records for each equation (the locations of a lowered
# module, which an error while lowering quotes); ours are no more the
# user's business than pjit's are (``JAX_TRACEBACK_FILTERING=off`` shows
# them in tracebacks).
_PACKAGE_DIR = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_traceback_util.register_exclusion(_PACKAGE_DIR)
if hasattr(_source_info_util, "register_exclusion"):
  _source_info_util.register_exclusion(_PACKAGE_DIR)

#: The releases this package runs on, with what runs there (the one table
#: ``doctor``, ``enable()`` and the activation hook read; jaxlib must be the
#: same release). "full": the three layers; "front": layers one and three
#: (``jit``, control flow, static functions), JAX's trace lookup left stock
#: (see ``TRACE_LOOKUP_MISSING`` for the seams it would lack).
SUPPORTED_RELEASES = {
    "0.10.2": "full",
    "0.11.0": "full",
    "0.11.1": "full",
    "0.11.2": "full",
}
#: The upstream pull requests (``patches/prs/<pr>/<tag>/``) ``patch`` applies,
#: in this order, and the tag whose version of them applies to each release
#: (the jax-v0.11.0 version also applies to the 0.11.2 wheel). The package
#: itself runs on every release of ``SUPPORTED_RELEASES`` without them.
PULL_REQUESTS = ("share-lowering-by-structure", "control-flow-dedup-consts")
PULL_REQUEST_TAGS = {"0.10.2": "jax-v0.10.2", "0.11.0": "jax-v0.11.0",
                     "0.11.2": "jax-v0.11.0"}


def jax_carries_pull_requests() -> bool:
  """Whether the installed jax carries the upstream pull requests (PR 1's
  ``jax_share_lowering_by_structure`` option is the sign)."""
  return hasattr(_config, "share_lowering_by_structure")


#: ``jax.jit`` as JAX defines it, whatever the patch registry has installed.
STOCK_JIT = _api.jit
#: ``jax.eval_shape`` as JAX defines it (it answers its own jitted objects
#: by their ``trace``, recognised by their C type).
STOCK_EVAL_SHAPE = _api.eval_shape

#: Every tracer type derives from this (the public ``jax.core.Tracer``).
Tracer = _core.Tracer
#: A jaxpr's literal operand (``.val``).
Literal = _core.Literal

#: The concrete array type behind ``jax.Array``; the hot path tests
#: ``type(x) is ArrayImpl`` before any ``isinstance``. Its ``_committed``
#: attribute says whether it was put on a device explicitly: such arrays are
#: never lifted, since as arguments they would commit the result.
ArrayImpl = _jaxlib_ext.ArrayImpl


def versions_match() -> bool:
  """Whether the running jax is a supported release, jaxlib the same one."""
  return (jax.__version__ in SUPPORTED_RELEASES
          and jaxlib.__version__ == jax.__version__)


def supported_text() -> str:
  """The supported releases, for messages: ``0.10.2, 0.11.0, ...``."""
  return ", ".join(SUPPORTED_RELEASES)


#: ``DISABLE_JIT.value`` is True inside ``jax.disable_jit()``; the hot path
#: reads the attribute directly rather than through a function call.
DISABLE_JIT = _config.disable_jit
#: Whether no trace is running (an eager call, not a trace's inner call).
trace_state_clean = _core.trace_state_clean


def _top_level_reads():
  """``trace_state_clean`` as config reads, for eager control flow's hot
  path (JAX's own check is two properties and two calls deep): the config
  states and values ``TracingContext`` compares, where this release keeps
  them as module attributes and its checks' code names them, with whether
  an empty trace state (None) also counts as clean (``is_empty``, where
  ``trace_state_clean`` calls it); None where the check is of another
  form, or the reads disagree with it now."""
  names = ("trace_state_strong_ref", "eval_trace", "axis_env_state",
           "top_axis_env")
  context = getattr(_core, "TracingContext", None)
  clean_names = getattr(getattr(trace_state_clean, "__code__", None),
                        "co_names", ())

  def reads(member, *read):   # a member's code names what is ``read``
    code = getattr(getattr(getattr(context, member, None), "fget",
                           getattr(context, member, None)), "__code__", None)
    return set(read) <= set(getattr(code, "co_names", ()))
  if (context is None or not all(hasattr(_core, n) for n in names)
      or not reads("is_top_level", "eval_trace", "top_axis_env")
      or not reads("trace", "trace_state_strong_ref")
      or not reads("axis_env", "axis_env_state")
      or "is_empty" in clean_names and not reads("is_empty", "trace")
      or not set(clean_names) <= {"trace_ctx", "is_top_level", "is_empty"}):
    return None
  state, eval_trace, axis, top = (getattr(_core, n) for n in names)
  empty_is_clean = "is_empty" in clean_names
  now = state.value
  if (now is eval_trace and axis.value is top
      or now is None and empty_is_clean) is not trace_state_clean():
    return None
  return state, eval_trace, axis, top, empty_is_clean


#: ``(trace_state, eval_trace, axis_env_state, top_axis_env,
#: empty_is_clean)``: no trace is running (``trace_state_clean``, read
#: directly) where ``trace_state.value is eval_trace and
#: axis_env_state.value is top_axis_env``, or (``empty_is_clean``) where
#: ``trace_state.value`` is None; None where this release's check is not
#: of that form.
TOP_LEVEL_READS = _top_level_reads()

from jax._src.interpreters import partial_eval as _pe   # noqa: E402

_NO_PARENT = object()


def staging() -> bool:
  """Whether a call now is staged into a jaxpr being built (``make_jaxpr``,
  an outer ``jit``, a loop's body: a ``DynamicJaxprTrace`` among the
  current trace and its parents), or runs under a trace of a kind with no
  parent to follow; False at the top level and under transformations of
  an eager call (``grad``, ``vmap``, ``jvp``), whose traces end at the
  eval trace."""
  t = _core.trace_ctx.trace
  while True:
    if t is None or isinstance(t, _core.EvalTrace):
      return False
    if isinstance(t, _pe.DynamicJaxprTrace):
      return True
    t = getattr(t, "parent_trace", _NO_PARENT)
    if t is _NO_PARENT:
      return True


#: What the jit front's hit reads first: ``(trace state, eval trace)``,
#: where the current trace is ``trace_state.value`` (else a stand-in whose
#: value is never the eval trace, so :func:`staging` decides every call).
TRACE_NOW = ((TOP_LEVEL_READS[0], TOP_LEVEL_READS[1])
             if TOP_LEVEL_READS is not None
             else (_types.SimpleNamespace(value=None), object()))
#: ``with NO_TRACING(True):`` a trace JAX would make raises ``RuntimeError``
#: before it runs the function (``jax_no_tracing``): what JAX's caches
#: answer is read without running the user's code again.
NO_TRACING = _config.no_tracing


def captured_constants(traced) -> list:
  """Every value a ``jax.stages.Traced`` closed over: baked constants plus
  the tracer constants that ``pe.separate_consts`` split off."""
  return [*traced.jaxpr.consts, *separated_constants(traced)]


def separated_constants(traced) -> list:
  """The constants ``pe.separate_consts`` split off a ``Traced``'s jaxpr,
  which its ``Lowered`` passes as the first arguments."""
  return traced._consts


#: The ``ArrayImpl`` attribute saying it was placed on a device explicitly
#: (the generated matchers read it by name on the hot path).
COMMITTED = "_committed"


def is_committed(x) -> bool:
  return getattr(x, COMMITTED)


#: ``jax_default_device`` (``jax.default_device``): where an array made from
#: an uncommitted one goes (``DEFAULT_DEVICE.value``, thread-local blocks
#: included).
DEFAULT_DEVICE = _config.default_device


from jax._src import mesh as _mesh_lib   # noqa: E402

_ABSTRACT_MESH_STATE = getattr(_config, "abstract_mesh_context_manager", None)
_DEVICE_CONTEXT_STATE = getattr(_config, "device_context", None)


def no_mesh_context() -> bool:
  """Whether no mesh is set for the current block (``jax.set_mesh``,
  ``jax.sharding.use_mesh``, the older ``with mesh:``): an array made
  there may take its mesh. Read from the config states where this jax has
  them (a hit path reads it), else through ``jax.sharding``."""
  if not _mesh_lib.thread_resources.env.physical_mesh.empty:
    return False
  if _ABSTRACT_MESH_STATE is not None and _DEVICE_CONTEXT_STATE is not None:
    a, d = _ABSTRACT_MESH_STATE.value, _DEVICE_CONTEXT_STATE.value
    return (a is None or a.empty) and (d is None or d.empty)
  return (jax.sharding.get_abstract_mesh().empty
          and jax.sharding.get_mesh().empty)


#: JAX's config object (``jax.config``), the module it lives in, and the
#: types of its settings.
JAX_CONFIG = _config.config
_SETTING_TYPES = tuple(t for t in (getattr(_config, "State", None),
                                   getattr(_config, "Flag", None))
                       if isinstance(t, type))


_context_names_memo: list = [None, frozenset()]   # [len(states), names]


def _trace_context_names() -> frozenset:
  """The names of JAX's trace-context settings (read again only where a
  setting was defined since)."""
  n = len(_config.config_states)
  if _context_names_memo[0] != n:
    _context_names_memo[:] = [n, frozenset(
        getattr(_config, "trace_context_names", tuple)())]
  return _context_names_memo[1]


def keyed_setting(config, attribute) -> bool:
  """Whether ``config.<attribute>`` (``config``: ``jax.config``, or the
  module defining it) reads a setting of JAX's trace context, which JAX's
  jit key holds (``JitKeyMirror`` the few it leaves out): a trace that
  branches on it is traced again where it changed. The module holds its
  settings by their Python names (``mutable_array_checks``)."""
  if type(attribute) is not str:
    return False
  if config is _config:
    setting = _config.__dict__.get(attribute)
    if not isinstance(setting, _SETTING_TYPES):
      return False
    attribute = getattr(setting, "name", None)
  return attribute in _trace_context_names()


def config_namespace(v) -> bool:
  """Whether ``v`` is ``jax.config`` or the module defining it."""
  return v is JAX_CONFIG or v is _config


def live_setting(v) -> bool:
  """Whether ``v`` is JAX's config (``jax.config``, the module defining it)
  or one of its settings no jit key holds (a state outside the trace
  context, a flag): a trace that reads it branches on the setting now, and
  one that writes it (``update``, a context left open) changes it for
  what follows; a hit that skips the trace would do neither."""
  if config_namespace(v):
    return True
  if not isinstance(v, _SETTING_TYPES):
    return False
  return getattr(v, "name", None) not in _trace_context_names()


def settings_now() -> tuple:
  """The process's settings a trace may change: every JAX config setting
  (this thread's value); NumPy's floating-point error handling, its
  callback, print options and buffer size; the interpreter's recursion
  limit, switch interval, integer-string limit, trace and profile
  functions; the garbage collector's switch and thresholds. Compared
  before and after a trace (``closure_cache.UnwatchedEffects``): one that
  changed them is never shared. About 11 us a call."""
  holders = getattr(JAX_CONFIG, "_value_holders", None)
  jax_values = (tuple([h.value for h in holders.values()])
                if holders is not None else tuple(JAX_CONFIG.values.values()))
  return (jax_values, tuple(_np.geterr().items()), _np.geterrcall(),
          tuple(_np.get_printoptions().items()), _np.getbufsize(),
          _sys.getrecursionlimit(), _sys.getswitchinterval(),
          _INT_DIGITS(), _sys.gettrace(), _sys.getprofile(),
          _gc.isenabled(), _gc.get_threshold())


_INT_DIGITS = getattr(_sys, "get_int_max_str_digits", lambda: None)


#: JAX's config states its traces read (in its trace context) that its jit
#: key leaves out, by name (``jax_disable_jit`` aside: jit reads it itself):
#: a stock jitted object called again after one changed answers from its
#: C++ cache, made under the old value, where a fresh object traces anew
_TRACE_ONLY_STATE_NAMES = ("jax_high_dynamic_range_gumbel",
                           "jax_mutable_array_checks",
                           "jax_hlo_source_file_canonicalization_regex")


class JitKeyMirror:
  """The values of the trace-only states (:data:`_TRACE_ONLY_STATE_NAMES`,
  those the running jax has in its trace context) put into JAX's jit key,
  through two user contexts of its own (``jax.make_user_context``, each
  part of the key): one holds the states' global values and is never set
  per thread; the other holds, per thread, each state's own value there
  (``unset`` where it has none), unset itself in a thread where no state
  has one. The states' update hooks keep both in step, so a global change
  moves the key in every thread, a block's value in its own. A stock
  jitted object the cache calls for many fresh functions (a shared
  entry's, a canonical one) then misses JAX's C++ cache where one of them
  changed, and traces under the new value, as a fresh object would.

  Invariants: the hooks call the states' own first. A thread already
  inside a state's block when the cache is switched on is seen at its
  next entry or exit of one."""

  def __init__(self, names=_TRACE_ONLY_STATE_NAMES):
    in_context = _trace_context_names()
    self.states = tuple(_config.config_states[n] for n in names
                        if n in in_context and n in _config.config_states)
    self._globals = self._locals = None

  def patch_points(self) -> list:
    """(state, hook attribute, hook) for each state; the mirror's values
    set to the states' now. Empty where this jax lacks the seams."""
    if (not self.states or not hasattr(jax, "make_user_context")
        or not all(hasattr(s, "_update_global_hook") for s in self.states)):
      return []
    if self._globals is None:   # (once: a user context is never removed)
      self._globals = jax.make_user_context(None)._obj
      self._locals = jax.make_user_context(None)._obj
    self._sync_global()
    self._sync_local()
    points = []
    for state in self.states:
      for name, sync in (("_update_global_hook", self._sync_global),
                         ("_update_thread_local_hook", self._sync_local)):
        own = getattr(state, name)
        own = getattr(own, "_jcc_own_hook", own)   # (never ours twice)
        points.append((state, name, _chained_hook(own, sync)))
    return points

  def _sync_global(self) -> None:
    self._globals.set_global(tuple(s.get_global() for s in self.states))

  def _sync_local(self) -> None:
    unset = _config.config_ext.unset
    local = tuple(s.get_local() for s in self.states)
    self._locals.set_local(
        unset if all(v is unset for v in local) else local)


def _chained_hook(own, sync):
  def hook(value):
    if own is not None:
      own(value)
    sync()
  hook._jcc_own_hook = own
  return hook


JIT_KEY_MIRROR = JitKeyMirror()


def cache_size(jitted) -> int:
  """Executables compiled for a stock jitted function."""
  return jitted._cache_size()


from jax._src import pjit as _pjit_module   # noqa: E402

_CPP_PJIT = getattr(_pjit_module, "_cpp_pjit", None)


def wrapped_name(fun) -> str:
  """The ``__name__`` stock's jitted object of ``fun`` carries: its own, a
  ``functools.partial``'s function's, as JAX's ``util.wraps`` names it."""
  return _util.fun_name(fun)


def jit_info(jitted):
  """The options a stock jitted object was made with, as ``jit()`` parsed
  and validated them against its function (``_jit_info``), or None."""
  return getattr(jitted, "_jit_info", None)


def jit_with_info(fun, info):
  """Stock's jitted object of ``fun`` made from ``info``, the parsed
  options of an earlier one of the same function and options: what
  ``jax.jit`` would make (its last step, ``pjit._cpp_pjit``), without
  parsing the signature again; None where JAX has no such step."""
  if _CPP_PJIT is None or info is None:
    return None
  return _CPP_PJIT(fun, info)


def jit_static_arguments(jitted) -> tuple | None:
  """``(static_argnums, static_argnames)`` of a stock jitted function as
  its ``jit()`` resolved them against the function's signature (a static
  name passed by position, a static number by keyword), or None where the
  object does not say."""
  return jit_static_arguments_of(jit_info(jitted))


def jit_static_arguments_of(info) -> tuple | None:
  """:func:`jit_static_arguments` of the parsed options ``info``."""
  nums = getattr(info, "static_argnums", None)
  names = getattr(info, "static_argnames", None)
  if nums is None or names is None:
    return None
  return tuple(nums), tuple(names)


def live_executables() -> int:
  """Executables the default backend holds now (each keeps its code and
  buffers), for bounding what the cache keeps alive against stock."""
  return len(jax.devices()[0].client.live_executables())


def count_traces():
  """JAX's own trace counter (``pe.trace_to_jaxpr`` misses), as a context
  manager yielding a read-out function. Imported on use: ``jax._src.test_util``
  needs absl, which the cache itself does not."""
  from jax._src import test_util
  return test_util.count_jit_tracing_cache_miss()


def count_compiles():
  """JAX's own XLA compilation counter; see :func:`count_traces`."""
  from jax._src import test_util
  return test_util.count_jit_compilation_cache_miss()


# -- control flow --------------------------------------------------------------

from jax._src import lax as _internal_lax   # noqa: E402
from jax._src.lax.control_flow import conditionals as _conditionals   # noqa: E402
from jax._src.lax.control_flow import loops as _loops   # noqa: E402
from jax._src.lax.control_flow import solves as _solves   # noqa: E402

#: The control-flow functions as JAX defines them, taken from their defining
#: modules, which ``enable()`` never patches.
STOCK_CONTROL_FLOW = {
    "while_loop": _loops.while_loop,
    "fori_loop": _loops.fori_loop,
    "scan": _loops.scan,
    "map": _loops.map,
    "cond": _conditionals.cond,
    "switch": _conditionals.switch,
    "custom_linear_solve": _solves.custom_linear_solve,
    "custom_root": _solves.custom_root,
}

import jax.scipy.sparse.linalg   # noqa: E402
from jax._src.scipy.sparse import linalg as _sparse_linalg   # noqa: E402

#: JAX's iterative solvers whose eager set-up before their custom linear
#: solve is exact (``zeros_like``, ``device_put``, shape checks), as JAX
#: defines them; and the modules callers look them up in, their defining
#: one included (none of its own functions calls them, and ``pickle``
#: finds a function by its module and name there).
STOCK_SOLVERS = _types.MappingProxyType({
    "cg": _sparse_linalg.cg,
    "bicgstab": _sparse_linalg.bicgstab,
})
SOLVER_OWNERS = (jax.scipy.sparse.linalg, _sparse_linalg)

import jax.custom_derivatives   # noqa: E402
from jax._src import custom_derivatives as _custom_derivatives   # noqa: E402

#: ``jax.closure_convert`` as JAX defines it, and the owners whose attribute
#: callers look up at call time (``jax.experimental.ode`` reads the public
#: ``jax.custom_derivatives`` module's).
STOCK_CLOSURE_CONVERT = _custom_derivatives.closure_convert
CLOSURE_CONVERT_OWNERS = (jax, jax.custom_derivatives, _custom_derivatives)


_convert_tree_form: list = []   # filled by the first _convert_tree call


def _convert_tree(example_args):
  """The arguments' tree as stock ``closure_convert`` builds it: of the
  arguments (0.10), or of ``(args, {})`` (0.11 on). Told apart by
  behaviour, once: the ``in_tree`` a stock conversion of ``lambda x: x``
  keeps in its converted function's closure."""
  if not _convert_tree_form:
    converted, _ = STOCK_CLOSURE_CONVERT(lambda x: x, 0.0)
    cells = dict(zip(converted.__code__.co_freevars,
                     converted.__closure__ or ()))
    kept = cells["in_tree"].cell_contents if "in_tree" in cells else None
    _convert_tree_form.append(
        kept == jax.tree_util.tree_structure(((0.0,), {})))
  tree = (tuple(example_args), {}) if _convert_tree_form[0] else example_args
  return jax.tree_util.tree_flatten(tree)


def closure_convert_uncached(fun, example_args):
  """Stock ``closure_convert``'s trace without its ``lru_cache``, which holds
  every function it saw (and what it closes over) until evicted."""
  flat, in_tree = _convert_tree(example_args)
  in_avals = tuple(map(_core.typeof, flat))
  debug = _api_util.debug_info("closure_convert", fun, example_args, {})
  return _custom_derivatives._closure_convert_for_avals.__wrapped__(
      fun, in_tree, in_avals, debug)


def closure_converted_constants(converted) -> list:
  """The concrete values a stock ``converted_fun`` evaluates its jaxpr with
  (its ``closure_consts`` cell)."""
  cells = dict(zip(converted.__code__.co_freevars, converted.__closure__ or ()))
  cell = cells.get("closure_consts")
  return list(cell.cell_contents) if cell is not None else []


def trace_signature(example_args):
  """What stock keys a ``closure_convert`` trace on besides the function:
  the arguments' tree, their abstract values and JAX's trace context."""
  flat, in_tree = _convert_tree(example_args)
  return in_tree, tuple(map(_core.typeof, flat)), _config.trace_context()


#: Modules whose control-flow attributes callers look up at call time:
#: ``jax.lax`` for users, and ``jax._src.lax``, through which JAX's own
#: modules (``jax.scipy.optimize.minimize`` among them) call ``while_loop``.
CONTROL_FLOW_OWNERS = (jax.lax, _internal_lax)

# -- stock jitted functions built before enable() ---------------------------------

#: Module-level stock jitted functions of JAX's own that take functions as
#: static arguments, and which their module looks up by name at call time:
#: ``enable()`` replaces them with the package's ``jit`` of the same function
#: and options, so a fresh vector field or piece function per call hits even
#: when the module was imported (and the wrapper built) before ``enable()``.
#: (``jnp.piecewise``'s ``_piecewise`` is not here: it takes its functions
#: in a frozenset, whose order follows their identity hashes, so no key of
#: its contents would repeat.)
JAX_PREBUILT_WRAPPERS = (("jax.experimental.ode", "_odeint_wrapper"),)
from jax._src.sharding_impls import UNSPECIFIED   # noqa: E402
_PjitFunction = type(STOCK_JIT(lambda x: x))
# Parameter names (besides a ``Callable`` annotation) that mark a static
# argument as a function, for the report on other libraries' wrappers.
_FUNCTION_PARAMETERS = frozenset({"fun", "func", "funcs", "f", "fn", "function",
                                  "functions", "body", "callback", "matvec"})


def jit_options_of(jitted) -> dict | None:
  """The ``jax.jit`` options a stock jitted function was built with, as
  keywords, when they are plain (static and donated arguments,
  ``keep_unused``, ``inline``, ``device``, ``backend``); None for anything
  else (shardings, layouts, compiler options: left as they are)."""
  if type(jitted) is not _PjitFunction:
    return None
  info = getattr(jitted, "_jit_info", None)
  if info is None or getattr(info, "user_specified_in_shardings", True):
    return None
  plain = (None, UNSPECIFIED)
  if (any(x not in plain for x in info.out_shardings_leaves)
      or any(x is not None for x in info.in_layouts_leaves)
      or any(x is not None for x in info.out_layouts_leaves)
      or info.compiler_options_kvs or getattr(info, "use_resource_env", False)):
    return None
  options = {"static_argnums": info.static_argnums,
             "static_argnames": info.static_argnames}
  if info.donate_argnums:
    options["donate_argnums"] = info.donate_argnums
  for name in ("keep_unused", "inline"):
    if getattr(info, name):
      options[name] = True
  for name in ("device", "backend"):
    if getattr(info, name) is not None:
      options[name] = getattr(info, name)
  return options


def takes_static_functions(jitted) -> bool:
  """Whether a stock jitted function has a static parameter that holds a
  function, read from its signature: annotated ``Callable`` or named as
  functions are (``fun``, ``func``, ...)."""
  info = getattr(jitted, "_jit_info", None)
  sig = getattr(info, "fun_signature", None)
  if sig is None:
    return False
  for i, p in enumerate(sig.parameters.values()):
    if i in info.static_argnums or p.name in info.static_argnames:
      if p.name in _FUNCTION_PARAMETERS or "Callable" in str(p.annotation):
        return True
  return False


def stock_wrappers_in(module) -> list:
  """(name, stock jitted function) for each module-level stock jitted
  function of ``module`` that takes functions as static arguments."""
  found = []
  for name, value in list(vars(module).items()):
    if type(value) is _PjitFunction and takes_static_functions(value):
      found.append((name, value))
  return found


# -- jaxprs and treedefs (layer one's rules: key/) ---------------------------

from jax._src import tree_util as _tree_util_private   # noqa: E402
from jax._src.tree_util import default_registry as _default_registry   # noqa: E402


def make_treedef(like, node_data, children):
  """The treedef with ``node_data`` (``(type, aux)``) at its root over
  ``children``, built as ``like``'s class builds one."""
  return like.from_node_data_and_children(_default_registry, node_data,
                                          children)


#: JAX's Python-side record of each registered node class's flatten and
#: unflatten functions (``tree_util._registry``, which 0.10 and 0.11 keep
#: beside the C++ registry), or None on a jax without it.
_NODE_FUNCTIONS = getattr(_tree_util_private, "_registry", None)


def pytree_node_functions(cls) -> tuple | None:
  """The flatten and unflatten functions registered for ``cls`` (``()``
  if it is registered with none of its own), or None where this jax does
  not say."""
  if not isinstance(_NODE_FUNCTIONS, dict):
    return None
  entry = _NODE_FUNCTIONS.get(cls)
  return () if entry is None else tuple(entry)


def flatten_one_level(tree):
  """``(children, node data)`` of a pytree node; ``ValueError`` for a leaf."""
  from jax._src.tree_util import flatten_one_level as flatten
  return flatten(tree)


# -- monitoring ----------------------------------------------------------------

from jax._src import monitoring as _monitoring   # noqa: E402

#: JAX's monitoring module; its ``_event_listeners`` list is non-empty when
#: a listener is registered (the hot path reads the attribute each time).
monitoring_module = _monitoring
#: That attribute's name, for generated code that reads it off the module
#: (``front/generated.py``'s hit): the one place the name is spelled.
MONITORING_LISTENERS = "_event_listeners"


from jax._src import dispatch as _dispatch   # noqa: E402

#: JAX's duration events for a trace, its lowering and its XLA compile.
COMPILE_DURATION_EVENTS = frozenset({
    _dispatch.JAXPR_TRACE_EVENT, _dispatch.JAXPR_TO_MLIR_MODULE_EVENT,
    _dispatch.BACKEND_COMPILE_EVENT})


def monitoring_active() -> bool:
  """Whether any ``jax.monitoring`` event listener is registered (read each
  time: ``clear_event_listeners`` rebinds the list)."""
  return bool(getattr(_monitoring, MONITORING_LISTENERS))


def weakref_lru_cache(fun, maxsize: int | None = None):
  """JAX's cache keyed weakly on ``fun``'s first argument (and on the trace
  context), unbounded unless ``maxsize``; ``jax.clear_caches()`` clears it."""
  from jax._src import util as _util
  return _util.weakref_lru_cache(fun, maxsize=maxsize)


def register_cache(cache, for_what: str) -> None:
  """``jax.clear_caches()`` calls ``cache.cache_clear()`` (JAX's registry)."""
  from jax._src import util as _util
  _util.register_cache(cache, for_what)


def explain_cache_misses() -> bool:
  """JAX's own ``jax_explain_cache_misses`` option."""
  return _config.explain_cache_misses.value


# Layer two's seams (pjit, the trace lookup, stages), in their own module.
from jax_closure_cache._compat import trace   # noqa: E402,F401  (_compat.trace)


def reset_persistent_cache() -> None:
  """Forget JAX's persistent compilation cache's set-up, so that a changed
  ``jax_compilation_cache_dir`` is read again (``bench``)."""
  from jax._src import compilation_cache
  compilation_cache.reset_cache()


class _PerThreadMute:
  """JAX's test-event listener, silent in a thread that is running the
  oracle: JAX counts its test events per thread, and the listener is one
  for the process, so muting it by swapping it out raced between threads
  (two threads verifying at once could leave it swapped out for good)."""

  def __init__(self, listener):
    self.listener = listener
    self.muted = _threading.local()

  def __call__(self, name, *args):
    if not getattr(self.muted, "on", False):
      self.listener(name, *args)


_mute_lock = _threading.Lock()


@_contextlib.contextmanager
def oracle_muted():
  """Within: JAX's test events (the trace, lowering and compile counters of
  ``jax._src.test_util``) are not sent from this thread, nor are its
  cache-miss explanations logged: verify mode's own oracle work is not the
  cache's, and a test counting the cache's traces must not see it."""
  from jax._src import util
  with _mute_lock:
    mute = util.test_event_listener   # None: nothing listens
    if mute is not None and not isinstance(mute, _PerThreadMute):
      mute = util.test_event_listener = _PerThreadMute(mute)
  was = mute is not None and getattr(mute.muted, "on", False)
  if mute is not None:
    mute.muted.on = True
  try:
    with _config.explain_cache_misses(False):   # nor JAX's explanations
      yield
  finally:
    if mute is not None:
      mute.muted.on = was


def _library_roots() -> tuple:
  import numpy
  return tuple(_os.path.dirname(_os.path.abspath(m.__file__)) + _os.sep
               for m in (jax, jaxlib, numpy))


_LIBRARY_ROOTS = _library_roots()


def stdlib_code(code) -> bool:
  """Whether ``code`` was loaded from the standard library's folder (not
  from the packages installed inside it, where Python has no venv), or is
  a standard module frozen into the interpreter (``<frozen posixpath>``)."""
  filename = code.co_filename
  for root in _STDLIB_ROOTS:
    if filename.startswith(root):
      rest = filename[len(root):]
      return not rest.startswith(_INSTALLED_DIRS)
  if filename.startswith("<frozen ") and filename.endswith(">"):
    name = filename[len("<frozen "):-1].partition(".")[0]
    return name in getattr(_sys, "stdlib_module_names", ())
  return False


_INSTALLED_DIRS = ("site-packages" + _os.sep, "dist-packages" + _os.sep)


_STDLIB_ROOTS = tuple({_os.path.dirname(_os.__file__) + _os.sep})


def library_code(code) -> bool:
  """Whether ``code`` was loaded from jax's, jaxlib's or numpy's own folder
  (decided by where its file lies, never by a ``__module__`` a decorator
  may have copied)."""
  return code.co_filename.startswith(_LIBRARY_ROOTS)


_OWN_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))) + _os.sep


def stable_package_code(code, packages=()) -> bool:
  """Whether ``code`` was loaded from the folder of jax, jaxlib, numpy or
  the standard library, or of one of ``packages`` (top-level names; their
  folders are found once each is imported): decided by where its file
  lies, never by a ``__module__`` that ``functools.wraps`` copied."""
  filename = code.co_filename
  if filename.startswith(_LIBRARY_ROOTS) or stdlib_code(code):
    return True
  for name in packages:
    root = _package_roots.get(name)
    if root is None:
      path = getattr(_sys.modules.get(name), "__file__", None)
      if not path:
        continue   # not imported (its code cannot run yet), or no folder
      root = _package_roots[name] = (
          _os.path.dirname(_os.path.abspath(path)) + _os.sep)
    if filename.startswith(root):
      return True
  return False


#: Top-level package name -> its folder, for ``stable_package_code``.
_package_roots: dict = {}


def library_or_own_code(code) -> bool:
  """:func:`library_code`, or this package's own (its explanations and
  checks read what the user's code reads, never for the user)."""
  filename = code.co_filename
  return filename.startswith(_LIBRARY_ROOTS) or filename.startswith(_OWN_ROOT)


# -- JAX's memoized conversion of NumPy arrays -----------------------------------
#
# ``dtypes.canonicalize_value`` converts a NumPy array to its canonical dtype
# (``float64`` to ``float32`` without x64) once per array object: the copy is
# memoized weakly by the array and weakly by the copy, so a trace reads the
# copy of an earlier trace while anything (a jaxpr in a cache) still holds
# it, although the array was changed in place since. Stock holds the copy no
# longer than the user holds the function objects that traced it; a stored
# entry of this package would hold it longer.

from jax._src import dtypes as _dtypes   # noqa: E402
import weakref as _weakref   # noqa: E402

_canonicalize_value = getattr(_dtypes, "canonicalize_value", None)
_canonicalize_dtype = getattr(_dtypes, "canonicalize_dtype", None)
#: id(array) -> its stale converted copy that releasing the package's own
#: entries did not free (held by the user's objects, as stock would be)
_stale_kept: "_weakref.WeakValueDictionary" = _weakref.WeakValueDictionary()


_canonicalize_dtype_in = getattr(_dtypes, "_canonicalize_dtype", None)
_X64_DEPENDENT = frozenset(map(_np.dtype, (
    "float64", "int64", "uint64", "complex128")))


def converted_by_x64(dtype) -> bool:
  """Whether JAX converts a NumPy array of ``dtype`` otherwise with
  ``jax_enable_x64`` on than off (``float64`` to ``float32`` without it, a
  view with it). Its memoized conversion of such an array is keyed by the
  array alone, not by the setting: while anything holds a trace of the
  array made under one setting, a trace under the other reads that
  copy, of the wrong dtype, and its lowering raises ``ValueError``
  (stock too, for as long as the user holds such a trace)."""
  if _canonicalize_dtype_in is not None:
    try:
      return (_canonicalize_dtype_in(True, False, dtype)
              != _canonicalize_dtype_in(False, False, dtype))
    except Exception:   # a dtype JAX does not take
      return False
  return _np.dtype(dtype) in _X64_DEPENDENT


def stale_conversion(arr):
  """JAX's memoized converted copy of NumPy array ``arr`` if it no longer
  holds ``arr``'s values (``arr`` was changed in place after a conversion
  something still holds), else None. Never stale where the dtype is kept
  (the conversion is then a view of ``arr``)."""
  if _canonicalize_value is None or _canonicalize_dtype is None:
    return None
  import numpy as np
  try:
    dtype = _canonicalize_dtype(arr.dtype)
    if dtype == arr.dtype:
      return None
    # the package's own conversions warn of nothing (an overflowing cast):
    # stock's trace warns where it converts
    with np.errstate(all="ignore"):
      converted = _canonicalize_value(arr)
      if _sys.getrefcount(converted) <= 2:   # made now: nothing else holds it
        return None
      fresh = np.asarray(arr, dtype)
    if np.array_equal(np.ascontiguousarray(converted).reshape(-1).view(np.uint8),
                      np.ascontiguousarray(fresh).reshape(-1).view(np.uint8)):
      return None
  except Exception:   # a dtype JAX does not take: its trace raises as stock's
    return None
  return converted


def stale_conversion_kept(arr, converted) -> bool:
  """Whether ``converted`` was found held elsewhere for ``arr`` before."""
  return _stale_kept.get(id(arr)) is converted


def note_stale_conversion_kept(arr, converted) -> None:
  try:
    _stale_kept[id(arr)] = converted
  except TypeError:   # not weakly referenceable: checked again next time
    pass


def current_trace():
  """The trace JAX's primitives bind to now (``core.trace_ctx.trace``)."""
  return getattr(getattr(_core, "trace_ctx", None), "trace", None)


def abandon_trace(trace) -> None:
  """Release ``trace``, the jaxpr trace of a lifted function that is leaving
  it by an exception, if it is still the current one and jit is on (a
  lifted function run eagerly under ``disable_jit`` has no trace of its
  own): what JAX's ``core.ensure_no_leaks`` does after a trace that
  returned (``invalidate``), and not after one that raised. Without it the
  trace's frame stays alive: each constant's tracer has a
  ``weakref.finalize`` whose callback holds the trace, whose frame's
  equations hold that tracer, so the frame and its constants (among them
  JAX's memoized conversion of a NumPy array, which a later stock trace of
  the array, changed in place since, then reads) live as long as the
  process. Stock abandons a trace only where the user's function raises;
  a refused lifted trace is the package's own."""
  if trace is None or trace is not current_trace() or DISABLE_JIT.value:
    return
  invalidate = getattr(trace, "invalidate", None)
  if invalidate is not None and hasattr(trace, "frame"):   # a jaxpr trace
    invalidate()


def own_constants(consts) -> tuple:
  """``consts`` for a trace the package stores: each NumPy constant (a
  ``TypedNdArray`` or plain array, which a trace takes as a view of the
  user's array where no conversion was needed) copied, so that the stored
  trace keeps the values it was keyed by when the user changes the array in
  place (stock traces again, and reads the new values, for its next
  function object). Others as they are."""
  import numpy as np
  return tuple([c.copy() if isinstance(c, np.ndarray) and not c.dtype.hasobject
                else c for c in consts])


def own_constants_in_place(closed) -> None:
  """:func:`own_constants` for a closed jaxpr that is the package's own trace
  (a lifted function's, which pjit's caches hold as the stored entry's):
  its constants list is replaced item by item, so those caches keep the
  copies. A jaxpr nested in an equation's parameters (a nested jit's, a loop
  body's) is never changed: it may be stock's own (a long-lived inner jit's
  trace, held by stock's caches with JAX's memoized conversion of an
  array); the equation is replaced in the equations list by one holding
  its :func:`owned_copy`."""
  consts = getattr(closed, "consts", None)
  if type(consts) is list:
    for i, c in enumerate(own_constants(consts)):
      if c is not consts[i]:
        consts[i] = c
  eqns = getattr(getattr(closed, "jaxpr", closed), "eqns", None)
  if type(eqns) is list:
    memo: dict = {}
    for i, e in enumerate(eqns):
      new = _owned_eqn(e, memo)
      if new is not e:
        eqns[i] = new


def owned_copy(closed):
  """``closed`` as a stored trace keeps it: :func:`own_constants` applied to
  its constants and to every jaxpr nested in its equations' parameters,
  rebuilding only what holds a NumPy constant (``closed`` itself where none
  does). ``closed`` is left as it is: it is stock's own trace, which pjit's
  caches hold, and with it JAX's memoized conversion of an array, for as
  long as they would without the package."""
  return _owned(closed, {})


def constants_nbytes(closed) -> int:
  """The bytes of the constants ``closed`` holds, its own and those of every
  jaxpr nested in its equations' parameters (each jaxpr counted once)."""
  seen: set = set()
  todo, total = [closed], 0
  while todo:
    x = todo.pop()
    t = type(x)
    if t is tuple or t is list:
      todo.extend(x)
      continue
    if not isinstance(x, (_core.ClosedJaxpr, _core.Jaxpr)) or id(x) in seen:
      continue
    seen.add(id(x))
    total += sum(int(getattr(c, "nbytes", 0) or 0)
                 for c in getattr(x, "consts", None) or ())
    open_jaxpr = getattr(x, "jaxpr", x)
    if open_jaxpr is not x:
      todo.append(open_jaxpr)
    for e in getattr(open_jaxpr, "eqns", ()):
      todo.extend(e.params.values())
  return total


def _owned(x, memo: dict):
  t = type(x)
  if t is tuple or t is list:
    items = [_owned(v, memo) for v in x]
    return x if all(a is b for a, b in zip(items, x)) else t(items)
  if not isinstance(x, (_core.ClosedJaxpr, _core.Jaxpr)):
    return x
  done = memo.get(id(x))
  if done is not None:
    return done[1]
  memo[id(x)] = (x, x)   # a jaxpr reached again within itself: as it is
  if isinstance(x, _core.ClosedJaxpr) and _core.ClosedJaxpr is not _core.Jaxpr:
    open_jaxpr = _owned(x.jaxpr, memo)
    consts = own_constants(x.consts)
    new = x if open_jaxpr is x.jaxpr and _same(consts, x.consts) else (
        _core.ClosedJaxpr(open_jaxpr, list(consts)))
  else:
    changes = {}
    eqns = [_owned_eqn(e, memo) for e in x.eqns]
    if not _same(eqns, x.eqns):
      changes["eqns"] = eqns
    old = getattr(x, "consts", None)   # 0.11: a jaxpr carries its constants
    if _core.ClosedJaxpr is _core.Jaxpr and old:
      consts = own_constants(old)
      if not _same(consts, old):
        changes["consts"] = list(consts)
    new = x.replace(**changes) if changes else x
  memo[id(x)] = (x, new)
  return new


def _owned_eqn(e, memo: dict):
  params = {k: _owned(v, memo) for k, v in e.params.items()}
  return e if _same(params.values(), e.params.values()) else e.replace(
      params=params)


def _same(new, old) -> bool:
  return all(a is b for a, b in zip(new, old))


#: JAX's custom-derivative objects, and the attributes holding the rules
#: JAX keeps in a trace and runs when it differentiates it.
CUSTOM_RULE_ATTRIBUTES = {jax.custom_jvp: frozenset({"jvp"}),
                          jax.custom_vjp: frozenset({"fwd", "bwd"})}
