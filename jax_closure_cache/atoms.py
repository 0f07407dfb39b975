"""Values by exact type and bits, the one grammar every key of the package
uses for a value it holds as it is.

``1``, ``1.0`` and ``True`` are three keys, as are ``0.0`` and ``-0.0``; a
NaN is its bits; tuples item by item, frozensets element by element
(unordered), ranges and slices by their three ends, a NumPy scalar by its
type and bytes. Standard-library values whose ``==`` forgets what a
trace may read (``Decimal('1.0') == Decimal('1.00')``; two aware datetimes
equal in UTC) are keyed by their fields (:data:`LIBRARY_VALUES`). Anything
else goes to the caller's ``other``: a key never
asks a user class's ``==`` or ``hash``.

Invariants: nothing here calls user code (the types it reads are exact
built-in ones, and ``other`` is called only on what it does not know).
"""

from __future__ import annotations

import datetime
import decimal
import struct
import types
from collections.abc import Callable
from typing import Any

import numpy as np

#: Types keyed by their value as they are.
ATOMS = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})

_DOUBLE = struct.Struct("<d")


def float_key(x: float) -> tuple:
  """``x`` by its bits: ``0.0`` is not ``-0.0``; a NaN is its bits
  (``float.hex`` prints every NaN as ``nan``)."""
  if x == x:
    return (float, x) if x != 0.0 else (float, x.hex())
  return (float, _DOUBLE.pack(x))


def exact_key(v, other: Callable[[Any], Any]) -> Any:
  """``v``'s key by exact type and bits, or ``other(v)`` for a value of
  none of the types above (at any depth of a tuple or frozenset)."""
  t = type(v)
  if t in ATOMS:
    return (t, v)
  if t is float:
    return float_key(v)
  if t is complex:
    return (complex, float_key(v.real), float_key(v.imag))
  if t is tuple:
    return (tuple, tuple([exact_key(x, other) for x in v]))
  if isinstance(v, np.generic):   # np.float32(-0.0) == np.float32(0.0)
    return (t, v.tobytes())
  if t is frozenset:   # {1} == {True} == {1.0}: its elements' keys
    return (t, frozenset([exact_key(x, other) for x in v]))
  if t is range or t is slice:   # slice(0, 1) == slice(0, 1.0)
    return (t, exact_key((v.start, v.stop, v.step), other))
  return other(v)


class Inexact(Exception):
  """A library value holding what has no exact key (a user's tzinfo)."""


def _zone(tz) -> Any:
  """A time zone: ``timezone`` by its offset and name, a ``ZoneInfo`` (one
  object per zone name, immutable) as it is; a user's tzinfo, whose
  methods may read state of its own, is :class:`Inexact`."""
  if tz is None:
    return None
  t = type(tz)
  if t is datetime.timezone:
    return (t, tz.utcoffset(None), tz.tzname(None))
  if t.__module__ == "zoneinfo":
    return (t, tz)
  raise Inexact(f"a datetime with a {t.__name__} time zone")


def _datetime(v) -> tuple:
  return (v.year, v.month, v.day, v.hour, v.minute, v.second,
          v.microsecond, v.fold, _zone(v.tzinfo))


def _time(v) -> tuple:
  return (v.hour, v.minute, v.second, v.microsecond, v.fold,
          _zone(v.tzinfo))


#: Standard-library value types whose ``==`` is coarser than what a trace
#: may read of them, each with the fields that say it all.
LIBRARY_VALUES = types.MappingProxyType({
    decimal.Decimal: decimal.Decimal.as_tuple,   # sign, digits, exponent
    datetime.datetime: _datetime,
    datetime.time: _time,
})


def library_value_key(v, t) -> tuple:
  """A standard-library value of type ``t`` by its fields where its ``==``
  is coarser than them (:data:`LIBRARY_VALUES`), else by its own ``==``.

  Raises:
    Inexact: a value whose fields hold what has no exact key.
  """
  fields = LIBRARY_VALUES.get(t)
  return (t, v) if fields is None else (t, fields(v))
