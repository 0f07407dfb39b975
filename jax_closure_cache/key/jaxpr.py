"""Jaxprs keyed by their structure, for the closure key's walk.

A ``ClosedJaxpr`` made afresh per call (``jax.make_jaxpr(f)(x)`` handed to
a jitted solver as a static argument) is a new object each time, and stock
hashes it by identity: the solver retraces and compiles every call. Here a
jaxpr is keyed by what it computes: its input types, each equation's
primitive, parameters and operands (variables numbered by first use,
literals by value), its outputs and effects. A closed jaxpr's constants
are walked like any closure's values (arrays lifted), so a jaxpr with equal
structure and other constants hits the same executable with them as
arguments.

Invariants:
* Two jaxprs have equal keys only if they are equal equation by equation:
  parameters compare by value (nested jaxprs by their own keys); a
  parameter that compares by identity (a function, an opaque object) makes
  the jaxpr uncacheable (stock's path), never keyed by an id.
* The key holds no jaxpr and no array: nested constants are keyed by
  value (NumPy bytes), and the rebuild takes the jaxpr of the object being
  called, never the one stored with the entry.
"""

from __future__ import annotations

import enum
import weakref

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache.key import closure
from jax_closure_cache.key import values
from jax_closure_cache.key import parts

# Nested constants larger than this are not read back to be keyed by value.
NESTED_CONST_ELEMENTS = 1 << 12


class JaxprKey:
  """The structure of one jaxpr (``key``), and a weak reference to the
  jaxpr it was read from (for the rebuild, which reads it from the object
  being called)."""
  __slots__ = ("key", "jaxpr")

  def __init__(self, jaxpr):
    self.key = structure(jaxpr)
    self.jaxpr = weakref.ref(jaxpr)

  def __eq__(self, other):
    return type(other) is JaxprKey and self.key == other.key

  def __hash__(self):
    return hash(self.key)

  def __repr__(self):
    jaxpr = self.jaxpr()
    if jaxpr is None:
      return f"<a jaxpr of {len(self.key[1])} equations>"
    text = " ".join(str(jaxpr).split())
    return text if len(text) <= 160 else text[:157] + "..."


def structure(jaxpr) -> tuple:
  """``(input types, equations, outputs, effects)`` of an open jaxpr, with
  variables numbered by first appearance. Raises ``closure.Uncacheable``
  for a parameter that compares by identity."""
  names: dict = {}

  def name(v):
    if isinstance(v, _compat.Literal):
      return ("literal", _aval(v), _param(v.val))
    return names.setdefault(v, len(names))

  binders = tuple((name(v), _aval(v)) for v in
                  (*jaxpr.constvars, *jaxpr.invars))
  eqns = tuple(
      (str(e.primitive), e.primitive,
       tuple(sorted((k, _param(p)) for k, p in e.params.items())),
       tuple(name(v) for v in e.invars),
       tuple((name(v), _aval(v)) for v in e.outvars),
       _param(e.effects))
      for e in jaxpr.eqns)
  outs = tuple(name(v) for v in jaxpr.outvars)
  return (binders, eqns, outs, _param(jaxpr.effects))


def _aval(v):
  return str(v.aval)


def _param(p):
  """A parameter as a hashable value compared by value."""
  t = type(p)
  if p is None or t in (int, float, bool, str, bytes, complex):
    return (t, p)
  if t is tuple or t is list:
    return (t, tuple(_param(x) for x in p))
  if t is dict:
    return (t, tuple(sorted((k, _param(x)) for k, x in p.items())))
  if t is frozenset or t is set:
    items = [_param(x) for x in p]
    try:
      return (frozenset, frozenset(items))
    except TypeError:
      raise closure.Uncacheable("unhashable", "a jaxpr parameter set") from None
  if t is _compat.trace.ClosedJaxpr:   # first: on 0.11 it is Jaxpr itself
    return ("closed", structure(p.jaxpr), tuple(_const(c) for c in p.consts))
  if t is _compat.trace.Jaxpr:
    return ("jaxpr", structure(p))
  if isinstance(p, (np.dtype, enum.Enum, np.generic)):
    return (t, p)
  if isinstance(p, np.ndarray):
    return _const(p)
  h, eq = t.__hash__, t.__eq__
  if h is not None and h is not object.__hash__ and eq is not object.__eq__:
    try:
      hash(p)
      return (t, p)   # a value type (dimension numbers, shardings, ...)
    except TypeError:
      pass
  raise closure.Uncacheable(
      "jaxpr_parameter", f"a jaxpr parameter of type {t.__name__} compares "
      "by identity, so the jaxpr cannot be keyed by its structure")


def _const(c):
  """A nested jaxpr's constant, keyed by its value."""
  size = getattr(c, "size", 1)
  if size > NESTED_CONST_ELEMENTS:
    raise closure.Uncacheable(
        "jaxpr_parameter", f"a nested jaxpr holds a constant of {size} "
        "elements, too large to key by value")
  return parts.numpy_key(np.asarray(c))


def _split_closed(cj):
  return JaxprKey(cj.jaxpr), tuple(cj.consts)


def _join_closed(static: JaxprKey, consts):
  jaxpr = static.jaxpr()
  if jaxpr is None:
    raise AssertionError("rebuilding a jaxpr that no longer exists")
  return _compat.trace.ClosedJaxpr(jaxpr, list(consts))


def _split_open(j):
  return JaxprKey(j), ()


def _join_open(static: JaxprKey, _):
  return static.jaxpr()


values.register_wrapper(_compat.trace.ClosedJaxpr, _split_closed, _join_closed)
if _compat.trace.Jaxpr is not _compat.trace.ClosedJaxpr:   # one class from 0.11 on
  values.register_wrapper(_compat.trace.Jaxpr, _split_open, _join_open)
