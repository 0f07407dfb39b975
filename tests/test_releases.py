"""Supported releases and the version-dependent seams (issue 24): each seam's
branches, chosen by feature; the branch for a release not installed here is
exercised against a stub with that release's shape. CI runs jax 0.10.2; on
0.11.x the same file runs against the real thing."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat, patching
from conftest import counting, stock_off


def test_the_installed_release_is_in_the_one_table():
  assert jax.__version__ in _compat.SUPPORTED_RELEASES
  assert _compat.versions_match()
  assert _compat.SUPPORTED_RELEASES[jax.__version__] == (
      "full" if _compat.trace.TRACE_LOOKUP else "front")


def test_trace_lookup_seams_are_found_by_feature(monkeypatch):
  assert _compat.trace._trace_lookup_seams() == _compat.trace.TRACE_LOOKUP_MISSING
  assert _compat.trace.TRACE_LOOKUP_MISSING == []   # every supported release
  # a release whose flat trees or merged jaxprs lack what the lookup calls
  monkeypatch.setattr(_compat.trace, "flat_trees", types.SimpleNamespace())
  monkeypatch.setattr(_compat.trace, "MERGED_JAXPR", True)
  monkeypatch.setattr(_compat.trace, "Jaxpr", object)
  missing = _compat.trace._trace_lookup_seams()
  assert any("FlatTree's pack" in m for m in missing)
  assert any("with_consts" in m for m in missing)


def test_the_trace_context_seam_reads_the_uncached_traces_signature(
    monkeypatch):
  """0.10 has no ``trace_to_jaxpr_nocache``, 0.11.0's takes the qdd token as
  ``*context_for_cache_key``, 0.11.2's takes none: pjit passes ``(0,)``,
  ``(0,)`` and ``()``, and the front's key of a trace must say the same."""
  def with_context(fun, in_avals, debug_info, *context, requires_low=False):
    pass

  def without(fun, in_avals, debug_info, requires_low=False):
    pass
  pe = types.SimpleNamespace()
  monkeypatch.setattr(_compat.trace, "_pe", pe)
  assert _compat.trace._trace_takes_context()
  pe.trace_to_jaxpr_nocache = with_context
  assert _compat.trace._trace_takes_context()
  pe.trace_to_jaxpr_nocache = without
  assert not _compat.trace._trace_takes_context()


def test_the_stateful_aval_seam_on_either_release():
  aval = jax.core.ShapedArray((2,), jnp.float32)
  assert not _compat.trace.stateful_aval(aval)
  # 0.10: has_qdd says; 0.11 dropped it: only a plain array type is keyed
  assert _compat.trace.stateful_aval(types.SimpleNamespace(has_qdd=True))
  assert not _compat.trace.stateful_aval(types.SimpleNamespace(has_qdd=False))
  assert _compat.trace.stateful_aval(object())


def test_separating_a_shared_jaxpr_on_either_jaxpr_shape(monkeypatch):
  """0.10 separates with ``pe.separate_consts`` (cached on the shared open
  jaxpr); 0.11 caches that on each closure's own jaxpr, so the shared
  jaxpr's own conversion is returned, with the result names pjit gave the
  closure's."""
  closed = types.SimpleNamespace(
      consts=(1, 2), debug_info=types.SimpleNamespace(result_paths=("r",)))

  class Dbg(types.SimpleNamespace):
    def _replace(self, **kw):
      return Dbg(**{**vars(self), **kw})

  class Shared:
    _debug_info = Dbg(result_paths=("",), arg_names=("", "", "x"))
    debug_info = property(lambda self: self._debug_info)
  shared, converted = Shared(), Shared()
  monkeypatch.setattr(_compat.trace, "MERGED_JAXPR", True)
  monkeypatch.setattr(_compat.trace, "_pe", types.SimpleNamespace(
      convert_constvars_jaxpr={shared: converted}.__getitem__))
  assert _compat.trace.separate_shared(closed, shared) == (converted, [1, 2])
  assert converted.debug_info.result_paths == ("r",)
  assert converted.debug_info.arg_names == ("", "", "x")
  monkeypatch.setattr(_compat.trace, "MERGED_JAXPR", False)
  monkeypatch.setattr(_compat.trace, "separate_consts",
                      lambda c: ("separated", c.consts))
  assert _compat.trace.separate_shared(closed, shared) == ("separated", (1, 2))


def test_front_alone_where_the_trace_lookup_is_missing(monkeypatch):
  """What a release without layer two's seams gets (0.11.x): enable()
  installs no trace-lookup patch, and re-created closures, static functions
  and eager control flow still hit with stock's results."""
  monkeypatch.setattr(_compat.trace, "TRACE_LOOKUP", False)
  jcc.enable()
  pjit_module = _compat.trace.TRACE_PATCH_POINTS[1][0]
  assert (pjit_module._get_fastpath_data
          is _compat.trace.STOCK_GET_FASTPATH_DATA)
  x = jnp.ones(4)

  def program(i):
    w = jnp.full((4,), 1.0 + i)
    a = jax.jit(lambda v: jnp.tanh(v * w))(x)
    b = jax.jit(lambda f, v: f(v) + 1.0, static_argnums=0)(
        lambda v: v * w, x)
    c = jax.lax.while_loop(lambda s: s[0] < 2,
                           lambda s: (s[0] + 1, s[1] * w), (0, x))[1]
    return a, b, c
  for i in range(5):
    with counting() as c:
      got = program(i)
    if i >= 2:
      assert c["compiles"] == 0
    for g, w in zip(got, stock_off(program, i)):
      np.testing.assert_allclose(g, w, rtol=1e-6)
  assert jcc.stats()["shared_traces"] == 0


def test_closure_convert_tree_form_follows_stocks(monkeypatch):
  """0.10 keys a conversion on the arguments' tree, 0.11 on ``(args, {})``:
  the form is read off stock's own converted function, and both forms
  build the tree stock checks."""
  flat, tree = _compat._convert_tree((1.0, 2.0))
  converted, _ = _compat.STOCK_CLOSURE_CONVERT(lambda a, b: a * b, 1.0, 2.0)
  cells = dict(zip(converted.__code__.co_freevars, converted.__closure__))
  assert tree == cells["in_tree"].cell_contents and flat == [1.0, 2.0]
  monkeypatch.setattr(_compat, "_convert_tree_form", [True])
  assert _compat._convert_tree((1.0,))[1] == jax.tree_util.tree_structure(
      ((1.0,), {}))
  monkeypatch.setattr(_compat, "_convert_tree_form", [False])
  assert _compat._convert_tree((1.0,))[1] == jax.tree_util.tree_structure(
      (1.0,))


def test_a_release_outside_the_table_is_refused_with_the_table(monkeypatch):
  monkeypatch.setattr(_compat, "SUPPORTED_RELEASES", {"0.0.1": "front"})
  with pytest.raises(RuntimeError) as e:
    patching.enable()
  assert "0.0.1" in str(e.value) and jax.__version__ in str(e.value)
  assert not jcc.is_enabled()


def test_jaxpr_keys_on_either_jaxpr_class_shape():
  """0.10 has ClosedJaxpr around Jaxpr; 0.11 one class with constants
  attached. A closed jaxpr is keyed with its constants in both."""
  from jax_closure_cache.key import closure
  w = jnp.ones(3)
  closed = jax.make_jaxpr(lambda v: v * w)(jnp.ones(3))
  a = closure.analyse(lambda: closed)
  assert len(a.leaves) == 1 and a.leaves[0] is closed.consts[0]
