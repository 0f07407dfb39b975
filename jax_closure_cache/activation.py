"""Activation by the ``JAX_CLOSURE_CACHE`` environment variable.

This module imports neither jax nor the rest of the package: the installed
start-up hook (``jax_closure_cache_startup.pth``) imports it in every Python
process, so when the variable is unset it must cost next to nothing.

Values: ``1``, ``true``, ``yes``, ``on`` enable (any case); unset, empty,
``0``, ``false``, ``no``, ``off`` leave JAX stock; anything else warns once
and leaves JAX stock. When enabling and jax is not imported yet, a
post-import hook patches ``jax.jit`` right after ``import jax`` finishes, so
a library that binds ``from jax import jit`` at its own import time gets the
patched object.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from jax_closure_cache import cache
from jax_closure_cache import settings

ENV = settings.ENABLE.name
_pending = False   # jax loaded while this package was mid-import: enable later


def requested() -> bool:
  """Whether the environment asks for the cache; warns once if it is garbled
  (and leaves jax.jit stock)."""
  return settings.read(settings.ENABLE)


# What enabling means, given by the package (``__init__``), which knows the
# rest of it: this module imports nothing of the package but ``settings``.
_enabler = None


def _enable_safely() -> None:
  """Enable from the environment; never break the user's program."""
  try:
    _enabler()
  except Exception as e:  # the cache is an optimisation: never fatal
    import warnings
    warnings.warn(f"{ENV} is set but enabling the closure cache failed: "
                  f"{e!r}; jax.jit is left stock.", stacklevel=2)


class _AfterJaxImport(importlib.abc.MetaPathFinder):
  """Finds ``jax`` through the other finders and enables after it loads."""

  def find_spec(self, name, path=None, target=None):
    if name != "jax":
      return None
    _remove_hook()
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    exec_module = spec.loader.exec_module

    def exec_then_enable(module):
      exec_module(module)
      global _pending
      if _package_import_in_progress():
        _pending = True   # enabling now would re-enter a half-imported module
        _install_trampolines()
      else:
        _enable_safely()

    spec.loader.exec_module = exec_then_enable
    return spec


_hook = _AfterJaxImport()


def _remove_hook() -> None:
  try:
    sys.meta_path.remove(_hook)
  except ValueError:
    pass


def _package_import_in_progress() -> bool:
  for name, module in list(sys.modules.items()):
    if (name.startswith("jax_closure_cache.")
        and getattr(getattr(module, "__spec__", None), "_initializing", False)):
      return True
  return False


def finish_pending() -> None:
  """Enable now if jax finished loading in the middle of a package import."""
  global _pending
  if _pending and not _package_import_in_progress():
    _pending = False
    _remove_trampolines()
    _enable_safely()


# While enabling is pending (jax was imported by one of this package's own
# submodules, mid-import), jax.jit and jax.lax's control flow are stand-ins
# that enable on their first use, when every import has finished, and then
# call what is installed. Each is recorded with the original it replaced.
_trampolines: list = cache.STORE.table("activation.trampolines",
                                      cache.Store.REGISTRY, list)
_TRAMPOLINED = ("while_loop", "fori_loop", "scan", "map", "cond", "switch")


def _trampoline(owner, name: str, original):
  import functools

  @functools.wraps(original)
  def stand_in(*args, **kwargs):
    finish_pending()
    current = getattr(owner, name)
    if current is stand_in:   # enabling failed or was refused: stock
      current = original
    return current(*args, **kwargs)
  return stand_in


def _install_trampolines() -> None:
  import jax
  for owner, name in [(jax, "jit")] + [(jax.lax, n) for n in _TRAMPOLINED]:
    original = getattr(owner, name, None)
    if original is not None:
      stand_in = _trampoline(owner, name, original)
      _trampolines.append((owner, name, original, stand_in))
      setattr(owner, name, stand_in)


def _remove_trampolines() -> None:
  while _trampolines:
    owner, name, original, stand_in = _trampolines.pop()
    if getattr(owner, name, None) is stand_in:
      setattr(owner, name, original)


def activate_from_environment(enabler) -> None:
  """Enable (``enabler()``) now if jax is imported, else right after it is,
  when the environment asks for it."""
  global _enabler
  _enabler = enabler
  if not requested():
    return
  if "jax" in sys.modules:
    _enable_safely()
  elif _hook not in sys.meta_path:
    sys.meta_path.insert(0, _hook)

