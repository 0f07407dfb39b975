"""Apply, check and revert the upstream pull requests on an installed jax.

Each pull request (``patches/prs/<pr>/<tag>/000N-*.patch``, cut with
``git format-patch``, shipped inside the package as
``jax_closure_cache/patches/<pr>/<tag>/``; ``_compat.PULL_REQUESTS`` names
them in order and ``_compat.PULL_REQUEST_TAGS`` the tag whose version
applies to each release) is a set of unified diffs against JAX's sources,
paths starting with ``jax/``, ``tests/`` or the top level. A target is a
folder that contains a ``jax/`` package (site-packages, or any copy): the
patches' changes to ``jax/**.py`` are applied there, in order; JAX's tests,
``BUILD`` files and the CHANGELOG are for the pull request and never
written into a target.

Invariants:
* ``apply`` and ``revert`` compute every file's new content in memory first
  (a dry run of all the patches); if any hunk does not match exactly,
  nothing is written.
* ``revert`` after ``apply`` restores every file byte for byte and removes
  the files the pull requests added.
* The target must be a release they are cut for (read from
  ``jax/version.py``, not imported); that release's version is applied.

Exit codes (also of ``python -m jax_closure_cache patch ...``):
``0`` done / applied; ``1`` nothing to do: already applied (``apply``) or not
applied (``revert``, ``check``); ``2`` conflicting: hunks match neither the
pristine nor the patched sources; ``3`` not a release they are cut for.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile

from jax_closure_cache import _compat

OK, NOTHING_TO_DO, CONFLICT, BAD_TARGET = 0, 1, 2, 3


class PatchError(Exception):
  def __init__(self, code: int, message: str):
    super().__init__(message)
    self.code = code


@dataclasses.dataclass
class Hunk:
  old_start: int   # 1-based line numbers, as in the @@ header
  new_start: int
  lines: list      # (" " | "-" | "+", text with its newline)


@dataclasses.dataclass
class FilePatch:
  path: str        # "jax/..." relative to the target
  new_file: bool
  hunks: list


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def patch_paths(release: str | None = None) -> list[str]:
  """The pull requests' patches for ``release`` (default: the installed
  jax's), shipped with the package or the checkout's, in order."""
  release = release or _jax_version(default_target())
  tag = _compat.PULL_REQUEST_TAGS.get(release)
  if tag is None:
    raise PatchError(BAD_TARGET, f"no pull requests for jax "
                     f"{release or '(none)'}: they are cut for "
                     + ", ".join(_compat.PULL_REQUEST_TAGS))
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = []
  for pr in _compat.PULL_REQUESTS:
    for folder in (os.path.join(package, "patches", pr, tag),
                   os.path.join(os.path.dirname(package), "patches", "prs",
                                pr, tag)):
      names = sorted(n for n in os.listdir(folder)
                     if n.endswith(".patch")) if os.path.isdir(folder) else []
      if names:
        paths += [os.path.join(folder, n) for n in names]
        break
    else:
      raise PatchError(BAD_TARGET, f"pull request {pr} ({tag}) is not next "
                       "to the package")
  return paths


def _applies_to_target(path: str) -> bool:
  """Whether a file of a pull request belongs in an installed jax."""
  return path.startswith("jax/") and path.endswith(".py")


def parse(text: str) -> list[FilePatch]:
  files: list[FilePatch] = []
  lines = text.splitlines(True)
  i = 0
  while i < len(lines):
    if lines[i].startswith("--- ") and i + 1 < len(lines) and \
        lines[i + 1].startswith("+++ "):
      new_file = lines[i][4:].strip() == "/dev/null"
      path = lines[i + 1][4:].strip()
      path = path[2:] if path.startswith("b/") else path
      current = FilePatch(path, new_file, [])
      files.append(current)
      i += 2
      continue
    m = _HUNK.match(lines[i])
    if m:
      current.hunks.append(Hunk(int(m.group(1)), int(m.group(2)), []))
    elif files and files[-1].hunks and lines[i][:1] in (" ", "-", "+"):
      files[-1].hunks[-1].lines.append((lines[i][0], lines[i][1:]))
    i += 1
  return files


#: How far from the line its header names a hunk may be found (the same
#: version of a pull request applies to a later wheel of its release line,
#: whose files moved by some lines, as ``git apply`` finds it).
MAX_OFFSET = 400


def _apply_hunks(text: str, hunks: list, reverse: bool) -> str:
  """``text`` with ``hunks`` applied (or un-applied); PatchError if a hunk's
  lines do not match exactly, at the line its header names or (as ``git
  apply`` does) the nearest place within ``MAX_OFFSET`` lines of it, after
  the previous hunk, shifted by the offset the previous hunks had."""
  src = text.splitlines(True)
  removed, added = ("+", "-") if reverse else ("-", "+")
  out: list[str] = []
  pos = offset = 0
  for h in hunks:
    before = [t for k, t in h.lines if k in (" ", removed)]
    after = [t for k, t in h.lines if k in (" ", added)]
    named = max((h.new_start if reverse else h.old_start) - 1, 0) + offset
    start = _find(src, before, named, pos)
    if start is None:
      raise PatchError(CONFLICT, f"hunk at line {named + 1} does not match")
    offset += start - named
    out += src[pos:start] + after
    pos = start + len(before)
  return "".join(out + src[pos:])


def _find(src: list, lines: list, near: int, lowest: int) -> int | None:
  """The position of ``lines`` in ``src`` nearest ``near`` (not before
  ``lowest``, at most ``MAX_OFFSET`` away), or None."""
  for d in range(MAX_OFFSET + 1):
    for at in (near - d, near + d) if d else (near,):
      if at >= lowest and src[at:at + len(lines)] == lines:
        return at
  return None


def _jax_version(target: str) -> str | None:
  path = os.path.join(target, "jax", "version.py")
  try:
    with open(path) as f:
      m = re.search(r'^_version = "([^"]+)"', f.read(), re.M)
  except OSError:
    return None
  return m.group(1) if m else None


def default_target() -> str:
  import importlib.util
  spec = importlib.util.find_spec("jax")
  return os.path.dirname(os.path.dirname(spec.origin))


def _plan(target: str, reverse: bool,
          upto: int | None = None) -> dict[str, str | None]:
  """New content of every touched file (None: delete) after the pull
  requests (their first ``upto`` patches), or PatchError."""
  version = _jax_version(target)
  if version not in _compat.PULL_REQUEST_TAGS:
    raise PatchError(BAD_TARGET, f"{target} does not hold a jax the upstream "
                     "pull requests are cut for ("
                     f"{', '.join(_compat.PULL_REQUEST_TAGS)}; found "
                     f"{version or 'no jax'}); the package itself runs on "
                     f"{_compat.supported_text()} without them")
  patches = []
  for path in patch_paths(version)[:upto]:
    with open(path) as f:
      patches.append([fp for fp in parse(f.read())
                      if _applies_to_target(fp.path)])
  if reverse:
    patches.reverse()
  plan: dict[str, str | None] = {}   # full path -> content after them

  def content(full):
    if full in plan:
      return plan[full]
    if not os.path.exists(full):
      return None
    with open(full) as f:
      return f.read()

  for files in patches:
    for fp in files:
      full = os.path.join(target, fp.path)
      current = content(full)
      if fp.new_file:
        text = "".join(t for _, t in fp.hunks[0].lines)
        if reverse:
          if current is None:
            raise PatchError(NOTHING_TO_DO, f"{fp.path} is absent")
          if current != text:
            raise PatchError(CONFLICT, f"{fp.path} differs from the patch's")
          plan[full] = None
        else:
          if current is not None:
            raise PatchError(NOTHING_TO_DO, f"{fp.path} already exists")
          plan[full] = text
      else:
        if current is None:
          raise PatchError(CONFLICT, f"{fp.path} is missing")
        plan[full] = _apply_hunks(current, fp.hunks, reverse)
  return plan


def status(target: str) -> tuple[int, str]:
  """(code, message): 0 applied, 1 not applied, 2 conflicting, 3 bad target."""
  try:
    _plan(target, reverse=True)
    return OK, f"applied: {target}/jax carries the upstream pull requests"
  except PatchError as on_reverse:
    if on_reverse.code == BAD_TARGET:
      return BAD_TARGET, str(on_reverse)
  try:
    _plan(target, reverse=False)
    return NOTHING_TO_DO, f"not applied: {target}/jax is pristine"
  except PatchError as on_forward:
    return CONFLICT, f"conflicting: {on_forward}"


def _write(plan: dict[str, str | None]) -> None:
  for full, text in plan.items():
    if text is None:
      os.remove(full)
      parent = os.path.dirname(full)
      if os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)
      continue
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(full))
    with os.fdopen(fd, "w") as f:
      f.write(text)
    if os.path.exists(full):
      os.chmod(tmp, os.stat(full).st_mode)
    os.replace(tmp, full)


def apply_first(target: str, count: int) -> None:
  """Apply only the first ``count`` patches to a pristine target
  (each patch must work on its own; tests check that)."""
  _write(_plan(target, reverse=False, upto=count))


def apply(target: str) -> tuple[int, str]:
  code, message = status(target)
  if code != NOTHING_TO_DO:
    return (NOTHING_TO_DO, "already " + message) if code == OK else (code, message)
  _write(_plan(target, reverse=False))
  return OK, f"applied to {target}/jax"


def revert(target: str) -> tuple[int, str]:
  code, message = status(target)
  if code != OK:
    return code, message
  plan = _plan(target, reverse=True)
  # Delete the added files last: their folder goes once it is empty.
  _write(dict(sorted(plan.items(), key=lambda kv: kv[1] is None)))
  return OK, f"reverted {target}/jax to the pristine sources"
