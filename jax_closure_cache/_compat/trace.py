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
from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import pjit as _pjit
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import common as _control_flow_common
from jax._src import stages as _stages
try:   # 0.10: a class in tree_util; 0.11 moved it (see TRACE_LOOKUP)
  from jax._src.tree_util import FlatTree   # noqa: F401
except ImportError:
  FlatTree = None

#: ``pe.trace_to_jaxpr`` (a ``weakref_lru_cache`` keyed on the function) and
#: the pjit functions around it, as JAX defines them.
# With the series applied, ``trace_to_jaxpr`` looks a function it has not
# answered up by closure key and ``_trace_to_jaxpr`` is the uncached trace.
STOCK_TRACE_TO_JAXPR = getattr(_pe, "_trace_to_jaxpr", _pe.trace_to_jaxpr)
STOCK_TRACE_FOR_JIT = _pjit._trace_for_jit
STOCK_INFER_PARAMS = _pjit._infer_params
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
tree_structure = jax.tree_util.tree_structure
separate_consts = getattr(_pe, "separate_consts", None)
typeof = _core.typeof
eval_jaxpr = _core.eval_jaxpr
trace_context = _config.trace_context


def jit_debug_info(fun, args, kwargs):
  """The debug info pjit traces ``fun`` with (no static arguments)."""
  return _api_util.debug_info("jit", fun, args, kwargs)


def _trace_lookup_seams() -> list[str]:
  """The seams layer two is written against that the running jax lacks
  (empty on 0.10.2): checked by feature, not by version string."""
  missing = []
  if FlatTree is None:
    missing.append("jax._src.tree_util.FlatTree (0.11 moved it to "
                   "jax._src.flattree)")
  if ClosedJaxpr is Jaxpr:
    missing.append("a ClosedJaxpr distinct from Jaxpr (0.11 merged them, so "
                   "one jaxpr shared by identity across closures cannot be "
                   "closed over each one's leaves)")
  if not hasattr(_pe, "separate_consts"):
    missing.append("pe.separate_consts")
  return missing


#: Why layer two (the closure key inside JAX's trace lookup) cannot run on
#: this jax; empty where it can. Where it cannot, ``enable()`` installs the
#: front alone (layers one and three: ``jit``, control flow, static
#: functions), which reads none of these seams.
TRACE_LOOKUP_MISSING = _trace_lookup_seams()
TRACE_LOOKUP = not TRACE_LOOKUP_MISSING

#: (module, attribute) of each function layer two replaces; callers look
#: them up as module globals at call time: ``pe.trace_to_jaxpr`` from pjit
#: and the control-flow modules, the pjit ones from ``cache_miss`` and
#: ``jit_trace``.
TRACE_PATCH_POINTS = ((_pe, "trace_to_jaxpr"), (_pjit, "_trace_for_jit"),
                      (_pjit, "_infer_params"), (_pjit, "_get_fastpath_data"),
                      (_control_flow_common, "_dedup_consts"),
                      (_stages.Traced, "lower"))
