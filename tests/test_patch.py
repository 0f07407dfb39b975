"""The upstream patch: fresh against the package, atomic apply, exact revert,
and the JAX-style test file passing against a patched copy of jax."""

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from jax_closure_cache import _compat, patch_tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE_PATCH = os.path.join(REPO, "patches", "make_patch.py")
needs_pristine_jax = pytest.mark.skipif(
    _compat.jax_carries_patch(), reason="the installed jax carries the patch")


def tree_digest(root):
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    for name in filenames:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def jax_copy(tmp_path_factory):
  """A copy of the installed (pristine) jax package in a target folder."""
  target = tmp_path_factory.mktemp("site")
  shutil.copytree(os.path.join(patch_tool.default_target(), "jax"),
                  target / "jax", ignore=shutil.ignore_patterns("__pycache__"))
  return str(target)


@needs_pristine_jax
@pytest.mark.skipif(not os.path.exists(MAKE_PATCH), reason="no checkout")
def test_committed_patch_is_a_fresh_generation():
  out = subprocess.run([sys.executable, MAKE_PATCH, "--check"],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr


@needs_pristine_jax
def test_apply_check_revert_round_trip(jax_copy):
  pristine = tree_digest(jax_copy)
  assert patch_tool.status(jax_copy)[0] == patch_tool.NOTHING_TO_DO
  assert patch_tool.apply(jax_copy)[0] == patch_tool.OK
  assert os.path.exists(os.path.join(jax_copy, "jax/_src/closure_cache/closure.py"))
  assert not os.path.exists(os.path.join(jax_copy, "tests"))   # PR-only file
  assert patch_tool.status(jax_copy)[0] == patch_tool.OK
  assert patch_tool.apply(jax_copy)[0] == patch_tool.NOTHING_TO_DO
  assert patch_tool.revert(jax_copy)[0] == patch_tool.OK
  assert tree_digest(jax_copy) == pristine               # byte for byte
  assert patch_tool.revert(jax_copy)[0] == patch_tool.NOTHING_TO_DO


@needs_pristine_jax
def test_apply_is_atomic_on_a_conflict(jax_copy):
  lax_init = os.path.join(jax_copy, "jax", "lax", "__init__.py")
  with open(lax_init) as f:
    original = f.read()
  with open(lax_init, "w") as f:   # a local edit where a hunk lands
    f.write(original.replace("  platform_dependent as platform_dependent,\n)\n",
                             "  platform_dependent as platform_dependent,\n)  # edited\n"))
  try:
    before = tree_digest(jax_copy)
    code, message = patch_tool.status(jax_copy)
    assert code == patch_tool.CONFLICT, message
    assert patch_tool.apply(jax_copy)[0] == patch_tool.CONFLICT
    assert tree_digest(jax_copy) == before   # nothing was written
  finally:
    with open(lax_init, "w") as f:
      f.write(original)


def test_wrong_target_is_refused(tmp_path):
  (tmp_path / "jax").mkdir()
  (tmp_path / "jax" / "version.py").write_text('_version = "0.4.30"\n')
  assert patch_tool.status(str(tmp_path))[0] == patch_tool.BAD_TARGET
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache", "patch",
                        "apply", "--target", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 3 and "0.4.30" in out.stdout


@needs_pristine_jax
def test_jax_style_test_file_passes_on_patched_copy(jax_copy):
  assert patch_tool.apply(jax_copy)[0] == patch_tool.OK
  try:
    test_file = os.path.join(REPO, "patches", "closure_cache_test.py")
    env = dict(os.environ, PYTHONPATH=jax_copy)
    out = subprocess.run([sys.executable, test_file], env=env, cwd=jax_copy,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stderr
  finally:
    patch_tool.revert(jax_copy)
