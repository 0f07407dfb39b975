"""The options of a jitted function: stock's keywords, ours, and defaults.

``jit(fun, **options)`` takes every keyword of ``jax.jit`` plus
``lift_numpy``. The options become one
:class:`JitSpec`, shared by every wrapper made with them and compared by
identity on the hot path; ``hot_spec()`` is the spec of ``jit(fun)`` with no
options under the current defaults.

Invariants: equal options give the same spec object; a wrong keyword raises
stock's ``TypeError`` before anything is cached; the defaults change only
through ``set_*_default`` (``enable()``), which tells the listeners
(``on_defaults_changed``: the fast fronts, each built for one spec).
"""

from __future__ import annotations

import types
from typing import NamedTuple

from jax_closure_cache import atoms
from jax_closure_cache import cache
from jax_closure_cache import settings
from jax_closure_cache.front import identity

JIT_OPTIONS = frozenset({
    "in_shardings", "out_shardings", "static_argnums", "static_argnames",
    "donate_argnums", "donate_argnames", "keep_unused", "device", "backend",
    "inline", "compiler_options"})


def _freeze(v):
  if isinstance(v, list):
    return tuple(_freeze(x) for x in v)
  if isinstance(v, dict):
    return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
  return v


ARG_SELECTORS = frozenset({"static_argnums", "static_argnames",
                            "donate_argnums", "donate_argnames"})


def donates(options: dict) -> bool:
  """Whether jit ``options`` donate arguments: ``donate_argnums`` or
  ``donate_argnames`` given as one position or name (``0`` included) or
  as a non-empty collection (one without a length: as donating)."""
  return any(_names_some(options.get(name))
             for name in ("donate_argnums", "donate_argnames"))


def _names_some(value) -> bool:
  if value is None:
    return False
  if isinstance(value, (int, str)):
    return True
  try:
    return len(value) > 0
  except TypeError:
    return True


def has_static_arguments(options: dict) -> bool:
  """Whether the jit options name static arguments (their values are then
  passed as they are, not traced)."""
  return "static_argnums" in options or "static_argnames" in options


def gives_static_arguments(options: dict) -> bool:
  """Whether the jit options name at least one static argument (``None``
  and an empty sequence name none)."""
  return any(not (v is None or isinstance(v, (tuple, list)) and not v)
             for v in (options.get("static_argnums"),
                       options.get("static_argnames")))


#: Keywords that ``jit``, ``enable`` and ``enabled`` refuse with a reason.
REMOVED_OPTIONS = types.MappingProxyType({
    "auto_dynamic": (
        "the auto_dynamic option was removed; a closed-over Python int or "
        "float that keeps changing is traced as stock traces it, and its "
        "executable is shared after that stock trace (tier A)"),
})


def reject_keywords(function: str, keywords) -> None:
  """The TypeError for keywords ``function`` does not take, the first
  one's: Python's message, with the reason for a removed option."""
  for name in keywords:
    why = REMOVED_OPTIONS.get(name)
    raise TypeError(f"{function}() got an unexpected keyword argument "
                    f"{name!r}" + (f": {why}" if why else ""))


def check_option_names(options: dict) -> None:
  """Stock's TypeError for a keyword ``jax.jit`` does not take."""
  for name in options:
    if name == "fun":
      raise TypeError("jit() got some positional-only arguments passed as "
                      "keyword arguments: 'fun'")
    if name not in JIT_OPTIONS:
      reject_keywords("jit", (name,))


def options_key(options: dict) -> tuple:
  """Options as a hashable key; ``1`` and ``(1,)`` (or ``"n"`` and
  ``("n",)``) select the same arguments, so they give the same key. Atoms
  by exact type and bits (``atoms.exact_key``): ``(1.0,)``, which stock's
  ``jit()`` rejects, is not ``(1,)``."""
  check_option_names(options)
  try:
    key = tuple(sorted(
        (k, atoms.exact_key(
            (v,) if k in ARG_SELECTORS and isinstance(v, (int, str))
            else _freeze(v), _as_itself))
        for k, v in options.items()))
  except atoms.Inexact as e:   # (a NumPy scalar with dtype metadata)
    raise TypeError(str(e)) from None
  hash(key)   # TypeError here means the options cannot key a cache
  return key


def _as_itself(v):   # jax's shardings, devices, specs: by their own ==
  return v


def shift(argnums):
  """Positional indices after prepending the leaves argument."""
  if argnums is None:
    return None
  if isinstance(argnums, int):
    return argnums + 1 if argnums >= 0 else argnums
  return tuple(i + 1 if i >= 0 else i for i in argnums)



def lifted_options(options: dict, n_args: int) -> dict:
  """The options for stock jit of the lifted function, which takes the
  leaves as a new first argument."""
  shifted = dict(options)
  if "static_argnums" in shifted:
    shifted["static_argnums"] = shift(shifted["static_argnums"])
  if "donate_argnums" in shifted:
    shifted["donate_argnums"] = shift(shifted["donate_argnums"])
  if "in_shardings" in shifted:
    # The leaves' sharding is left unspecified (None): a leaf (never a
    # committed array) is placed as stock places the constant it would
    # have baked. One sharding for every argument is
    # spelled out for the entry's first call; a later call with another
    # number of arguments fails there and is answered by stock.
    user = shifted["in_shardings"]
    if not isinstance(user, (tuple, list)):
      user = (user,) * n_args
    shifted["in_shardings"] = (None, *user)
  return shifted


class JitSpec(NamedTuple):
  """The options of a jitted function, shared by every wrapper made with
  them (one lookup per ``jit()``).

  ``options``: the keywords stock ``jax.jit`` gets (for the lifted function,
  argument numbers shift by one and a user-given ``in_shardings`` gains an
  unspecified sharding for the leaves: ``entries.make_lifted_jit``).
  ``key``: ``(options key, lift_numpy)``, hashable, compared by identity
  on the hot path. ``lift_numpy``: closed-over NumPy arrays are passed as
  arguments. ``table``: the identity rows for these options
  (``identity``).
  """
  options: dict
  key: tuple
  lift_numpy: bool
  table: dict


_specs: dict[tuple, JitSpec] = cache.STORE.table("options.specs",
                                                cache.Store.FACTS)


def spec(options: dict, options_key: tuple, lift_numpy: bool) -> JitSpec:
  """The one spec of these options."""
  key = (options_key, lift_numpy)
  found = _specs.get(key)
  if found is None:
    if len(_specs) >= 1 << 12:   # options built afresh in a loop
      _specs.clear()
    found = _specs.setdefault(key, JitSpec(options, key, lift_numpy,
                                           identity.table(key)))
  return found


def find_spec(key: tuple) -> JitSpec | None:
  return _specs.get(key)


class _Defaults:
  lift_numpy = settings.read(settings.LIFT_NUMPY)


_HOT_SPECS = types.MappingProxyType({n: spec({}, (), n) for n in (False, True)})
# The spec of ``jit(fun)`` without options, for the current defaults.
_hot_spec = cache.STORE.own("options.hot_spec", [_HOT_SPECS[_Defaults.lift_numpy]],
                            cache.Store.REGISTRY)
_listeners: list = cache.STORE.table("options.listeners", cache.Store.REGISTRY,
                                     list)


def hot_spec() -> JitSpec:
  return _hot_spec[0]


def hot_spec_cell() -> list:
  """The one-item list holding the hot spec (``jit``'s hot case reads it
  without a call)."""
  return _hot_spec


def on_defaults_changed(listener) -> None:
  """Call ``listener()`` whenever a default (hence the hot spec) changes."""
  _listeners.append(listener)


def _update_hot_spec() -> None:
  _hot_spec[0] = _HOT_SPECS[_Defaults.lift_numpy]
  for listener in _listeners:
    listener()


def set_lift_numpy_default(value: bool) -> None:
  """Default of ``jit(..., lift_numpy=...)`` (``enable(lift_numpy=...)``).
  Setting the value it has changes nothing (``enabled()`` restores it on
  leaving: the fronts, made for the hot spec, stay)."""
  if bool(value) == _Defaults.lift_numpy:
    return
  _Defaults.lift_numpy = bool(value)
  _update_hot_spec()


def lift_numpy_default() -> bool:
  return _Defaults.lift_numpy
