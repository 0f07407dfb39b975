#!/usr/bin/env python3
"""Checks the upstream pull requests in this folder against an installed jax.

  python3 patches/prs/check.py PYTHON PR [PR ...] [--quick | --off-quick]

PYTHON is an interpreter with jax installed (jax 0.10.2: the PRs' jax-v0.10.2
version; jax 0.11.x: their jax-v0.11.0 version). PR names a folder here
(share-lowering-by-structure, control-flow-dedup-consts); several are applied
in the order given. The check:

1. copies the installed `jax` package to a temporary folder and applies the
   PRs' hunks under `jax/` (`*.py` only: no BUILD files are installed) with
   `git apply`; copies JAX's test files for the tag (../shared/jax-tests)
   to another and applies the PRs' hunks under `tests/` there;
2. runs from a temporary folder with PYTHONPATH pointing at the patched copy
   and a `sitecustomize` that makes `jax_closure_cache` unimportable (it is
   installed in the development venvs), after asserting that `import jax`
   finds the copy and `import jax_closure_cache` fails; pytest runs with
   `-p no:jax_closure_cache` (that package's pytest plugin);
3. runs the PRs' own tests: new test files whole, and in modified test files
   the test methods the PR adds;
4. runs JAX's api_test.py and lax_control_flow_test.py, as the PRs' hunks
   leave them (through a copy of ../shared/jax-tests/run beside the patched
   copy), once with each option the PRs define set on and once with it off
   (`JAX_<OPTION>=1` / `=0`), or once if they define none. With --quick:
   only api_test.py with `-k "Caching or jit or cache"` (about a minute per
   run on 2 cores). With --off-quick: the two files whole with the options
   on (the PRs' new paths), and that quick selection with them off (the
   jit and caching tests, where an option-off path meets stock's code);
   CI's form, to keep within its time.

Failures listed in allowed/<tag>.txt (stock failures of that jax) or, with
an option on, in allowed/<tag>-on.txt are tolerated; any other failure, a
crash, a patch that does not apply or an own test file that collects nothing
exits 1.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import tempfile

HERE = Path(__file__).resolve().parent
# JAX's own test files beside the checkout (``../shared/jax-tests``)
JAX_TESTS = Path(os.environ.get(
    "JAX_TESTS_DIR",
    Path(__file__).resolve().parents[2].parent / "shared" / "jax-tests"))
QUICK_K = "Caching or jit or cache"
TEST_ENV = {"JAX_NUM_GENERATED_CASES": "1", "JAX_SKIP_SLOW_TESTS": "true"}
NO_PLUGIN = ["-p", "no:jax_closure_cache"]
GUARD = ("# Written by patches/prs/check.py: jax runs here without the\n"
         "# jax_closure_cache package (installed in the development venvs):\n"
         "# a finder that refuses it (a None in sys.modules would break\n"
         "# pytest's scan of installed plugins).\n"
         "import sys\n"
         "class _Hidden:\n"
         "  def find_spec(self, name, path=None, target=None):\n"
         "    if name.partition('.')[0] == 'jax_closure_cache':\n"
         "      raise ModuleNotFoundError(name + ' is hidden by check.py')\n"
         "    return None\n"
         "sys.meta_path.insert(0, _Hidden())\n")


def log(msg: str) -> None:
  print(msg, flush=True)


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, text=True, capture_output=True, **kwargs)


def installed_jax(python: str, cwd: Path) -> tuple[str, Path]:
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  r = run([python, "-c", "import jax; print(jax.__version__); "
           "print(jax.__file__)"], cwd=cwd, env=env)
  if r.returncode:
    sys.exit(f"cannot import jax with {python}:\n{r.stderr}")
  version, init = r.stdout.split()
  return version, Path(init).parent


def tag_for(version: str) -> str:
  if version == "0.10.2":
    return "jax-v0.10.2"
  if version.startswith("0.11."):
    return "jax-v0.11.0"
  sys.exit(f"no PR versions for jax {version} (0.10.2 and 0.11.x only)")


def patches_of(pr: str, tag: str) -> list[Path]:
  folder = HERE / pr / tag
  patches = sorted(folder.glob("*.patch"))
  if not patches:
    sys.exit(f"no patches in {folder}")
  return patches


def git_apply(patch: Path, root: Path, include: str) -> bool:
  env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent))
  r = run(["git", "apply", "-v", f"--include={include}", str(patch)],
          cwd=root, env=env)
  if r.returncode:
    log(f"  FAILED to apply {patch.name} ({include}):\n{r.stderr}")
    return False
  applied = re.findall(r"^Applied patch (\S+) cleanly", r.stderr, re.M)
  log(f"  applied {patch.name} ({include}): {', '.join(applied) or 'nothing'}")
  return True


def own_tests(patches: list[Path]) -> dict[str, list[str]]:
  """Test file -> the test methods the patches add to it; [] for a file they
  create (all of it is run)."""
  added: dict[str, list[str]] = {}
  created: set[str] = set()
  for patch in patches:
    path, new_file = None, False
    for line in patch.read_text().splitlines():
      if line.startswith("--- "):
        new_file = line == "--- /dev/null"
      elif line.startswith("+++ "):
        path = line[len("+++ b/"):]
        if not (path.startswith("tests/") and path.endswith(".py")):
          path = None
        elif new_file:
          created.add(path)
      elif path and line.startswith("+"):
        m = re.match(r"\+\s+def (test\w*)\(", line)
        if m:
          added.setdefault(path, []).append(m.group(1))
  return {**{p: names for p, names in added.items() if p not in created},
          **{p: [] for p in created}}


def options_of(patches: list[Path]) -> list[str]:
  """The environment variables of the config options the patches define."""
  names = []
  for patch in patches:
    names += re.findall(r"^\+\s*name='(jax_\w+)'", patch.read_text(), re.M)
  return [n.upper() for n in dict.fromkeys(names)]


def allowed_file(tag: str, on: bool, work: Path) -> Path:
  lines = []
  for name in [f"{tag}.txt"] + ([f"{tag}-on.txt"] if on else []):
    f = HERE / "allowed" / name
    if f.exists():
      lines += f.read_text().splitlines()
  out = work / f"allowed-{'on' if on else 'off'}.txt"
  out.write_text("\n".join(lines) + "\n")
  return out


def allowed_ids(path: Path) -> set[str]:
  return {l.strip() for l in path.read_text().splitlines()
          if l.strip() and not l.lstrip().startswith("#")}


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("python")
  ap.add_argument("prs", nargs="+")
  ap.add_argument("--quick", action="store_true",
                  help="own tests and api_test.py -k '%s' only" % QUICK_K)
  ap.add_argument("--off-quick", action="store_true",
                  help="JAX's files whole with the options on, and only "
                  "the quick selection with them off")
  ap.add_argument("--keep", action="store_true", help="keep the temp folder")
  args = ap.parse_args()

  work = Path(tempfile.mkdtemp(prefix="jax-prs-check-"))
  ok = True
  try:
    run_dir = work / "run"
    run_dir.mkdir()
    version, jax_dir = installed_jax(args.python, run_dir)
    tag = tag_for(version)
    log(f"jax {version} at {jax_dir}: the PRs' {tag} versions")
    patches = [p for pr in args.prs for p in patches_of(pr, tag)]

    site = work / "site"
    site.mkdir()
    shutil.copytree(jax_dir, site / "jax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The tag's test files with the PRs' hunks, beside a copy of the runner
    # script, which runs the files beside it.
    tests = work / "jax-tests" / tag
    shutil.copytree(JAX_TESTS / tag, tests)
    shutil.copy(JAX_TESTS / "run", tests.parent / "run")
    for root, dirs, files in os.walk(tests):
      os.chmod(root, 0o755)
      for name in files:
        os.chmod(os.path.join(root, name), 0o644)
    for patch in patches:
      ok &= git_apply(patch, site, "jax/*.py")
      ok &= git_apply(patch, tests, "tests/*.py")
    if not ok:
      log("FAILED: a patch does not apply")
      return 1
    guard = work / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    env = dict(os.environ, PYTHONPATH=f"{guard}{os.pathsep}{site}", **TEST_ENV)
    for var in options_of(patches):
      env.pop(var, None)

    r = run([args.python, "-c", "import jax; print(jax.__file__)"],
            cwd=run_dir, env=env)
    if r.returncode or not r.stdout.strip().startswith(str(site)):
      log(f"FAILED: jax is not imported from the patched copy: {r.stdout}"
          f"{r.stderr}")
      return 1
    r = run([args.python, "-c", "import jax_closure_cache"], cwd=run_dir,
            env=env)
    if r.returncode == 0 or "ModuleNotFoundError" not in r.stderr:
      log("FAILED: jax_closure_cache is importable in the test environment")
      return 1
    log("jax imported from the patched copy; jax_closure_cache not importable")

    # (a) the PRs' own tests
    for path, names in own_tests(patches).items():
      cmd = [args.python, "-m", "pytest", "-q", *NO_PLUGIN, path]
      if names:
        cmd += ["-k", " or ".join(names)]
      r = run(cmd + ["-p", "no:cacheprovider"], cwd=tests, env=env)
      summary = (r.stdout.strip().splitlines() or ["no output"])[-1]
      log(f"own tests {path}{' -k ' + ' or '.join(names) if names else ''}:"
          f" {summary}")
      if r.returncode:
        log(r.stdout[-4000:] + r.stderr[-2000:])
        ok = False

    # (b) JAX's own test files, with each option on and off
    options = options_of(patches)
    modes = ([("on", {v: "1" for v in options}, True),
              ("off", {v: "0" for v in options}, False)]
             if options else [("as is (no option)", {}, False)])
    for mode, settings, on in modes:
      mode_env = dict(env, **settings)
      allowed = allowed_file(tag, on, work)
      label = ", ".join(f"{k}={v}" for k, v in settings.items()) or mode
      if args.quick or (args.off_quick and options and not on):
        r = run([args.python, "-m", "pytest", "-q", "-rfE", "--tb=short",
                 "-n", "2", *NO_PLUGIN, "-p", "no:cacheprovider",
                 "tests/api_test.py", "-k", QUICK_K],
                cwd=tests, env=mode_env)
        summary = next((l for l in reversed(r.stdout.splitlines())
                        if re.search(r"\d+ (passed|failed)", l)), None)
        log(f"api_test -k '{QUICK_K}' with {label}: {summary}")
        failed = set(re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M))
        bad = sorted(failed - allowed_ids(allowed))
        for t in sorted(failed & allowed_ids(allowed)):
          log(f"  allowed: {t}")
        for t in bad:
          log(f"  FAILED: {t}")
        if bad or summary is None or re.search(r"crashed|node down",
                                               r.stdout):
          ok = False
      else:
        log(f"JAX's test files with {label}:")
        r = run(["bash", str(tests.parent / "run"), args.python, tag,
                 str(allowed), "--", *NO_PLUGIN], cwd=run_dir, env=mode_env)
        log("  " + r.stdout.strip().replace("\n", "\n  "))
        if r.returncode:
          ok = False
  finally:
    if args.keep:
      log(f"kept {work}")
    else:
      shutil.rmtree(work, ignore_errors=True)
  log("OK" if ok else "FAILED")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
