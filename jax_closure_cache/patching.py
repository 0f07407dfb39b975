"""The patch registry: which attributes ``enable()`` replaces, and their originals.

Invariants:
* Every patch is recorded with the exact object it replaced; ``disable()``
  puts that object back, so ``jax.jit is original`` holds again.
* ``enable()`` and ``disable()`` are idempotent and serialised by one lock;
  a second ``enable()`` only updates options.
* ``enabled()`` restores the state it found (enabled or not, and options),
  also when nested inside ``enable()``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any, NamedTuple

import jax

from jax_closure_cache import _compat
from jax_closure_cache import cache
from jax_closure_cache import settings
from jax_closure_cache.cache import clear, stats   # noqa: F401 (public names)
from jax_closure_cache.front import entrance
from jax_closure_cache.lowering import shared as _tier_a   # its stats() row
from jax_closure_cache.front import options as jit_options


class Patch(NamedTuple):
  """``setattr(owner, name, replacement)``, remembering ``original``."""
  owner: Any
  name: str
  original: Any
  replacement: Any


def _tier_a_points() -> list[tuple[Any, str, Any]]:
  """Tier A's patch points: pjit's lowering for a call, shared by the
  jaxpr's structure; none where the running jax lacks its seams."""
  from jax_closure_cache._compat import lowering as compat_lowering
  if compat_lowering.LOWERING_MISSING:
    return []
  from jax_closure_cache.lowering import shared
  return [(owner, name, shared.REPLACEMENTS[name])
          for owner, name in compat_lowering.LOWERING_PATCH_POINTS]


def _patch_points(closure_key: bool = True) -> list[tuple[Any, str, Any]]:
  """(owner, attribute, replacement) for every place ``enable()`` patches.

  ``jax.jit`` (JAX's own modules call their internal ``api.jit`` and keep
  stock behaviour), the control-flow functions and custom solves wherever
  callers look them up at call time (``_compat.CONTROL_FLOW_OWNERS``),
  ``cg`` and ``bicgstab`` (``_compat.SOLVER_OWNERS``), and
  ``closure_convert`` (``_compat.CLOSURE_CONVERT_OWNERS``), but only where
  the attribute is still JAX's own function; and the memoized trace lookup
  with the pjit functions around it (``_compat.trace.TRACE_PATCH_POINTS``).
  """
  if not closure_key:
    return _tier_a_points()
  from jax_closure_cache.control_flow import launchers
  from jax_closure_cache.front import convert
  from jax_closure_cache.lookup import trace_lookup
  points = [(jax, "jit", entrance.jit), (jax, "eval_shape", entrance.eval_shape)]
  for owner in _compat.CONTROL_FLOW_OWNERS:
    for name, replacement in launchers.CACHED.items():
      if getattr(owner, name, None) is _compat.STOCK_CONTROL_FLOW[name]:
        points.append((owner, name, replacement))
  for owner in _compat.SOLVER_OWNERS:
    for name, replacement in launchers.SOLVERS.items():
      if getattr(owner, name, None) is _compat.STOCK_SOLVERS[name]:
        points.append((owner, name, replacement))
  for owner in _compat.CLOSURE_CONVERT_OWNERS:
    if getattr(owner, "closure_convert", None) is _compat.STOCK_CLOSURE_CONVERT:
      points.append((owner, "closure_convert", convert.closure_convert))
  # layer two: the closure key inside JAX's memoized trace lookup (only
  # where the running jax has the seams it is written against: elsewhere
  # the front runs alone, see _compat.trace.TRACE_LOOKUP)
  if _compat.trace.TRACE_LOOKUP:
    for owner, name in _compat.trace.TRACE_PATCH_POINTS:
      points.append((owner, name, trace_lookup.REPLACEMENTS[name]))
  points += _tier_a_points()
  points += prebuilt_points()
  # a warning a trace issues is an effect a hit would skip
  for name, replacement in trace_lookup.closure_cache.WARNING_REPLACEMENTS.items():
    points.append((warnings, name, replacement))
  # a lifted trace's questions of its lifted arrays' concreteness, which
  # stock's trace answers from their values (key/state_watch.asked)
  watch = trace_lookup.closure_cache.state_watch
  points += _compat.trace.concreteness_patch_points(
      watch.asked, watch.watching, _compat.library_or_own_code)
  # a stock jitted object the cache calls for many fresh functions misses
  # JAX's C++ cache where a state its traces read, left out of the jit
  # key, changed (_compat.JitKeyMirror)
  points += _compat.JIT_KEY_MIRROR.patch_points()
  # the closure key walks and rebuilds with the package's rules
  points.append((trace_lookup.closure_key, "active_rules", trace_lookup.RULES))
  # and a stock jitted object called eagerly keeps stock's executable
  points.append((trace_lookup.closure_cache, "is_shared",
                 trace_lookup.is_shared))
  return points


def prebuilt_points() -> list[tuple[Any, str, Any]]:
  """JAX's own stock jitted functions that take functions statically and
  were built before ``enable()`` (``_compat.JAX_PREBUILT_WRAPPERS``, in
  modules already imported): each is replaced by the package's ``jit`` of
  the same function with the same options. A module imported later builds
  its wrapper with the patched ``jax.jit``, or (through JAX's internal
  ``jit``) is found here at the next ``enable()``."""
  points = []
  for module_name, name in _compat.JAX_PREBUILT_WRAPPERS:
    module = sys.modules.get(module_name)
    stock = getattr(module, name, None)
    options = _compat.jit_options_of(stock)
    if options is not None:
      points.append((module, name, entrance.jit(stock.__wrapped__,
                                                   **options)))
  return points


def built_before_enable() -> list[str]:
  """``module.name`` of each stock jitted function that takes functions as
  static arguments, sits in an imported module outside JAX, and so was
  built with stock ``jax.jit`` before ``enable()``: fresh functions passed
  to it compile on every call. (JAX's own are replaced by ``enable()``.)"""
  found = []
  for module_name, module in list(sys.modules.items()):
    if module is None or module_name.partition(".")[0] in ("jax", "jaxlib"):
      continue
    try:
      wrappers = _compat.stock_wrappers_in(module)
    except Exception:   # a module whose namespace cannot be read
      continue
    found += [f"{module_name}.{name}" for name, _ in wrappers]
  return sorted(found)


_lock = threading.RLock()
_applied: list[Patch] = cache.STORE.table("patching.applied", cache.Store.REGISTRY,
                                          list)


def is_enabled() -> bool:
  """Whether ``jax.jit`` (and control flow) are currently the cached ones."""
  from jax_closure_cache import activation
  activation.finish_pending()   # enabling by the environment may be pending
  return bool(_applied)


def _check_version(force: bool) -> None:
  if force or _compat.versions_match():
    return
  import jaxlib
  raise RuntimeError(
      f"jax_closure_cache supports jax {_compat.supported_text()} (with the "
      f"same jaxlib), but jax=={jax.__version__} and "
      f"jaxlib=={jaxlib.__version__} are installed. Install a supported "
      "release, or call enable(force=True) to patch anyway.")


def mode() -> str:
  """``"patched-jax"`` when the installed jax carries the upstream pull
  requests (``python -m jax_closure_cache patch apply``: JAX's own
  structural sharing of lowering behind ``jax_share_lowering_by_structure``,
  and control flow's constant dedup), else ``"monkey-patch"``. ``enable()``
  installs the same patches in both. JAX's option is independent of the
  package and off by default; leave it off while the package is enabled,
  whose tier A shares the same executables and is what verify mode checks."""
  return ("patched-jax" if _compat.jax_carries_pull_requests()
          else "monkey-patch")


def enable(*, lift_numpy: bool | None = None, verify: bool | None = None,
           closure_key: bool | None = None, force: bool = False,
           **removed) -> None:
  """Make ``jax.jit`` and ``jax.lax`` control flow closure-aware, process-wide.

  A variable of ``settings.IGNORED`` set in the environment warns once.

  Args:
    lift_numpy: if given, the default of ``jit(..., lift_numpy=...)``.
    verify: if given, turns verify mode on or off: every hit is also
      traced (tier B) or lowered (tier A) as stock would, and compared; a
      mismatch is answered by stock, counted in ``stats()`` and logged.
    closure_key: False installs tier A alone (the executable shared after
      stock's own trace, ``jax.jit`` left stock): nothing skips a trace;
      True, both tiers. If not given: both tiers when the cache is switched
      on, the tiers installed while it is on. Given while on with the other
      tiers installed, it switches them (as ``disable()`` then
      ``enable()``: jitted objects made before keep what they were).
    force: enable even if the installed jax is not the pinned release.
    removed: empty; any keyword here raises TypeError, which for a
      removed option (``auto_dynamic``) says why (``REMOVED_OPTIONS`` of
      ``front/options.py``).

  Example::

      >>> import jax, jax_closure_cache
      >>> jax_closure_cache.enable()
      >>> jax_closure_cache.is_enabled()
      True
      >>> jax_closure_cache.disable()
  """
  jit_options.reject_keywords("enable", removed)
  with _lock:
    _check_version(force)
    settings.warn_ignored()
    if lift_numpy is not None:
      jit_options.set_lift_numpy_default(lift_numpy)
    if verify is not None:
      cache.set_verify(verify)
    if _applied:
      if closure_key is None or closure_key == _closure_key_installed():
        return
      disable()
    for owner, name, replacement in _patch_points(
        True if closure_key is None else closure_key):
      original = getattr(owner, name)
      _applied.append(Patch(owner, name, original, replacement))
      setattr(owner, name, replacement)
    from jax_closure_cache import diagnostics
    if diagnostics.explaining():
      diagnostics.built_too_early(built_before_enable())


def _closure_key_installed() -> bool:
  """Whether the installed patches are both tiers' (``jax.jit`` replaced)."""
  return any(p.owner is jax and p.name == "jit" for p in _applied)


def disable() -> None:
  """Put back every original that ``enable()`` replaced, in reverse order,
  where its replacement is still there (one installed since, the user's,
  is theirs to keep)."""
  with _lock:
    while _applied:
      p = _applied.pop()
      if getattr(p.owner, p.name, None) is p.replacement:
        setattr(p.owner, p.name, p.original)


def enabled(*, lift_numpy: bool | None = None, verify: bool | None = None,
            force: bool = False, **removed):
  """Enable for the ``with`` block, then restore the previous state (the
  keywords are ``enable()``'s; a wrong one raises here, at the call)."""
  jit_options.reject_keywords("enabled", removed)
  return _enabled(lift_numpy, verify, force)


@contextlib.contextmanager
def _enabled(lift_numpy, verify, force):
  with _lock:
    was_enabled = is_enabled()
    saved_lift_numpy = jit_options.lift_numpy_default()
    saved_verify = cache.verifying()
    enable(lift_numpy=lift_numpy, verify=verify, force=force)
  try:
    yield
  finally:
    with _lock:
      jit_options.set_lift_numpy_default(saved_lift_numpy)
      cache.set_verify(saved_verify)
      if not was_enabled:
        disable()
