"""Generate the upstream patch series, ``patches/series/<tag>/000N-*.patch``.

A pull request against JAX's own sources at each tag of ``TAGS`` (source layout:
``jax/...``, ``tests/...``): two new modules, ``jax/_src/closure_key.py``
and ``jax/_src/closure_cache.py``, which are ``jax_closure_cache/lookup/``'s
files of the same names (the package runs them in monkey-patch mode) byte
for byte but for the lines importing the key and flat trees
(``PACKAGE_IMPORTS``), and
small edits to JAX's own files, in four patches, as ``git format-patch`` writes them, that each
apply, and pass their tests, on their own:

1. control flow's ``_dedup_consts`` keyed on the constants' sharing pattern
   (a fix that stands alone, with a test in ``lax_control_flow_test.py``);
2. the closure key and the closure-keyed trace lookup behind the
   ``jax_closure_cache`` option (``config.py``, ``partial_eval.py``), its
   BUILD rules and CHANGELOG entry;
3. pjit, the ahead-of-time stages and the C++ fast path pass a shared
   jaxpr's constants as arguments (carried in ``PjitParams``/``Traced``);
4. explanations of misses (``pe.explain``).

One table of edits, written against jax-v0.10.2; a later tag lists only the
edits whose anchor or text differ there (``RETARGETED``) and how its modules
import flat trees (``FLAT_TREES``). Every file is read from a checkout of
the tag (``--jax-repo``, default ``/work/.mirror/jax-ml+jax/repo``); without
one, the installed jax's ``.py`` files stand in for the tag it was released
from. ``--check`` fails when a committed patch differs from a fresh
generation.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SERIES = os.path.join(HERE, "series")   # one folder per tag
MODULES = ("closure_key.py", "closure_cache.py")   # in jax_closure_cache/lookup
#: The line by which the package's cache module imports its key module, and
#: JAX's.
PACKAGE_IMPORTS = (("from jax_closure_cache.lookup import closure_key\n",
                    "from jax._src import closure_key\n"),
                   ("from jax_closure_cache._compat.trace import flat_trees as ft\n",
                    None))   # FLAT_TREES[tag]
TEST = os.path.join(HERE, "closure_key_test.py")
#: The tags a series is cut against, and the installed release each one is
#: applied to by ``python -m jax_closure_cache patch`` (``_compat.SERIES``).
TAGS = ("jax-v0.10.2", "jax-v0.11.0", "jax-v0.11.1", "jax-v0.11.2")
#: Tags not in the checkout, cut from the installed release's own
#: ``jax/**.py`` files (the wheel): only where that release is installed, and
#: without the edits to ``BUILD`` files, the CHANGELOG and JAX's existing
#: tests, which a wheel does not carry. They serve ``patch`` and the
#: patched-jax tests on that release; the pull request is the tag series.
FROM_WHEEL = ("jax-v0.11.1", "jax-v0.11.2")
#: How the cache module imports flat trees at each tag (0.11 made them a
#: module of functions with the same names).
FLAT_TREES = {"jax-v0.10.2": "from jax._src.tree_util import FlatTree as ft\n",
              "jax-v0.11.0": "from jax._src import flattree as ft\n",
              "jax-v0.11.1": "from jax._src import flattree as ft\n",
              "jax-v0.11.2": "from jax._src import flattree as ft\n"}

NAMES = ("0001-control-flow-dedup-consts-keyed-on-sharing-pattern.patch",
         "0002-closure-key-trace-lookup.patch",
         "0003-pjit-aot-and-fast-path-pass-shared-constants.patch",
         "0004-explain-closure-key-misses.patch")
#: The patch that adds the closure key (its module, BUILD rules, CHANGELOG
#: entry and test file).
KEY_PATCH = 2

#: Commit messages, as ``git format-patch`` shows them: subject, then body.
MESSAGES = (
    ("Key control flow's _dedup_consts on the constants' sharing pattern",
     "_merge_common_consts passed the constants' ids to the weakref-LRU-cached\n"
     "_dedup_consts, so the same jaxpr with new constant objects (an eager\n"
     "cond or switch whose branches close over fresh arrays) missed the cache\n"
     "and added an entry per call. What _dedup_consts computes depends only on\n"
     "which constants are the same object, so key it on that pattern.\n"),
    ("Add a closure-keyed trace lookup behind jax_closure_cache",
     "A function re-created on every call (a nested def, a lambda in a loop,\n"
     "functools.partial, a re-wrapped jax.grad) misses pe.trace_to_jaxpr's\n"
     "cache, which is keyed on the function object, and pays a full trace and\n"
     "compile each time. With the new jax_closure_cache option (default off),\n"
     "a function the lookup has not answered is looked up by its closure key:\n"
     "its code and the values its code reads, with closed-over arrays\n"
     "abstracted to their types. The first function object of a code is\n"
     "traced as usual, every time; a later one is traced once per key with its\n"
     "arrays as arguments, and every later one of the key gets that Jaxpr\n"
     "closed over its own arrays. Nothing is shared when the trace captured\n"
     "an array the key does not cover.\n"),
    ("pjit: pass a shared jaxpr's constants as arguments",
     "pjit's separate_consts branch, the C++ fast path and the ahead-of-time\n"
     "stages pass a shared jaxpr's constants as arguments, so closures of one\n"
     "key share one executable. Whether constants are shared is carried in\n"
     "PjitParams and Traced; an exported module closes them over again.\n"),
    ("Say why a closure-keyed lookup missed",
     "With jax_explain_cache_misses on, a miss names the first part of the\n"
     "closure that differs from the last key of the same code.\n"),
)

_CONFIG_ANCHOR = (
    "          'otherwise the level is DEBUG.'))\n")
_PE_DEF = ("@weakref_lru_cache(maxsize=None, explain=explain)\n"
           "def trace_to_jaxpr(\n")
_PJIT_EVICT = ("  self._clear_cache()\n"
               "  pe.trace_to_jaxpr.evict_weakref(self._fun)\n")
_PJIT_SEPARATE = (
    "  if any(isinstance(c, core.Tracer) or core.typeof(c).has_qdd "
    "for c in jaxpr.consts):\n")
_PJIT_FASTPATH = (
    "    maybe_fastpath_data = _get_fastpath_data(\n"
    "        executable, out_tree, args_flat, out_flat, jaxpr.effects, "
    "jaxpr.consts,\n"
    "        pgle_profiler, const_args)\n")
_PJIT_PARAMS_FIELDS = (
    "  arg_names: tuple[str, ...]  # Not including the const_args\n")
_PJIT_PARAMS_RETURN = (
    "  return PjitParams(consts, params, avals_ft.vals, avals_ft.tree_without_statics,\n"
    "                    out_avals.tree, dbg.safe_arg_names(len(avals_ft)))\n")
_PJIT_TRACED = (
    "  return stages.Traced(arg_types, p.params, p.in_tree, p.out_tree, p.consts)\n")
_STAGES_TRACED_INIT = (
    "  __slots__ = ['_meta_tys_flat', '_params', '_in_tree', 'out_tree', '_consts',\n"
    "               '_lojax']\n\n"
    "  def __init__(self, meta_tys_flat, params, in_tree, out_tree, consts):\n")
_STAGES_PARAMS = "      _private_parameters = mlir.LoweringParameters()\n"
_STAGES_LOJAX_PYTREE = "def lojax_pytree(hi_avals, tree):\n"
_STAGES_LOWER = (
    "    return Lowered(lowering, lo.args_info, lo.out_tree,\n"
    "                   in_types=lo._in_types, out_types=lo._out_types)\n")
_DEDUP = "  jaxprs = [_dedup_consts(jaxpr, len(consts), const_ids) for jaxpr in jaxprs]\n"
_BUILD_API_DEPS = (
    '    visibility = ["//jax:internal"] + jax_visibility("api"),\n'
    '    deps = [\n'
    '        ":abstract_arrays",\n'
    '        ":ad",\n')
_CACHING2_SKIP = '  @unittest.skip("not implemented")\n  def testCaching2(self):\n'
_DEDUP_TEST = """\
  def testDedupConstsKeyedOnSharingPattern(self):
    from jax._src.lax.control_flow import common
    closed = jax.make_jaxpr(lambda c, x: x + c)(1.0, 1.0)
    before = common._dedup_consts.cache_info().hits
    common._merge_common_consts([closed], [[jnp.ones(())]])
    common._merge_common_consts([closed], [[jnp.ones(()) * 2]])  # new object
    self.assertEqual(common._dedup_consts.cache_info().hits, before + 1)

"""
_CHANGELOG = "## Unreleased\n\n* New features\n"
_CHANGELOG_ENTRY = (
    "  * Added the `jax_closure_cache` option (default off): functions re-created\n"
    "    on every call share one trace and executable when the values their code\n"
    "    reads are equal but for closed-over arrays. See `jax/_src/closure_cache.py`.\n")
_EXPLAIN = (
    "      p(\"  but seen another function defined on the same line; maybe the "
    "function is\\n\"\n"
    "        \"  being re-defined repeatedly, preventing caching?\")\n")

#: Per patch: (path, anchor that occurs exactly once, replacement).
EDITS = (
    (  # 1: control flow's _dedup_consts keyed on the sharing pattern
        ("jax/_src/lax/control_flow/common.py", _DEDUP,
         "  # keyed on which constants are the same object, not on their ids\n"
         "  first: dict[int, int] = {}\n"
         "  pattern = tuple(first.setdefault(i, k) for k, i in enumerate(const_ids))\n"
         "  jaxprs = [_dedup_consts(jaxpr, len(consts), pattern) for jaxpr in jaxprs]\n"),
        ("tests/lax_control_flow_test.py", _CACHING2_SKIP, _DEDUP_TEST + _CACHING2_SKIP),
    ),
    (  # 2: the closure key and the trace lookup
        ("jax/_src/config.py", _CONFIG_ANCHOR, _CONFIG_ANCHOR + """
closure_cache = bool_state(
    name='jax_closure_cache',
    default=False,
    help=('Share one trace and executable among re-created closures whose '
          'code reads equal values. See jax/_src/closure_cache.py.'))
"""),
        ("jax/_src/interpreters/partial_eval.py",
         "from jax._src import ad_util\n",
         "from jax._src import ad_util\nfrom jax._src import closure_cache\n"),
        ("jax/_src/interpreters/partial_eval.py", _PE_DEF,
         "@weakref_lru_cache(maxsize=None, explain=explain)\n"
         "def trace_to_jaxpr(fun: Callable, in_avals: FlatTree,\n"
         "                   debug_info: core.DebugInfo, *context_for_cache_key,\n"
         "                   **kwargs) -> tuple[ClosedJaxpr, FlatTree]:\n"
         "  # a function not answered yet: with jax_closure_cache on, looked up\n"
         "  # by its closure key (closure_cache.py)\n"
         "  if config.closure_cache.value:\n"
         "    return closure_cache.trace_to_jaxpr(\n"
         "        _trace_to_jaxpr, fun, in_avals, debug_info,\n"
         "        *context_for_cache_key, **kwargs)\n"
         "  return _trace_to_jaxpr(fun, in_avals, debug_info,\n"
         "                         *context_for_cache_key, **kwargs)\n\n"
         "def _trace_to_jaxpr(\n"),
    ),
    (  # 2: pjit, the stages, the fast path, control flow
        ("jax/_src/pjit.py", "from jax._src import config\n",
         "from jax._src import closure_cache\nfrom jax._src import config\n"),
        ("jax/_src/BUILD", _BUILD_API_DEPS,
         _BUILD_API_DEPS.replace('        ":ad",\n', '        ":ad",\n        ":closure_cache",\n', 1)),
        ("jax/_src/pjit.py", _PJIT_EVICT,
         _PJIT_EVICT + "  closure_cache.evict(self._fun)\n"),
        ("jax/_src/pjit.py", _PJIT_SEPARATE,
         "  shared_consts = closure_cache.is_shared(jaxpr)\n"
         "  if shared_consts or any(isinstance(c, core.Tracer) or\n"
         "                          core.typeof(c).has_qdd for c in jaxpr.consts):\n"),
        ("jax/_src/pjit.py", _PJIT_PARAMS_FIELDS,
         _PJIT_PARAMS_FIELDS +
         "  # consts are a shared jaxpr's: arguments, the fast path's const_args\n"
         "  shared_consts: bool = False\n"),
        ("jax/_src/pjit.py", _PJIT_PARAMS_RETURN,
         "  return PjitParams(consts, params, avals_ft.vals, avals_ft.tree_without_statics,\n"
         "                    out_avals.tree, dbg.safe_arg_names(len(avals_ft)),\n"
         "                    shared_consts)\n"),
        ("jax/_src/pjit.py", _PJIT_FASTPATH,
         "    # A shared jaxpr's constants: the fast path passes them first.\n"
         "    n = len(p.consts) if p.shared_consts else 0\n"
         "    maybe_fastpath_data = _get_fastpath_data(\n"
         "        executable, out_tree, args_flat[n:], out_flat, jaxpr.effects,\n"
         "        jaxpr.consts, pgle_profiler, [*const_args, *args_flat[:n]])\n"),
        ("jax/_src/pjit.py", _PJIT_TRACED,
         "  return stages.Traced(arg_types, p.params, p.in_tree, p.out_tree, p.consts,\n"
         "                       shared_consts=p.shared_consts)\n"),
        ("jax/_src/stages.py", _STAGES_TRACED_INIT,
         "  __slots__ = ['_meta_tys_flat', '_params', '_in_tree', 'out_tree', '_consts',\n"
         "               '_lojax', '_shared_consts']\n\n"
         "  def __init__(self, meta_tys_flat, params, in_tree, out_tree, consts,\n"
         "               shared_consts=False):\n"
         "    self._shared_consts = shared_consts  # a shared jaxpr's (pjit)\n"),
        ("jax/_src/stages.py", _STAGES_PARAMS,
         _STAGES_PARAMS +
         "    const_args = self._consts if self._shared_consts else ()\n"
         "    if const_args and _private_parameters.for_export:\n"
         "      # an exported module bakes its constants, as without the closure key\n"
         "      lo, const_args = _with_consts_closed(lo), ()\n"),
        ("jax/_src/stages.py", _STAGES_LOWER,
         "    return Lowered(lowering, lo.args_info, lo.out_tree,\n"
         "                   in_types=lo._in_types, out_types=lo._out_types,\n"
         "                   const_args=const_args)\n"),
        ("jax/_src/stages.py", _STAGES_LOJAX_PYTREE,
         "def _with_consts_closed(lo):\n"
         "  \"\"\"``lo`` with its leading constant arguments closed over again.\"\"\"\n"
         "  from jax._src.interpreters import partial_eval as pe  # type:ignore\n"
         "  n = len(lo._consts)\n"
         "  params = dict(lo._params)\n"
         "  params['jaxpr'] = core.ClosedJaxpr(\n"
         "      pe.convert_invars_to_constvars(params['jaxpr'].jaxpr, n), lo._consts)\n"
         "  for name in ('in_shardings', 'in_layouts', 'donated_invars'):\n"
         "    params[name] = params[name][n:]\n"
         "  return LoJax(lo._meta_tys_flat[n:], params, lo._in_tree, lo.out_tree,\n"
         "               lo._in_types, lo._out_types, ())\n\n\n"
         + _STAGES_LOJAX_PYTREE),
        ("jax/_src/stages.py",
         "  __slots__ = [\"_lowering\", \"args_info\", \"out_tree\", \"_no_kwargs\",\n"
         "               \"_in_types\", \"_out_types\"]\n",
         "  __slots__ = [\"_lowering\", \"args_info\", \"out_tree\", \"_no_kwargs\",\n"
         "               \"_in_types\", \"_out_types\", \"_const_args\"]\n"),
        ("jax/_src/stages.py",
         "               in_types=None, out_types=None):\n\n"
         "    self._lowering = lowering\n",
         "               in_types=None, out_types=None, const_args=()):\n\n"
         "    self._lowering = lowering\n"
         "    self._const_args = list(const_args)  # passed after the lowering's\n"),
        ("jax/_src/stages.py",
         "    return Compiled(self._lowering.compile(**kw), self._lowering.const_args,\n",
         "    return Compiled(self._lowering.compile(**kw),\n"
         "                    [*self._lowering.const_args, *self._const_args],\n"),
        ("jax/_src/stages.py",
         "    in_avals_ = self._lowering.compile_args[\"global_in_avals\"]\n"
         "    kept_var_idx = self._lowering.compile_args[\"kept_var_idx\"]\n"
         "    non_dce_avals = self._lowering.compile_args[\"all_args_info\"].in_avals\n",
         "    n = len(self._const_args)  # passed first; not the user's arguments\n"
         "    in_avals_ = self._lowering.compile_args[\"global_in_avals\"][n:]\n"
         "    kept_var_idx = {i - n for i in self._lowering.compile_args[\"kept_var_idx\"]}\n"
         "    non_dce_avals = self._lowering.compile_args[\"all_args_info\"].in_avals[n:]\n"),
    ),
    (  # 3: explanations and events
        ("jax/_src/interpreters/partial_eval.py", _EXPLAIN,
         _EXPLAIN +
         "      if config.closure_cache.value:\n"
         "        p(closure_cache.explain_miss(fun))\n"),
    ),
)

BUILD_EDITS = (
    ("CHANGELOG.md", _CHANGELOG, _CHANGELOG + _CHANGELOG_ENTRY),
    ("jax/_src/BUILD",
     "pytype_strict_library(\n    name = \"api_util\",\n",
     "pytype_strict_library(\n"
     "    name = \"closure_cache\",\n"
     "    srcs = [\n"
     "        \"closure_cache.py\",\n"
     "        \"closure_key.py\",\n"
     "    ],\n"
     "    type_checking = \"pyrefly\",\n"
     "    deps = [\n"
     "        \":config\",\n"
     "        \":core\",\n"
     "        \":monitoring\",\n"
     "        \":tree_util\",\n"
     "        \":util\",\n"
     "        \"//jax/_src/lib\",\n"
     "    ] + py_deps(\"numpy\"),\n"
     ")\n\n"
     "pytype_strict_library(\n    name = \"api_util\",\n"),
    ("jax/_src/BUILD",
     "    srcs = [\"interpreters/partial_eval.py\"],\n"
     "    type_checking = \"pyrefly\",\n"
     "    visibility = [\"//jax:internal\"] + jax_visibility(\"partial_eval\"),\n"
     "    deps = [\n"
     "        \":ad_util\",\n"
     "        \":api_util\",\n",
     "    srcs = [\"interpreters/partial_eval.py\"],\n"
     "    type_checking = \"pyrefly\",\n"
     "    visibility = [\"//jax:internal\"] + jax_visibility(\"partial_eval\"),\n"
     "    deps = [\n"
     "        \":ad_util\",\n"
     "        \":api_util\",\n"
     "        \":closure_cache\",\n"),
    ("tests/BUILD",
     "jax_multiplatform_test(\n    name = \"lax_control_flow_test\",\n",
     "jax_multiplatform_test(\n"
     "    name = \"closure_key_test\",\n"
     "    srcs = [\"closure_key_test.py\"],\n"
     ")\n\n"
     "jax_multiplatform_test(\n    name = \"lax_control_flow_test\",\n"),
)

_PE_DEF_011 = (") -> tuple[Jaxpr, ft.FlatTree]:\n"
               "  return trace_to_jaxpr_nocache(\n"
               "      fun,\n      in_avals,\n      debug_info,\n"
               "      *context_for_cache_key,\n")
_SEPARATE_011 = ("  return convert_constvars_jaxpr(jaxpr), jaxpr.consts\n\n"
                 "@weakref_lru_cache\ndef convert_constvars_jaxpr(")
_EXPLAIN_MISSES_011 = "explain_cache_misses = bool_state(\n"

#: Per later tag: {(path, jax-v0.10.2's anchor): (the tag's anchor, text)}
#: for each edit of ``EDITS`` and ``BUILD_EDITS`` that differs there.
RETARGETED = {"jax-v0.11.0": {
    ("jax/_src/config.py", _CONFIG_ANCHOR): (
        _EXPLAIN_MISSES_011,
        EDITS[1][0][2].replace(_CONFIG_ANCHOR, "").lstrip("\n")
        + "\n" + _EXPLAIN_MISSES_011),
    ("jax/_src/interpreters/partial_eval.py", _PE_DEF): (
        _PE_DEF_011,
        ") -> tuple[Jaxpr, ft.FlatTree]:\n"
        "  # a function not answered yet: with jax_closure_cache on, looked up\n"
        "  # by its closure key (closure_cache.py)\n"
        "  if config.closure_cache.value and not (\n"
        "      fun_takes_flat_tree_arg or fun_returns_flat_tree or requires_low):\n"
        "    return closure_cache.trace_to_jaxpr(\n"
        "        trace_to_jaxpr_nocache, fun, in_avals, debug_info,\n"
        "        *context_for_cache_key)\n" + _PE_DEF_011.split("\n", 1)[1]),
    ("jax/_src/pjit.py", _PJIT_PARAMS_RETURN): (
        "  return PjitParams(consts, params, avals_ft.vals, in_tree_filtered,\n"
        "                    out_avals.tree, dbg.safe_arg_names(len(avals_ft)))\n",
        "  return PjitParams(consts, params, avals_ft.vals, in_tree_filtered,\n"
        "                    out_avals.tree, dbg.safe_arg_names(len(avals_ft)),\n"
        "                    shared_consts)\n"),
    ("jax/_src/BUILD", BUILD_EDITS[1][1]): (
        BUILD_EDITS[1][1],
        BUILD_EDITS[1][2].replace('        ":core",\n',
                                  '        ":core",\n        ":flattree",\n')),
}}
_PE_DEF_0112 = ("trace_to_jaxpr = weakref_lru_cache(maxsize=None, explain=explain)(\n"
                "    trace_to_jaxpr_nocache)\n")
_SEPARATE_0112 = ("  return convert_constvars_jaxpr(jaxpr), jaxpr.consts\n\n"
                  "def convert_constvars_jaxpr(")
_PJIT_SEPARATE_0112 = "  if any(isinstance(c, core.Tracer) for c in jaxpr.consts):\n"
_PJIT_TRACED_0112 = (
    "  return stages.Traced(arg_types, p.params, p.in_tree, p.out_tree, p.consts,\n"
    "                       jit_func._jit_info.fun_sourceinfo)\n")
_STAGES_TRACED_INIT_0112 = (
    "  __slots__ = ['_meta_tys_flat', '_params', '_in_tree', 'out_tree', '_consts',\n"
    "               '_fun_sourceinfo', '_lojax', '_closure_converted']\n\n"
    "  def __init__(self, meta_tys_flat, params, in_tree, out_tree, consts,\n"
    "               fun_sourceinfo):\n")
_STAGES_PHYSICALIZE_0112 = (
    "        self._consts,\n        self._fun_sourceinfo,\n    )\n\n"
    "  @property\n  def lojax(self) -> LoJax:\n")
_STAGES_CLOSED_0112 = next(
    new for _, anchor, new in EDITS[2] if anchor == _STAGES_LOJAX_PYTREE).replace(
    "lo._in_types, lo._out_types, ())\n",
    "lo._in_types, lo._out_types, (), lo._fun_sourceinfo)\n").replace(
    "  from jax._src.interpreters import partial_eval as pe  # type:ignore\n", ""
    ).replace(   # 0.11.2: a jaxpr takes constants for its first inputs
    "  params['jaxpr'] = core.ClosedJaxpr(\n"
    "      pe.convert_invars_to_constvars(params['jaxpr'].jaxpr, n), lo._consts)\n",
    "  params['jaxpr'] = params['jaxpr'].with_consts(lo._consts)\n")
RETARGETED["jax-v0.11.2"] = {
    **RETARGETED["jax-v0.11.0"],
    ("jax/_src/interpreters/partial_eval.py", _PE_DEF): (
        _PE_DEF_0112,
        "@weakref_lru_cache(maxsize=None, explain=explain)\n"
        "def trace_to_jaxpr(fun: Callable, in_avals: ft.FlatTree,\n"
        "                   debug_info: core.DebugInfo,\n"
        "                   **kwargs) -> tuple[Jaxpr, ft.FlatTree]:\n"
        "  # a function not answered yet: with jax_closure_cache on, looked up\n"
        "  # by its closure key (closure_cache.py)\n"
        "  if config.closure_cache.value and not kwargs:\n"
        "    return closure_cache.trace_to_jaxpr(\n"
        "        trace_to_jaxpr_nocache, fun, in_avals, debug_info)\n"
        "  return trace_to_jaxpr_nocache(fun, in_avals, debug_info, **kwargs)\n"),
    ("jax/_src/pjit.py", _PJIT_SEPARATE): (
        _PJIT_SEPARATE_0112,
        "  shared_consts = closure_cache.is_shared(jaxpr)\n"
        "  if shared_consts or any(isinstance(c, core.Tracer) for c in jaxpr.consts):\n"),
    ("jax/_src/pjit.py", _PJIT_TRACED): (
        _PJIT_TRACED_0112,
        "  return stages.Traced(arg_types, p.params, p.in_tree, p.out_tree, p.consts,\n"
        "                       jit_func._jit_info.fun_sourceinfo,\n"
        "                       shared_consts=p.shared_consts)\n"),
    ("jax/_src/stages.py", _STAGES_TRACED_INIT): (
        _STAGES_TRACED_INIT_0112,
        "  __slots__ = ['_meta_tys_flat', '_params', '_in_tree', 'out_tree', '_consts',\n"
        "               '_fun_sourceinfo', '_lojax', '_closure_converted',\n"
        "               '_shared_consts']\n\n"
        "  def __init__(self, meta_tys_flat, params, in_tree, out_tree, consts,\n"
        "               fun_sourceinfo, shared_consts=False):\n"
        "    self._shared_consts = shared_consts  # a shared jaxpr's (pjit)\n"),
    ("jax/_src/stages.py", _STAGES_LOJAX_PYTREE): (
        _STAGES_LOJAX_PYTREE, _STAGES_CLOSED_0112),
}


#: Per later tag: {patch number: edits it adds there}. From 0.11 each closed
#: jaxpr is its own object, and ``separate_consts`` (pjit's and control
#: flow's) is cached on it: a shared one is separated as its shared jaxpr.
ADDED = {"jax-v0.11.0": {2: (
    ("jax/_src/interpreters/partial_eval.py", _SEPARATE_011,
     "  shared = closure_cache.shared_jaxpr(jaxpr)  # one for its key's closures\n"
     "  if shared is not None:\n"
     "    out = convert_constvars_jaxpr(shared)\n"
     "    out._debug_info = out.debug_info._replace(\n"
     "        result_paths=jaxpr.debug_info.result_paths)  # as named by the caller\n"
     "    return out, jaxpr.consts\n" + _SEPARATE_011),
)}}
ADDED["jax-v0.11.2"] = {
    2: ((ADDED["jax-v0.11.0"][2][0][0], _SEPARATE_0112,
         ADDED["jax-v0.11.0"][2][0][2].replace(_SEPARATE_011, _SEPARATE_0112)),),
    3: (("jax/_src/stages.py", _STAGES_PHYSICALIZE_0112,
         "        self._consts,\n        self._fun_sourceinfo,\n"
         "        shared_consts=self._shared_consts,\n    )\n\n"
         "  @property\n  def lojax(self) -> LoJax:\n"),),
}
# 0.11.1: 0.11.2's anchors, without ``Traced.physicalize`` (new in 0.11.2)
RETARGETED["jax-v0.11.1"] = RETARGETED["jax-v0.11.2"]
ADDED["jax-v0.11.1"] = {2: ADDED["jax-v0.11.2"][2]}


def edits_for(tag: str, table, k: int = 0) -> list:
  """``table``'s edits (``EDITS``' patch ``k``, or ``BUILD_EDITS``) as at
  ``tag``."""
  retargeted = RETARGETED.get(tag, {})
  edits = [(path, *retargeted.get((path, anchor), (anchor, new)))
           for path, anchor, new in table] + list(ADDED.get(tag, {}).get(k, ()))
  return [e for e in edits if tag not in FROM_WHEEL or is_jax_source(e[0])]


def is_jax_source(path: str) -> bool:
  return path.startswith("jax/") and path.endswith(".py")


def module_source(name: str, tag: str) -> str:
  """The series' text of the package's module ``name`` (JAX's import
  lines at ``tag``)."""
  with open(os.path.join(ROOT, "jax_closure_cache", "lookup", name)) as f:
    text = f.read()
  for package_line, jax_line in PACKAGE_IMPORTS:
    text = text.replace(package_line, jax_line or FLAT_TREES[tag])
  return text


def installed_jax_root() -> str:
  spec = importlib.util.find_spec("jax")
  return os.path.dirname(os.path.dirname(spec.origin))


def _installed_release() -> str:
  with open(os.path.join(installed_jax_root(), "jax", "version.py")) as f:
    for line in f:
      if line.startswith("_version = "):
        return line.split('"')[1]
  return ""


def available(jax_repo: str | None, tag: str) -> bool:
  """Whether ``tag``'s sources are at hand (the checkout, or for a tag of
  ``FROM_WHEEL`` its release installed, without the series)."""
  if tag in FROM_WHEEL:   # pristine: not a copy the series was applied to
    return tag == f"jax-v{_installed_release()}" and not os.path.exists(
        os.path.join(installed_jax_root(), "jax", "_src", "closure_cache.py"))
  return jax_repo is not None and os.path.isdir(jax_repo)


def read_source(path: str, jax_repo: str | None, tag: str) -> str | None:
  """A file at ``tag``, from the checkout; without one (or for a tag of
  ``FROM_WHEEL``), a ``jax/**.py`` file from the installed jax if it is the
  tag's release (else None)."""
  if tag not in FROM_WHEEL and jax_repo is not None and os.path.isdir(jax_repo):
    out = subprocess.run(["git", "-C", jax_repo, "show", f"{tag}:{path}"],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None
  if is_jax_source(path) and tag == f"jax-v{_installed_release()}":
    with open(os.path.join(installed_jax_root(), path)) as f:
      return f.read()
  return None


def _replace_once(text: str, anchor: str, new: str, path: str) -> str:
  if text.count(anchor) != 1:
    raise SystemExit(f"{path}: anchor found {text.count(anchor)} times: "
                     f"{anchor[:60]!r}")
  return text.replace(anchor, new)


def test_stage(k: int) -> str:
  """The JAX-style test file as patch ``k`` leaves it: its sections up to
  ``# -- patch k`` (sections are introduced by ``  # -- patch N:`` lines)."""
  with open(TEST) as f:
    lines = f.read().splitlines(keepends=True)
  out, keep = [], True
  for line in lines:
    if line.startswith("  # -- patch "):
      keep = int(line.split()[3].rstrip(":")) <= k
    elif line.startswith("if __name__ =="):
      keep = True
    if keep:
      out.append(line)
  return "".join(out)


def _diff(path: str, old: str | None, new: str) -> str:
  a = [] if old is None else old.splitlines(keepends=True)
  b = new.splitlines(keepends=True)
  lines = list(difflib.unified_diff(
      a, b, "/dev/null" if old is None else f"a/{path}", f"b/{path}", n=3))
  return "".join(lines)


def generate(jax_repo: str | None, tag: str = TAGS[0]) -> dict[str, str]:
  """{patch name: text} of the series cut against ``tag``."""
  state: dict[str, str | None] = {}

  def current(path):
    if path not in state:
      state[path] = read_source(path, jax_repo, tag)
      if state[path] is None:
        raise SystemExit(f"{path} needs a checkout of {tag} (--jax-repo)")
    return state[path]

  patches = {}
  for k, (name, edits) in enumerate(zip(NAMES, EDITS), start=1):
    parts = []
    changed: dict[str, str] = {}
    for path, anchor, new in edits_for(tag, edits, k):
      text = changed.get(path, current(path))
      changed[path] = _replace_once(text, anchor, new, path)
    if k == KEY_PATCH:
      for module in MODULES:
        parts.append(_diff(f"jax/_src/{module}", None,
                           module_source(module, tag)))
      for path, anchor, new in edits_for(tag, BUILD_EDITS):
        text = changed.get(path, current(path))
        changed[path] = _replace_once(text, anchor, new, path)
    for path in sorted(changed):
      parts.append(_diff(path, current(path), changed[path]))
      state[path] = changed[path]
    if k >= KEY_PATCH:
      old_test = None if k == KEY_PATCH else test_stage(k - 1)
      parts.append(_diff("tests/closure_key_test.py", old_test, test_stage(k)))
    patches[name] = _format_patch(k, "".join(parts))
  return patches


def _diffstat(diff: str) -> str:
  """``git format-patch``'s summary of ``diff``."""
  rows = []
  lines = diff.splitlines()
  for i, line in enumerate(lines):
    if line.startswith("--- ") and i + 1 < len(lines) and \
        lines[i + 1].startswith("+++ "):
      rows.append([lines[i + 1][4:].removeprefix("b/"), 0, 0])
    elif rows and line.startswith("+") and not line.startswith("+++ "):
      rows[-1][1] += 1
    elif rows and line.startswith("-") and not line.startswith("--- "):
      rows[-1][2] += 1
  width = max(len(path) for path, _, _ in rows)
  out = [f" {path:<{width}} | {a + r:>4} {'+' * min(a, 40)}{'-' * min(r, 40)}"
         for path, a, r in rows]
  plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"
  out.append(f" {plural(len(rows), 'file')} changed, "
             f"{plural(sum(a for _, a, _ in rows), 'insertion')}(+), "
             f"{plural(sum(r for _, _, r in rows), 'deletion')}(-)")
  return "\n".join(out) + "\n"


def _format_patch(k: int, diff: str) -> str:
  """Patch ``k`` as ``git format-patch`` writes it (fixed author and date,
  so generating again gives the same bytes)."""
  subject, body = MESSAGES[k - 1]
  return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
          f"From: jax-closure-cache <jax-closure-cache@users.noreply.github.com>\n"
          f"Date: Tue, 1 Dec 2026 00:00:00 +0000\n"
          f"Subject: [PATCH {k}/{len(NAMES)}] {subject}\n\n"
          f"{body}---\n{_diffstat(diff)}\n{diff}")


def apply_check(jax_repo: str, tag: str) -> subprocess.CompletedProcess:
  """``git apply --check`` of each patch of the committed series for
  ``tag``, in order, on a pristine tree of the tag (the files the series
  touches, read from the checkout) that the patches before it changed."""
  import tempfile
  folder = os.path.join(SERIES, tag)
  paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
  existing, added = set(), set()
  for path in paths:
    with open(path) as f:
      lines = f.read().splitlines()
    for old, new in zip(lines, lines[1:]):
      if old.startswith("--- ") and new.startswith("+++ b/"):
        if old == "--- /dev/null":
          added.add(new[6:])
        elif old[6:] not in added:
          existing.add(old[6:])
  with tempfile.TemporaryDirectory() as tree:
    for rel in existing:
      os.makedirs(os.path.dirname(os.path.join(tree, rel)), exist_ok=True)
      with open(os.path.join(tree, rel), "w") as f:
        f.write(read_source(rel, jax_repo, tag))
    subprocess.run(["git", "init", "-q", tree], check=True)
    for path in paths:   # in order, each on the tree the ones before left
      out = subprocess.run(["git", "-C", tree, "apply", "--check", path],
                           capture_output=True, text=True)
      if out.returncode == 0:
        out = subprocess.run(["git", "-C", tree, "apply", path],
                             capture_output=True, text=True)
      if out.returncode != 0:
        break
    return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true")
  parser.add_argument("--jax-repo", default="/work/.mirror/jax-ml+jax/repo")
  parser.add_argument("--tag", choices=TAGS, action="append",
                      help="only these tags (default: all)")
  args = parser.parse_args(argv)
  stale = []
  for tag in args.tag or TAGS:
    folder = os.path.join(SERIES, tag)
    if not available(args.jax_repo, tag):
      print(f"{tag}: skipped, its sources are not at hand"
            + (f" (install jax {tag[5:]})" if tag in FROM_WHEEL else ""))
      continue
    for name, text in generate(args.jax_repo, tag).items():
      path = os.path.join(folder, name)
      if args.check:
        if not os.path.exists(path) or open(path).read() != text:
          stale.append(path)
        continue
      os.makedirs(folder, exist_ok=True)
      with open(path, "w") as f:
        f.write(text)
      print(f"wrote {path}")
  if stale:
    print("stale: " + ", ".join(stale) + ": run python patches/make_series.py")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
