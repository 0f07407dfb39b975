"""jax-closure-cache: ``jax.jit`` that caches on a closure's contents.

Code that builds a fresh function on every call (a nested ``def``, a lambda in
a loop, ``functools.partial``, a re-wrapped ``jax.grad``) pays a full trace and
XLA compile per call under stock ``jax.jit``, which caches on the function
object. This package shares one executable between such functions in two
tiers: tier A after stock's own trace, keyed by the jaxpr's structure (only
lowering and compiling are skipped); tier B, the closure key, where it can
prove the trace would be the same (the code object plus what the closure
holds, verified free of tracers), with closed-over arrays passed as
arguments. Verify mode checks every hit against what stock would do.

Public API::

    jit(fun=None, **jax_jit_options)   # closure-aware drop-in for jax.jit
    lax.while_loop, fori_loop, scan, cond, switch, map   # eager, cached
    enable(), disable(), is_enabled(), enabled()   # patch jax.jit globally
    enable(verify=True)                # verify mode: each hit checked
    enable(closure_key=False)          # tier A alone
    mode()                             # "monkey-patch" or "patched-jax"
    stats(), clear()                   # counters, and drop every entry
    capacity(), set_capacity(n)        # entries kept (LRU)
    max_bytes(), set_max_bytes(n)      # bytes kept (constants; executables)
    storm_threshold(), set_storm_threshold(n)   # log past n keys per function

Importing this package does not import jax: names load on first use, so the
start-up hook can import it in every process for next to nothing. With
``JAX_CLOSURE_CACHE=1`` in the environment, ``jax.jit`` is patched right when
jax is (or already was) imported.
"""

from __future__ import annotations

import types

from jax_closure_cache import activation as _activation

__version__ = "0.1.0"


# Each public name's module, imported on first use (explicit imports, which
# tests/test_layout.py reads like any other).
def _entrance():
  from jax_closure_cache.front import entrance
  return entrance


def _wrapper():
  from jax_closure_cache.front import wrapper
  return wrapper


def _patching():   # (which loads every layer's stats() row)
  from jax_closure_cache import patching
  return patching


def _cache():
  from jax_closure_cache import cache
  return cache


def _diagnostics():
  from jax_closure_cache import diagnostics
  return diagnostics


# name -> the loader of the submodule that defines it
_PUBLIC = types.MappingProxyType({
    "jit": _entrance,
    "ClosureJitted": _wrapper,
    "stats": _patching,
    "clear": _patching,
    "capacity": _cache,
    "set_capacity": _cache,
    "max_bytes": _cache,
    "set_max_bytes": _cache,
    "storm_threshold": _diagnostics,
    "set_storm_threshold": _diagnostics,
    "enable": _patching,
    "disable": _patching,
    "is_enabled": _patching,
    "enabled": _patching,
    "mode": _patching,
})
# ``jax_closure_cache.lax`` is a submodule: control flow with the cache.

__all__ = sorted([*_PUBLIC, "lax"])


def __getattr__(name: str):
  if name == "lax":
    import jax_closure_cache.lax as value
    _activation.finish_pending()
    return value
  if name not in _PUBLIC:
    raise AttributeError(f"module 'jax_closure_cache' has no attribute {name!r}")
  value = getattr(_PUBLIC[name](), name)
  globals()[name] = value
  _activation.finish_pending()
  return value


def __dir__():
  return sorted({*globals(), *_PUBLIC})


def _enable_from_environment() -> None:
  """``enable()``, unless the installed jax is not a supported release
  (then a warning, and jax.jit stays stock)."""
  from jax_closure_cache import _compat
  if not _compat.versions_match():
    import warnings
    import jax
    warnings.warn(
        f"{_activation.ENV} is set but jax_closure_cache supports only jax "
        f"{_compat.supported_text()}; jax=={jax.__version__} is installed, "
        "so jax.jit is left stock.", stacklevel=3)
    return
  from jax_closure_cache import patching
  patching.enable()


_activation.activate_from_environment(_enable_from_environment)
