"""Every environment variable the package reads, with one parser each kind.

This module imports neither jax nor the rest of the package: ``activation``
reads ``JAX_CLOSURE_CACHE`` through it at every Python start.

| variable | kind | default | what it sets |
|---|---|---|---|
| ``JAX_CLOSURE_CACHE`` | flag | off | enable at start-up (``activation``) |
| ``JAX_CLOSURE_CACHE_EXPLAIN`` | flag | off | log why a call missed or fell back (read at each miss) |
| ``JAX_CLOSURE_CACHE_VERIFY`` | flag | off | verify mode: every hit also traces (or lowers) as stock would and compares |
| ``JAX_CLOSURE_CACHE_LIFT_NUMPY`` | flag | off | default of ``jit(..., lift_numpy=)`` |
| ``JAX_CLOSURE_CACHE_CAPACITY`` | positive int | 1024 | entries per bounded store |
| ``JAX_CLOSURE_CACHE_MAX_BYTES`` | positive int | 2**30 | bytes of captured constants (tier A: of executables) per bounded store |
| ``JAX_CLOSURE_CACHE_STORM_THRESHOLD`` | positive int | 8 | entries per code before the storm warning |

A flag is on for ``1``, ``true``, ``yes``, ``on`` and off for ``0``,
``false``, ``no``, ``off`` (any case, surrounding blanks ignored); unset or
empty means the default. Any other value warns once per variable and means
the default, as does an integer setting that is not a positive integer.
A variable in ``IGNORED`` is not read; set, it warns once, when the cache
is enabled (``warn_ignored``).

Invariants: reading a setting never raises; a garbled value never turns
the cache on.
"""

from __future__ import annotations

import os
import types
from typing import NamedTuple


class Setting(NamedTuple):
  """One environment variable: its name, kind (``flag`` or ``count``),
  default and what it is for (the text of its warning)."""
  name: str
  kind: str
  default: bool | int
  doc: str


ENABLE = Setting("JAX_CLOSURE_CACHE", "flag", False,
                 "enable the cache at start-up")
EXPLAIN = Setting("JAX_CLOSURE_CACHE_EXPLAIN", "flag", False,
                  "explain misses and fallbacks")
VERIFY = Setting("JAX_CLOSURE_CACHE_VERIFY", "flag", False,
                 "check every hit against stock's own trace")
LIFT_NUMPY = Setting("JAX_CLOSURE_CACHE_LIFT_NUMPY", "flag", False,
                     "lift captured NumPy arrays")
CAPACITY = Setting("JAX_CLOSURE_CACHE_CAPACITY", "count", 1024,
                   "entries per bounded store")
MAX_BYTES = Setting("JAX_CLOSURE_CACHE_MAX_BYTES", "count", 1 << 30,
                    "bytes of captured constants (tier A: of executables) per "
                    "bounded store")
STORM_THRESHOLD = Setting("JAX_CLOSURE_CACHE_STORM_THRESHOLD", "count", 8,
                          "entries per code before the storm warning")
ALL = (ENABLE, EXPLAIN, VERIFY, LIFT_NUMPY, CAPACITY, MAX_BYTES,
       STORM_THRESHOLD)

#: Variables the package does not read, with why (the text of their warning).
IGNORED = types.MappingProxyType({
    "JAX_CLOSURE_CACHE_AUTO_DYNAMIC": (
        "auto-dynamic scalars were removed; a closed-over Python int or "
        "float that keeps changing is traced as stock traces it, and its "
        "executable is shared after that stock trace (tier A)"),
})

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})
#: Variables warned about once (held by ``cache.STORE``)
WARNED: set[str] = set()


def _warn_once(setting: Setting, raw: str, expected: str) -> None:
  if setting.name in WARNED:
    return
  WARNED.add(setting.name)
  import warnings
  warnings.warn(f"{setting.name}={raw!r} is not {expected}; using the "
                f"default ({setting.default!r}: {setting.doc}).",
                stacklevel=3)


def warn_ignored() -> None:
  """Warn once per variable of ``IGNORED`` that is set (``enable()``)."""
  for name, why in IGNORED.items():
    raw = os.environ.get(name)
    if raw is None or not raw.strip() or name in WARNED:
      continue   # unset or empty, as for a setting read
    WARNED.add(name)
    import warnings
    warnings.warn(f"{name}={raw!r} is ignored: {why}.", stacklevel=3)


def read(setting: Setting):
  """The setting's value from the environment now (its default when unset,
  empty or garbled; garbled values warn once)."""
  raw = os.environ.get(setting.name)
  value = "" if raw is None else raw.strip().lower()
  if not value:
    return setting.default
  if setting.kind == "flag":
    if value in _ON:
      return True
    if value in _OFF:
      return False
    _warn_once(setting, raw, "one of 1/true/yes/on or 0/false/no/off")
    return setting.default
  try:
    n = int(value)
  except ValueError:
    n = 0
  if n < 1:
    _warn_once(setting, raw, "a positive integer")
    return setting.default
  return n


def table() -> str:
  """The settings as text (``doctor``), with their values now."""
  return "\n".join(f"{s.name}={read(s)!r} ({s.doc}; default {s.default!r})"
                   for s in ALL)
