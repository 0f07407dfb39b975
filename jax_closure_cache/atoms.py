"""Values by exact type and bits, the one grammar every key of the package
uses for a value it holds as it is.

``1``, ``1.0`` and ``True`` are three keys, as are ``0.0`` and ``-0.0``; a
NaN is its bits; tuples item by item, frozensets element by element
(unordered), ranges and slices by their three ends, a NumPy scalar by its
type, dtype and bytes (:func:`dtype_key`: a datetime's unit, a record's
fields). Standard-library values whose ``==`` forgets what a
trace may read (two aware datetimes equal in UTC) are keyed by their
fields, and a ``Decimal`` (whose arithmetic reads the thread's decimal
context) is refused (:data:`LIBRARY_VALUES`). Anything
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
    return numpy_scalar_key(v)
  if t is frozenset:   # {1} == {True} == {1.0}: its elements' keys
    return (t, frozenset([exact_key(x, other) for x in v]))
  if t is range or t is slice:   # slice(0, 1) == slice(0, 1.0)
    return (t, exact_key((v.start, v.stop, v.step), other))
  return other(v)


class Inexact(Exception):
  """A library value holding what has no exact key (a user's tzinfo)."""


def dtype_key(d: np.dtype) -> tuple:
  """A NumPy dtype by all it says, where ``==`` says less: its scalar type,
  byte order, kind and size with a datetime's unit (``d.str``), and a
  record's fields, offsets and alignment (``d.descr``).

  Raises:
    Inexact: a dtype carrying metadata (``==`` ignores it; what it holds
      is anyone's).
  """
  if d.metadata is not None:
    raise Inexact("a NumPy dtype with metadata")
  if d.names is None and d.subdtype is None:
    return (d.type, d.str)
  return (d.type, d.str, repr(d.descr), d.isalignedstruct)


def numpy_scalar_key(v) -> tuple:
  """A NumPy scalar by its type, :func:`dtype_key` and bytes."""
  return (type(v), dtype_key(v.dtype), v.tobytes())


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


def _decimal(v):
  raise Inexact("a Decimal: its arithmetic reads the thread's decimal "
                "context (its precision and rounding), which no key holds")


#: Standard-library value types whose ``==`` is coarser than what a trace
#: may read of them, each with the fields that say it all (or refusing).
LIBRARY_VALUES = types.MappingProxyType({
    decimal.Decimal: _decimal,
    datetime.datetime: _datetime,
    datetime.time: _time,
})


def library_value_key(v, t) -> tuple:
  """A library value of type ``t`` by its fields where its ``==`` is
  coarser than them (:data:`LIBRARY_VALUES`, a NumPy dtype), else by its
  own ``==``.

  Raises:
    Inexact: a value whose fields hold what has no exact key.
  """
  fields = LIBRARY_VALUES.get(t)
  if fields is not None:
    return (t, fields(v))
  if isinstance(v, np.dtype):   # its unit, fields and metadata
    return (t, dtype_key(v))
  return (t, v)
