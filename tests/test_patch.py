"""The upstream pull requests (``patches/prs``) as the ``patch`` command
deploys them: each release gets its tag's version, apply is atomic and
revert exact, and a jax carrying them runs the package alike and, without
the package, shares lowering by structure behind JAX's own option."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_closure_cache import _compat
from jax_closure_cache.tools import patch_tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRS = os.path.join(REPO, "patches", "prs")
needs_pristine_jax = pytest.mark.skipif(
    _compat.jax_carries_pull_requests()
    or jax.__version__ not in _compat.PULL_REQUEST_TAGS,
    reason=("the installed jax carries the pull requests"
            if _compat.jax_carries_pull_requests() else
            f"the pull requests are not cut for jax {jax.__version__}"))


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


def test_the_installed_jax_gets_its_tags_version_of_each_pull_request():
  if jax.__version__ not in _compat.PULL_REQUEST_TAGS:
    with pytest.raises(patch_tool.PatchError) as e:
      patch_tool.patch_paths()
    assert e.value.code == patch_tool.BAD_TARGET
    assert jax.__version__ in str(e.value)
    return
  tag = _compat.PULL_REQUEST_TAGS[jax.__version__]
  paths = patch_tool.patch_paths()
  assert [os.path.basename(os.path.dirname(os.path.dirname(p)))
          for p in paths] == list(_compat.PULL_REQUESTS)
  assert all(os.path.basename(os.path.dirname(p)) == tag for p in paths)


@pytest.mark.parametrize("pr", _compat.PULL_REQUESTS)
@pytest.mark.parametrize("tag", ["main", "jax-v0.10.2", "jax-v0.11.0"])
def test_each_pull_request_is_one_commit_within_its_size(pr, tag):
  """One ``git format-patch`` commit per PR and tag, at most 600 changed
  lines, nothing of the package in it, no environment read, no re-binding
  of JAX's public functions."""
  folder = os.path.join(PRS, pr, tag)
  names = sorted(n for n in os.listdir(folder) if n.endswith(".patch"))
  assert len(names) == 1, names
  with open(os.path.join(folder, names[0])) as f:
    text = f.read()
  assert text.startswith("From ") and "\nSubject: [PATCH] " in text
  lines = text.splitlines()
  changed = sum(1 for l in lines if l.startswith(("+", "-"))
                and not l.startswith(("+++ ", "--- ")))
  added = "\n".join(l[1:] for l in lines
                    if l.startswith("+") and not l.startswith("+++"))
  assert 0 < changed <= 600, changed
  assert "jax_closure_cache" not in added
  assert "os.environ" not in added and "getenv" not in added
  assert "jax.jit =" not in added and "lax.while_loop =" not in added


@needs_pristine_jax
def test_apply_check_revert_round_trip(jax_copy):
  pristine = tree_digest(jax_copy)
  assert patch_tool.status(jax_copy)[0] == patch_tool.NOTHING_TO_DO
  assert patch_tool.apply(jax_copy)[0] == patch_tool.OK
  assert os.path.exists(os.path.join(jax_copy, "jax/_src/jaxpr_structure.py"))
  assert not os.path.exists(os.path.join(jax_copy, "tests"))   # PR-only files
  assert not os.path.exists(os.path.join(jax_copy, "CHANGELOG.md"))
  assert patch_tool.status(jax_copy)[0] == patch_tool.OK
  assert patch_tool.apply(jax_copy)[0] == patch_tool.NOTHING_TO_DO
  assert patch_tool.revert(jax_copy)[0] == patch_tool.OK
  assert tree_digest(jax_copy) == pristine               # byte for byte
  assert patch_tool.revert(jax_copy)[0] == patch_tool.NOTHING_TO_DO


@needs_pristine_jax
def test_apply_is_atomic_on_a_conflict(jax_copy):
  """A local edit where the last patch's first hunk lands: nothing is
  written, not even the patches before it."""
  with open(patch_tool.patch_paths()[-1]) as f:
    files = [fp for fp in patch_tool.parse(f.read())
             if fp.path.startswith("jax/") and not fp.new_file]
  target = os.path.join(jax_copy, files[0].path)
  removed = [t for k, t in files[0].hunks[0].lines if k == "-"]
  anchor = removed[0] if removed else [
      t for k, t in files[0].hunks[0].lines if k == " "][-1]
  with open(target) as f:
    original = f.read()
  assert anchor in original
  with open(target, "w") as f:
    f.write(original.replace(anchor, anchor.rstrip("\n") + "  # edited\n"))
  try:
    before = tree_digest(jax_copy)
    code, message = patch_tool.status(jax_copy)
    assert code == patch_tool.CONFLICT, message
    assert patch_tool.apply(jax_copy)[0] == patch_tool.CONFLICT
    assert tree_digest(jax_copy) == before
  finally:
    with open(target, "w") as f:
      f.write(original)


def test_wrong_target_is_refused(tmp_path):
  (tmp_path / "jax").mkdir()
  (tmp_path / "jax" / "version.py").write_text('_version = "0.4.30"\n')
  assert patch_tool.status(str(tmp_path))[0] == patch_tool.BAD_TARGET
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache", "patch",
                        "apply", "--target", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 3 and "0.4.30" in out.stdout


_DEDUP_CHECK = """
import jax, jax.numpy as jnp
from jax._src.lax.control_flow import common
closed = jax.make_jaxpr(lambda c, x: x + c)(1.0, 1.0)
before = common._dedup_consts.cache_info().hits
common._merge_common_consts([closed], [[jnp.ones(())]])
common._merge_common_consts([closed], [[jnp.ones(()) * 2]])
print(common._dedup_consts.cache_info().hits - before)
"""


@needs_pristine_jax
def test_control_flow_dedup_is_keyed_on_the_sharing_pattern(tmp_path):
  """PR 2: the same jaxpr with new constant objects hits _dedup_consts's
  cache (its test in lax_control_flow_test.py), which the pristine tree
  misses."""
  target = tmp_path / "site"
  shutil.copytree(os.path.join(patch_tool.default_target(), "jax"),
                  target / "jax", ignore=shutil.ignore_patterns("__pycache__"))
  hits = []
  for patched in (False, True):
    if patched:
      assert patch_tool.apply(str(target))[0] == patch_tool.OK
    out = subprocess.run([sys.executable, "-c", _DEDUP_CHECK],
                         env=dict(os.environ, PYTHONPATH=str(target)),
                         cwd=str(target), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    hits.append(int(out.stdout.split()[-1]))
  assert hits == [0, 1]


def _run_without_and_with_the_prs(tmp_path, script, argv=("", "")):
  """``script``'s last line as JSON, run on the installed jax (with
  ``argv[0]``) and on a copy of it carrying the pull requests (with ``argv[1]``)."""
  target = tmp_path / "site"
  shutil.copytree(os.path.join(patch_tool.default_target(), "jax"),
                  target / "jax", ignore=shutil.ignore_patterns("__pycache__"))
  assert patch_tool.apply(str(target))[0] == patch_tool.OK
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  runs = []
  for arg, extra in zip(argv, ({}, {"PYTHONPATH": str(target)})):
    out = subprocess.run([sys.executable, "-c", script, arg],
                         env=dict(env, **extra), cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    runs.append(json.loads(out.stdout.splitlines()[-1]))
  return runs


_BOTH_MODES = """
import json
import numpy as np, jax, jax.numpy as jnp
import jax_closure_cache as jcc
jcc.enable()
x = jnp.ones(3)
n = np.arange(3.0, dtype=np.float32)
make = lambda w: (lambda v: jnp.tanh(v * w) + n)
body = lambda w: (lambda c: (c[0] + 1, c[1] * w))
out = []
for s in range(5):
  out.append(np.asarray(jax.jit(make(jnp.full(3, s + 2.0)))(x)).tolist())
for s in range(4):
  c = jax.lax.while_loop(lambda c: c[0] < 3, body(jnp.full(3, s + 2.0)), (0, x))
  out.append(np.asarray(c[1]).tolist())
s = jcc.stats()
print(json.dumps({"mode": jcc.mode(), "out": out, "hits": s["hits"],
                  "misses": s["misses"], "fallbacks": s["fallbacks"]}))
"""


@needs_pristine_jax
def test_fresh_closures_answer_and_hit_alike_in_both_modes(tmp_path):
  """The same re-created closures (a jit over a jax and a NumPy constant,
  an eager while_loop body) with the package on the installed jax and on
  a copy carrying the pull requests: the same results, hits, misses and
  fallbacks."""
  monkey, patched = _run_without_and_with_the_prs(tmp_path, _BOTH_MODES)
  assert (monkey.pop("mode"), patched.pop("mode")) == ("monkey-patch",
                                                      "patched-jax")
  np.testing.assert_allclose(monkey.pop("out"), patched.pop("out"),
                             rtol=1e-6)
  assert monkey == patched
  assert monkey["hits"] >= 5 and monkey["fallbacks"] == 0, monkey


_JAX_ALONE = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from jax._src import test_util as jtu
if sys.argv[1] == "on":
  jax.config.update("jax_share_lowering_by_structure", True)
x = jnp.ones(3)
out, compiles = [], []
for step in range(6):
  w = jnp.full(3, float(step))
  lr = 0.1 / (step + 1)                   # a new Python float each step
  with jtu.count_jit_compilation_cache_miss() as c:
    out.append(np.asarray(jax.jit(lambda v: v * w - lr)(x)).tolist())
  compiles.append(c())
print(json.dumps({"out": out, "compiles": compiles}))
"""


@needs_pristine_jax
def test_a_patched_jax_alone_shares_compilation_behind_its_option(tmp_path):
  """Deployed without the package: a re-created closure over a new array
  and a new Python float each step shares one executable from its second
  step with JAX's option on (the first step's float is a literal XLA may
  fold; the second value seen makes it an argument), where the installed
  jax compiles every step; results equal."""
  stock, patched = _run_without_and_with_the_prs(tmp_path, _JAX_ALONE,
                                                 ("off", "on"))
  np.testing.assert_allclose(stock["out"], patched["out"], rtol=1e-6)
  assert stock["compiles"] == [1] * 6
  assert patched["compiles"] == [1, 1] + [0] * 4


def test_a_hunk_is_found_where_its_file_moved_and_only_with_its_exact_lines():
  """As ``git apply``: a hunk whose lines moved (a later wheel of the same
  release line) applies where they now are, and reverts exactly; lines
  that changed are a conflict."""
  text = "".join(f"line {i}\n" for i in range(50))
  patch = ("--- a/jax/m.py\n+++ b/jax/m.py\n@@ -10,3 +10,3 @@\n"
           " line 9\n-line 10\n+LINE 10\n line 11\n")
  (fp,) = patch_tool.parse(patch)
  moved = "".join(f"new {i}\n" for i in range(7)) + text
  done = patch_tool._apply_hunks(moved, fp.hunks, reverse=False)
  assert done == moved.replace("line 10\n", "LINE 10\n")
  assert patch_tool._apply_hunks(done, fp.hunks, reverse=True) == moved
  with pytest.raises(patch_tool.PatchError) as e:
    patch_tool._apply_hunks(moved.replace("line 11\n", "line eleven\n"),
                            fp.hunks, reverse=False)
  assert e.value.code == patch_tool.CONFLICT
