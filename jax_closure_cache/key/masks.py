"""Python scalars in a key, masked: the key's *structure*.

Auto-dynamic scalars (``auto_dynamic``) compare keys with every Python int
and float replaced by its type: two keys of one structure differ only in
such values, counted in the walk's order (``Analysis.value``'s ordinals).

Invariants: masking never changes a key's non-scalar parts; a scalar passed
as an argument (a ``DYN`` part) masks to its type as a baked one does.
"""

from __future__ import annotations

from jax_closure_cache.key.parts import DYN, SCALAR


def _is_scalar_part(k) -> bool:
  return (type(k) is tuple and len(k) == 2
          and (k[0] is int or k[0] is float or k[0] is DYN))


def _mask(k, scalars: list):
  """``k`` with every int or float part replaced by ``(type, SCALAR)``
  (a dynamic one by its type too), appending the parts to ``scalars`` in
  walk order: the order in which :meth:`Analysis.value` counts them."""
  if _is_scalar_part(k):
    scalars.append(k)
    return (k[1] if k[0] is DYN else k[0], SCALAR)
  if type(k) is tuple:
    return tuple([_mask(x, scalars) for x in k])
  return k


def mask_scalars(key, scalars: list | None = None):
  """``key`` with every Python scalar masked by its type (the key's
  structure); the masked parts are appended to ``scalars`` in walk order."""
  return _mask(key, [] if scalars is None else scalars)


def scalars_that_differ(old_key, new_key) -> "frozenset[int] | None":
  """Ordinals of the Python int/float values that differ between two keys
  equal in everything else (same types at the same positions), or None if
  anything else differs."""
  old_scalars, new_scalars = [], []
  if _mask(old_key, old_scalars) != _mask(new_key, new_scalars):
    return None
  return frozenset(i for i, (a, b) in enumerate(zip(old_scalars, new_scalars))
                   if a != b and a[0] is not DYN and b[0] is not DYN)


def dynamic_ordinals(key) -> frozenset:
  """Ordinals of the scalars ``key`` passes as arguments."""
  scalars: list = []
  _mask(key, scalars)
  return frozenset(i for i, k in enumerate(scalars) if k[0] is DYN)
