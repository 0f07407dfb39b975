"""The pinned-version guard, the doctor, and the pytest plugin."""

import subprocess
import sys
import warnings

import jax
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat, activation
from jax_closure_cache.tools import doctor

from test_activation import installed_hook


def test_enable_refuses_another_jax_unless_forced(monkeypatch):
  monkeypatch.setattr(_compat, "SUPPORTED_RELEASES", {"9.9.9": "full"})
  with pytest.raises(RuntimeError) as e:
    jcc.enable()
  assert "jax 9.9.9" in str(e.value) and f"jax=={jax.__version__}" in str(e.value)
  assert not jcc.is_enabled()
  jcc.enable(force=True)
  assert jcc.is_enabled()


def test_environment_activation_on_another_jax_warns_and_patches_nothing(monkeypatch):
  monkeypatch.setattr(_compat, "SUPPORTED_RELEASES", {"9.9.9": "full"})
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    activation._enable_safely()
  assert not jcc.is_enabled()
  assert any("supports only jax 9.9.9" in str(w.message) for w in caught)


def test_doctor_reports_every_check():
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache", "doctor"],
                       capture_output=True, text=True, timeout=300)
  assert f"[ok] jax version: {jax.__version__}" in out.stdout
  assert "[ok] jax.lax.while_loop: signature as expected" in out.stdout
  try:
    import jax_closure_cache.front._entrance  # noqa: F401
    entrance = "[info] fast front's C entrance: built"
  except ImportError:
    entrance = "[info] fast front's C entrance: not built"
  assert entrance in out.stdout
  if installed_hook():
    assert out.returncode == 0 and "all checks passed" in out.stdout
  else:
    assert out.returncode == 1 and "[MISMATCH] start-up hook" in out.stdout


def test_doctor_flags_a_changed_signature(monkeypatch):
  monkeypatch.setitem(doctor.EXPECTED_SIGNATURES, "jax.lax.scan", ("f", "init"))
  results = {name: ok for name, ok, _ in doctor.check_patch_points()}
  assert results["jax.lax.scan"] is False and results["jax.lax.map"] is True


def test_pytest_plugin_enables_for_a_suite(tmp_path):
  (tmp_path / "test_user.py").write_text(
      "import jax, jax.numpy as jnp\n"
      "from jax import jit\n"
      "import jax_closure_cache as jcc\n"
      "def test_patched():\n"
      "  assert jcc.is_enabled()\n"
      "  mk = lambda w: jit(lambda x: x * w)\n"
      "  mk(jnp.full(2, 2.0))(jnp.ones(2)); mk(jnp.full(2, 2.0))(jnp.ones(2))\n"
      "  mk(jnp.full(2, 3.0))(jnp.ones(2))\n"
      "  assert jcc.stats()['hits'] == 1\n")
  run = lambda *opts: subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *opts,
       str(tmp_path / "test_user.py")], capture_output=True, text=True,
      timeout=300, cwd=tmp_path)
  on, off = run("--closure-cache"), run()
  assert on.returncode == 0, on.stdout + on.stderr
  assert off.returncode == 1   # without the option jax.jit stays stock
