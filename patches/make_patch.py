"""Generate jax-0.10.2-closure-cache.patch: the upstream form of the package.

The patch is a unified diff against the pristine jax 0.10.2 sources as the
wheel installs them (paths ``jax/...``), plus JAX's own-style test file at
``tests/closure_cache_test.py``. It is made of

* the package's own modules, copied into ``jax/_src/closure_cache/`` with
  only their imports rewritten (one source of truth: never edit the copies);
* ``hooks/hooks.py`` and ``hooks/package_init.py``: the dispatchers and the
  new package's docstring;
* four small hook hunks (``HOOK_EDITS``): the ``jax_closure_cache`` option in
  ``jax/_src/config.py`` and the dispatchers re-exported as ``jax.jit``,
  ``jax.lax.*`` and ``jax._src.lax.*``, the attributes the monkey-patch
  replaces.

Usage::

    python patches/make_patch.py            # rewrite the patch
    python patches/make_patch.py --check    # exit 1 if it is stale

The pristine sources are read from the installed jax (it must not carry the
patch), or from ``--jax-dir DIR`` (a folder containing ``jax/``).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGE = os.path.join(ROOT, "jax_closure_cache")
PATCH = os.path.join(HERE, "jax-0.10.2-closure-cache.patch")
JAX_VERSION = "0.10.2"

VENDORED = ("_compat.py", "cache.py", "closure.py", "closure_front.py",
            "closure_match.py",
            "closure_rebuild.py", "closure_guards.py", "closure_jit.py",
            "control_flow.py", "convert.py", "diagnostics.py",
            "static_args.py", "trace_cache.py", "upstream/__init__.py",
            "upstream/closure_key.py")
TARGET_DIR = "jax/_src/closure_cache"

_EXPLAIN_OPTION_END = (
    "          'otherwise the level is DEBUG.'))\n")

HOOK_EDITS = (
    # (file, anchor that must occur exactly once, text that replaces it)
    ("jax/_src/config.py", _EXPLAIN_OPTION_END, _EXPLAIN_OPTION_END + """
closure_cache = bool_state(
    name='jax_closure_cache',
    default=False,
    help=('Key the caches of jax.jit and of eager control flow (while_loop, '
          'fori_loop, scan, cond, switch, map) on the contents of a '
          "function's closure instead of on the function object, so that "
          're-created closures reuse one compiled executable. Closed-over '
          'arrays are passed as arguments. See jax/_src/closure_cache.'))
"""),
    ("jax/__init__.py", "from jax._src.api import jit as jit\n",
     "from jax._src.api import jit as _stock_jit\n"
     "from jax._src.closure_cache.hooks import dispatching_jit as _dispatching_jit\n"
     "jit = _dispatching_jit(_stock_jit)  # honours jax_closure_cache\n"
     "del _stock_jit, _dispatching_jit\n"),
    ("jax/lax/__init__.py",
     "  platform_dependent as platform_dependent,\n)\n",
     "  platform_dependent as platform_dependent,\n)\n"
     "from jax._src.closure_cache.hooks import (  # honour jax_closure_cache\n"
     "  cond as cond,\n  fori_loop as fori_loop,\n  map as map,\n"
     "  scan as scan,\n  switch as switch,\n  while_loop as while_loop,\n"
     "  custom_linear_solve as custom_linear_solve,\n"
     "  custom_root as custom_root,\n)\n"),
    ("jax/_src/lax/__init__.py",
     "  while_loop as while_loop,\n  while_p as while_p,\n)\n",
     "  while_loop as while_loop,\n  while_p as while_p,\n)\n"
     "from jax._src.closure_cache.hooks import (  # honour jax_closure_cache\n"
     "  cond as cond,\n  fori_loop as fori_loop,\n  scan as scan,\n"
     "  switch as switch,\n  while_loop as while_loop,\n"
     "  custom_linear_solve as custom_linear_solve,\n)\n"),
    ("jax/__init__.py",
     "from jax._src.custom_derivatives import closure_convert as closure_convert\n",
     "from jax._src.closure_cache.hooks import closure_convert as closure_convert\n"),
    ("jax/custom_derivatives.py",
     "  remat_opt_p as remat_opt_p,\n)\n",
     "  remat_opt_p as remat_opt_p,\n)\n"
     "from jax._src.closure_cache.hooks import (  # honour jax_closure_cache\n"
     "  closure_convert as closure_convert,\n)\n"),
)

_IMPORT = re.compile(r"^from jax_closure_cache(\.\w+)? import ", re.M)


def vendored_source(name: str) -> str:
  with open(os.path.join(PACKAGE, name)) as f:
    text = f.read()
  text = _IMPORT.sub(lambda m: f"from jax._src.closure_cache{m.group(1) or ''} import ",
                     text)
  assert not _IMPORT.search(text), name   # docstring examples may stay
  header = (f"# Generated from jax_closure_cache/{name} by "
            "jax-closure-cache's patches/make_patch.py.\n")
  return header + text


def pristine_jax_dir() -> str:
  spec = importlib.util.find_spec("jax")
  return os.path.dirname(os.path.dirname(spec.origin))


def read(jax_dir: str, path: str) -> str:
  with open(os.path.join(jax_dir, path)) as f:
    return f.read()


def new_files() -> dict[str, str]:
  files = {f"{TARGET_DIR}/{name}": vendored_source(name) for name in VENDORED}
  with open(os.path.join(HERE, "hooks", "hooks.py")) as f:
    files[f"{TARGET_DIR}/hooks.py"] = f.read()
  with open(os.path.join(HERE, "hooks", "package_init.py")) as f:
    files[f"{TARGET_DIR}/__init__.py"] = f.read()
  with open(os.path.join(HERE, "closure_cache_test.py")) as f:
    files["tests/closure_cache_test.py"] = f.read()
  return files


def edited_files(jax_dir: str) -> dict[str, tuple[str, str]]:
  out = {}
  for path, anchor, replacement in HOOK_EDITS:
    before = out[path][0] if path in out else read(jax_dir, path)
    current = out[path][1] if path in out else before
    if current.count(anchor) != 1:
      raise SystemExit(f"{path}: the anchor occurs {current.count(anchor)} "
                       f"times, not once:\n{anchor}")
    out[path] = (before, current.replace(anchor, replacement))
  return out


def make_patch(jax_dir: str) -> str:
  version = re.search(r'^_version = "([^"]+)"',
                      read(jax_dir, "jax/version.py"), re.M)
  if not version or version.group(1) != JAX_VERSION:
    raise SystemExit(f"{jax_dir}/jax is not jax {JAX_VERSION}")
  if os.path.exists(os.path.join(jax_dir, TARGET_DIR)):
    raise SystemExit(f"{jax_dir}/jax already carries the patch: generate "
                     "from pristine sources")
  chunks = [
      f"jax-closure-cache: closure-aware caching for jax.jit and eager control\n"
      f"flow, behind the jax_closure_cache option (default off).\n"
      f"Against jax {JAX_VERSION}; generated by patches/make_patch.py.\n\n"]
  for path, (before, after) in sorted(edited_files(jax_dir).items()):
    chunks.append("".join(difflib.unified_diff(
        before.splitlines(True), after.splitlines(True),
        f"a/{path}", f"b/{path}")))
  for path, text in sorted(new_files().items()):
    assert text.endswith("\n"), path
    chunks.append("".join(difflib.unified_diff(
        [], text.splitlines(True), "/dev/null", f"b/{path}")))
  return "".join(chunks)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--jax-dir", default=None,
                      help="folder containing pristine jax/ (default: installed)")
  parser.add_argument("--check", action="store_true",
                      help="exit 1 if the committed patch differs")
  parser.add_argument("--output", default=PATCH)
  args = parser.parse_args(argv)
  text = make_patch(args.jax_dir or pristine_jax_dir())
  if args.check:
    with open(args.output) as f:
      committed = f.read()
    if committed != text:
      print(f"{args.output} is stale: run python patches/make_patch.py")
      return 1
    print(f"{args.output} is up to date")
    return 0
  with open(args.output, "w") as f:
    f.write(text)
  print(f"wrote {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
