"""jax-closure-cache: ``jax.jit`` that caches on a closure's contents.

Code that builds a fresh function on every call (a nested ``def``, a lambda in
a loop, ``functools.partial``, a re-wrapped ``jax.grad``) pays a full trace and
XLA compile per call under stock ``jax.jit``, which caches on the function
object. This package keys the cache on the code object plus what the closure
holds, verified free of tracers, and passes closed-over arrays as arguments
to one shared executable.

Public API::

    jit(fun=None, **jax_jit_options)   # closure-aware drop-in for jax.jit
    lax.while_loop, fori_loop, scan, cond, switch, map   # eager, cached
    enable(), disable(), is_enabled(), enabled()   # patch jax.jit globally
    mode()                             # "monkey-patch" or "patched-jax"
    stats(), clear()                   # counters, and drop every entry
    capacity(), set_capacity(n)        # entries kept (LRU)
    storm_threshold(), set_storm_threshold(n)   # log past n keys per function

Importing this package does not import jax: names load on first use, so the
start-up hook can import it in every process for next to nothing. When the
installed jax carries the upstream series (``patches/``), JAX's own trace
lookup is closure-keyed behind its ``jax_closure_cache`` option: ``enable()``
sets that option and installs only the fast front (``jit`` and the control-
flow launchers), which then shares JAX's store. With
``JAX_CLOSURE_CACHE=1`` in the environment, ``jax.jit`` is patched right when
jax is (or already was) imported.
"""

from __future__ import annotations

import importlib

from jax_closure_cache import activation as _activation

__version__ = "0.1.0"

# name -> (submodule that defines it, whether JAX's own copy of that module
# replaces it when the installed jax carries the upstream patch)
_PUBLIC = {
    "jit": ("closure_jit", True),
    "ClosureJitted": ("closure_jit", True),
    "stats": ("cache", True),
    "clear": ("cache", True),
    "capacity": ("cache", True),
    "set_capacity": ("cache", True),
    "storm_threshold": ("diagnostics", True),
    "set_storm_threshold": ("diagnostics", True),
    "enable": ("patching", False),
    "disable": ("patching", False),
    "is_enabled": ("patching", False),
    "enabled": ("patching", False),
    "mode": ("patching", False),
}
# ``jax_closure_cache.lax`` is a submodule: control flow with the cache.

__all__ = sorted([*_PUBLIC, "lax"])


def __getattr__(name: str):
  if name == "lax":
    value = importlib.import_module("jax_closure_cache.lax")
    _activation.finish_pending()
    return value
  if name not in _PUBLIC:
    raise AttributeError(f"module 'jax_closure_cache' has no attribute {name!r}")
  module_name, jax_may_own = _PUBLIC[name]
  if jax_may_own:
    from jax_closure_cache import _compat
    module = _compat.implementation(module_name)
  else:
    module = importlib.import_module(f"jax_closure_cache.{module_name}")
  value = getattr(module, name)
  globals()[name] = value
  _activation.finish_pending()
  return value


def __dir__():
  return sorted({*globals(), *_PUBLIC})


_activation.activate_from_environment()
