"""Supported releases and the version-dependent seams (issue 24): each seam's
branches, chosen by feature; the branch for a release not installed here is
exercised against a stub with that release's shape. CI runs jax 0.10.2; on
0.11.x the same file runs against the real thing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat, patching
from conftest import PATCHED, counting, stock_off


def test_the_installed_release_is_in_the_one_table():
  assert jax.__version__ in _compat.SUPPORTED_RELEASES
  assert _compat.versions_match()
  assert _compat.SUPPORTED_RELEASES[jax.__version__] == (
      "full" if _compat.trace.TRACE_LOOKUP else "front")


def test_trace_lookup_seams_are_found_by_feature(monkeypatch):
  assert _compat.trace._trace_lookup_seams() == _compat.trace.TRACE_LOOKUP_MISSING
  # 0.11's shape: FlatTree moved, ClosedJaxpr is Jaxpr itself
  monkeypatch.setattr(_compat.trace, "FlatTree", None)
  monkeypatch.setattr(_compat.trace, "ClosedJaxpr", _compat.trace.Jaxpr)
  missing = _compat.trace._trace_lookup_seams()
  assert any("FlatTree" in m for m in missing)
  assert any("ClosedJaxpr" in m for m in missing)


@pytest.mark.skipif(PATCHED, reason="a jax carrying the series installs no "
                    "trace-lookup patch points in either case")
def test_front_alone_where_the_trace_lookup_is_missing(monkeypatch):
  """What a release without layer two's seams gets (0.11.x): enable()
  installs no trace-lookup patch, and re-created closures, static functions
  and eager control flow still hit with stock's results."""
  monkeypatch.setattr(_compat.trace, "TRACE_LOOKUP", False)
  jcc.enable()
  pjit_module = _compat.trace.TRACE_PATCH_POINTS[1][0]
  assert pjit_module._infer_params is _compat.trace.STOCK_INFER_PARAMS
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
