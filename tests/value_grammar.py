"""Small programs drawn from a grammar of Python values, for the differential
fuzzer ``test_value_grammar.py``.

A *program* is a few *slots* (each a kind of value from the grammar below,
reached by the traced function through a *carrier*), one or two *call
forms* (a transformation and a way of calling), a way of making the top
function, and a sequence of *steps*. Each step re-creates every function
object (as users write: nested ``def``, ``lambda``, ``functools.partial``,
bound methods, ``functools.wraps``) over the step's values and calls it
under each call form. Between steps a slot's value is either the same
object again, a new value of the same shape (often one equal under ``==``
but of another type or sign, or a container in another order), or the same
object changed in place; class attributes read through instances change
too. A cache keyed wrongly answers one step with another step's trace.

The grammar (what the traced function reaches, and how):

* atoms: bool, int, float, complex, huge ints, -0.0, nan, inf, str, bytes,
  None, Ellipsis, NumPy scalars, an ``IntEnum`` member (``== 1``);
* containers: tuple, list, dict (insertion orders differ), set, frozenset,
  OrderedDict, NamedTuple;
* objects: frozen dataclasses with a class attribute, ``unsafe_hash``
  dataclasses, classes whose ``__eq__``/``__hash__`` read part of their
  state, enums with a class attribute, registered pytrees with state
  outside ``tree_flatten`` (and in their aux data), ``register_static``
  objects changed in place, plain and ``__slots__`` objects, class
  attributes read through an instance;
* arrays: NumPy (plain, strided views of a base changed in place, masked,
  0-d; several dtypes), jax (uncommitted, committed, weakly typed 0-d);
* functions: nested, lambda, partial, ``functools.wraps``, bound method,
  an inner ``jax.jit``;
* runtime callbacks (``jax.debug.callback``, ``io_callback``,
  ``pure_callback``) over a fresh object and log per step, and a trace-time
  log (a fresh list per step appended to while tracing);
* special values (a quarter of programs, on a stream of their own): an
  input of subnormals, -0.0 and a NaN, and jax arrays all 1, 0 or -1 at
  some steps, which stock's module bakes and XLA simplifies by;
* a state writer (three programs in ten, on a stream of their own): a part
  whose closure holds a dict holding an array, which it writes to at trace
  time; every trace that runs must write to the user's dict, once.

Carriers: a cell, a lambda's cell, a partial's argument, a default and a
keyword-only default, a module global, an attribute of a (fresh or
long-lived) object, a ``__slots__`` attribute, a bound method's ``self``,
a class attribute read through an instance, a pytree's child, a pytree's
aux data, a static argument of a long-lived jitted function.

Call forms: ``jax.jit``, ``jax.jit(jax.grad)``, ``jax.jit(jax.vmap)``,
``jax.jit(jax.checkpoint)``, a ``jax.custom_jvp`` made inside the closure
(jitted, and under ``grad``), eager ``lax.scan``/``fori_loop``/
``while_loop``/``cond`` with a fresh body, and a fresh function passed as a
static argument of a long-lived jitted function.

Two programs in every ten are *focused* (:data:`FOCUS`): their first slot
is a class drawn programs meet rarely (a dict in another insertion order
each step; a schedule whose later step makes the trace's Python arithmetic
raise), so every budget of ten programs or more meets each.

:func:`generate` draws program ``index`` of a seed (deterministic),
:func:`check` runs it with stock jit and twice with the cache in verify
mode and returns the differences, :func:`shrink` makes a failing program
smaller, and :func:`describe` prints one. From ``tests/``::

    python -c "import value_grammar as g; p = g.generate(0, 17); \\
               print(g.describe(p)); print(g.check(p))"
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import functools
import logging
import random
import types
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

NAN = float("nan")
INF = float("inf")


# ---------------------------------------------------------------------------
# The classes values are made of (module level: the same class objects in
# every step and pass; class attributes are set by each step).

class IntColor(enum.IntEnum):
  R = 1
  G = 2
  B = 3


class Color(enum.Enum):
  R = 1
  G = 2.0
  B = 3


Color.FACTOR = 1.0      # set after creation: a class attribute, not a member
IntColor.FACTOR = 1.0


@dataclasses.dataclass(frozen=True)
class FrozenDC:
  a: typing.Any
  b: typing.Any

  def scaled(self, x):   # reads the class attribute through the instance
    return x * self.SCALE + jnp.copysign(1.0, self.SCALE)


FrozenDC.SCALE = 1.0


@dataclasses.dataclass(eq=True, unsafe_hash=True)
class HashDC:
  a: typing.Any
  b: typing.Any


class PartialEq:
  """Equality and hash read ``a`` alone; the trace reads ``b`` too."""

  def __init__(self, a, b):
    self.a, self.b = a, b

  def __eq__(self, other):
    return type(other) is PartialEq and self.a == other.a

  def __hash__(self):
    return hash(self.a)


@jax.tree_util.register_pytree_node_class
class HiddenPT:
  """A pytree keeping ``hidden`` outside ``tree_flatten`` (lost by a
  flatten/unflatten round trip, read by the trace)."""

  def __init__(self, w, hidden=1.0):
    self.w, self.hidden = w, hidden

  def tree_flatten(self):
    return (self.w,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children)


@jax.tree_util.register_pytree_node_class
class AuxPT:
  """A pytree keeping ``hidden`` in its aux data."""

  def __init__(self, w, hidden=1.0):
    self.w, self.hidden = w, hidden

  def tree_flatten(self):
    return (self.w,), (self.hidden,)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0], aux[0])


class StaticCfg:
  """Registered static (hash and equality by identity), changed in place."""

  def __init__(self, k):
    self.k = k


jax.tree_util.register_static(StaticCfg)


class PlainObj:
  def __init__(self, a, b):
    self.a, self.b = a, b


class SlotObj:
  __slots__ = ("a", "b")

  def __init__(self, a, b):
    self.a, self.b = a, b


class ClsAttrObj:
  SCALE = 1.0

  def __init__(self, a):
    self.a = a


class NT2(typing.NamedTuple):
  a: typing.Any
  b: typing.Any


class CallbackBox:
  """A callback's object: fresh every step, with its own log."""

  def __init__(self, variant, k):
    self.variant, self.k = variant, k
    self.log = []
    log = self.log
    # made outside the trace, closing over this step's log
    self.fn = lambda v: log.append(("pre", _rounded(v)))


class Holder:
  """A carrier's plain object (fresh, or long-lived and re-assigned)."""

  def __init__(self, v):
    self.v = v


class SlotHolder:
  __slots__ = ("v",)

  def __init__(self, v):
    self.v = v


class Applier:
  """A bound method's ``self`` holding the value."""

  def __init__(self, name, use, v, tlog):
    self.name, self.use, self.v, self.tlog = name, use, v, tlog

  def apply(self, x):
    return _use(self.name, self.use, self.v, x, self.tlog)


class Carrier0:
  V = None


class Carrier1:
  V = None


class Carrier2:
  V = None


class Carrier3:
  V = None


CARRIER_CLASSES = (Carrier0, Carrier1, Carrier2, Carrier3)


@jax.tree_util.register_pytree_node_class
class LeafNode:
  """A pytree whose child is the value."""

  def __init__(self, v):
    self.v = v

  def tree_flatten(self):
    return (self.v,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0])


@jax.tree_util.register_pytree_node_class
class AuxNode:
  """A pytree whose aux data is the value (and one array child)."""

  def __init__(self, w, v):
    self.w, self.v = w, v

  def tree_flatten(self):
    return (self.w,), self.v

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0], aux)


class Model:
  """The top function as a bound method."""

  def __init__(self, parts):
    self.parts = parts

  def apply(self, x):
    return {name: part(x) for name, part in self.parts}


# ---------------------------------------------------------------------------
# Helpers the traced functions call.

def _rounded(v):
  return np.round(np.asarray(v, np.float64), 4).tolist()


def summary(v, depth=0):
  """What a trace-time log records of a value: types, reprs of atoms,
  container order, object state; arrays by type only (a lifted array is a
  tracer in the cache's trace)."""
  if depth > 4:
    return "..."
  t = type(v)
  if isinstance(v, jax.Array):
    aval = v.aval
    return ("jax.Array", str(aval.dtype), tuple(aval.shape),
            bool(aval.weak_type))
  if isinstance(v, np.ndarray):
    return (t.__name__, str(v.dtype), v.shape,
            repr(np.ma.getdata(v).tolist()), repr(np.ma.getmask(v).tolist()))
  if isinstance(v, enum.Enum):
    return (t.__name__, v.name, repr(t.FACTOR))
  if (v is None or v is Ellipsis or isinstance(v, np.generic)
      or t in (bool, int, float, complex, str, bytes)):
    return (t.__name__, repr(v))
  if isinstance(v, dict):
    return (t.__name__, tuple((summary(k, depth + 1), summary(e, depth + 1))
                              for k, e in v.items()))
  if isinstance(v, (tuple, list, set, frozenset)):
    return (t.__name__, tuple(summary(e, depth + 1) for e in v))
  if isinstance(v, CallbackBox):
    return (t.__name__, v.variant, repr(v.k))
  if callable(v):
    return ("callable", getattr(v, "__name__", t.__name__))
  if isinstance(v, FrozenDC):
    return (t.__name__, summary(v.a, depth + 1), summary(v.b, depth + 1),
            repr(t.SCALE))
  if isinstance(v, ClsAttrObj):
    return (t.__name__, summary(v.a, depth + 1), repr(t.SCALE))
  names = getattr(t, "__slots__", None) or list(vars(v))
  return (t.__name__, tuple((n, summary(getattr(v, n), depth + 1))
                            for n in names))


def _use(name, use, v, x, tlog):
  """Every carrier's traced function comes here: a trace-time note of what
  the trace sees, then the kind's use of the value."""
  if tlog is not None:
    tlog.append((name, summary(v)))
  return use(v, x)


def _combine(out, y):
  """A function's outputs as one float32 array shaped like ``y``."""
  acc = jnp.zeros_like(y)
  for a in jax.tree_util.tree_leaves(out):
    a = jnp.real(jnp.asarray(a)).astype(jnp.float32)
    acc = acc + (a if a.shape == y.shape else jnp.sum(a))
  return acc


# ---------------------------------------------------------------------------
# How the traced function uses each kind of value: where type, sign, order,
# class state and state outside the flatten all change the answer.

def use_scalar(v, x):
  if isinstance(v, bool):                      # Python dispatch on the type
    return {"b": jnp.where(v, x, -x), "a": jnp.asarray(v)}
  if isinstance(v, complex):
    return {"c": x * v, "a": jnp.asarray(v)}
  out = {"a": jnp.asarray(v), "m": x * v}
  if isinstance(v, float):
    out["s"] = jnp.copysign(1.0, v) * x
  else:
    out["i"] = jnp.arange(3, dtype=jnp.int32) * v
  if isinstance(v, enum.Enum):
    out["e"] = x * 2.0
  return out


def use_lr(v, x):
  """A float hyperparameter that changes every step (a learning-rate
  schedule), without Python dispatch on it: Python arithmetic on it at
  trace time, where float64 against float32 and exceptions (``1.0 / 0.0``)
  matter."""
  return {"m": x * v, "d": x * (1.0 / v), "p": x * (v * v * v)}


def use_count(n, x):
  """An int that changes every step: Python int arithmetic on it (past
  int32 it raises) and a multiplier."""
  return {"i": jnp.arange(3, dtype=jnp.int32) * (n * 1000003), "m": x * n}


def use_text(v, x):
  if isinstance(v, bytes):
    first = v[0] if v else 0
    return {"n": x * len(v) + first, "b": jnp.asarray(len(v) + 1, jnp.uint8)}
  first = ord(v[0]) if v else 0
  return {"n": x * len(v) + first}


def use_index(v, x):
  return {"i": x[v] * 1.0}


def use_optional(v, x):
  if v is None:
    return {"none": x * 0.5}
  return {"m": x * v + jnp.copysign(0.25, v), "a": jnp.asarray(v)}


def use_container(c, x):
  vals = list(c.values()) if isinstance(c, dict) else list(c)
  acc = x * 0.0
  for i, e in enumerate(vals):                 # position-dependent weights
    acc = acc + (i + 1) * (x * e + jnp.copysign(0.125, e))
  out = {"w": acc, "n": jnp.asarray(len(vals))}
  if vals:
    out["arr"] = jnp.asarray(vals)
    out["last"] = jnp.asarray(vals[-1])
  if isinstance(c, dict):   # the keys: their order and their types
    out["k"] = jnp.asarray([ord(k) if isinstance(k, str) else k for k in c],
                           jnp.float32) if c else jnp.zeros((0,))
    out["kt"] = x * sum((i + 1) * (2.0 if isinstance(k, bool) else
                                   3.0 if isinstance(k, float) else 1.0)
                        for i, k in enumerate(c))
  if hasattr(c, "_fields"):
    out["nt"] = x * 3.0
  if isinstance(c, (set, frozenset)):
    out["set"] = x * 5.0
  return out


def use_set(c, x):
  acc = x * 0.0
  for i, e in enumerate(c):                    # iteration order
    acc = acc + (i + 1) * (x * (e if not isinstance(e, str) else ord(e)))
  return {"w": acc, "n": jnp.asarray(len(c)),
          "t": jnp.asarray([isinstance(e, float) for e in c], jnp.int32)
          if c else jnp.zeros((0,), jnp.int32)}


def use_frozen_dc(v, x):
  return {"a": jnp.asarray(v.a), "m": x * v.a + x * v.b * v.SCALE,
          "g": v.scaled(x)}


def use_ab(v, x):
  return {"m": x * v.a + x * (2 * v.b), "a": jnp.asarray(v.a),
          "s": jnp.copysign(1.0, v.b) * x}


def use_enum(v, x):
  out = {"v": x * v.value * type(v).FACTOR, "a": jnp.asarray(v.value),
         "f": jnp.copysign(1.0, v.FACTOR) * x}
  if isinstance(v, int):
    out["i"] = x * 2.0
  return out


def use_pytree(p, x):
  return {"m": x * p.w * p.hidden, "h": jnp.asarray(p.hidden)}


def use_static(s, x):
  return {"m": x * s.k, "a": jnp.asarray(s.k)}


def use_cls_attr(o, x):
  return {"m": x * o.a * o.SCALE, "s": jnp.copysign(1.0, o.SCALE) * x,
          "a": jnp.asarray(o.SCALE)}


def use_numpy(a, x):
  return {"m": x * np.ma.filled(a, 0), "a": jnp.asarray(np.ma.filled(a, 0)),
          "s": x * float(np.sum(a))}


def use_jax(a, x):
  out = {"m": x * a, "a": a * 1}
  if a.dtype == jnp.int32:
    out["i"] = x * 2.0
  return out


def use_fn(fn, x):
  return {"f": fn(x)}


def use_callback(box, x):
  if box.variant == "debug":
    jax.debug.callback(lambda v: box.log.append(("debug", box.k,
                                                 _rounded(v))), x)
    return {"c": x * box.k}
  if box.variant == "debug_pre":
    jax.debug.callback(box.fn, x)
    return {"c": x * box.k}
  if box.variant == "io":
    def io(v):
      box.log.append(("io", box.k, _rounded(v)))
      return np.float32(box.k)
    r = io_callback(io, jax.ShapeDtypeStruct((), jnp.float32), x,
                    ordered=False)
    return {"c": x * r}

  def pure(v):
    box.log.append(("pure", box.k, _rounded(v)))
    return (np.asarray(v) * box.k).astype(np.float32)
  return {"c": jax.pure_callback(pure, jax.ShapeDtypeStruct(x.shape,
                                                            jnp.float32),
                                 x, vmap_method="sequential")}


# ---------------------------------------------------------------------------
# The grammar: kinds of values, with their pools.

SCALARS = (0, 1, 2, -1, 0.0, -0.0, 1.0, 2.0, 0.5, -2.5, 3.25, True, False,
           NAN, INF, -INF, 2 ** 65, -(2 ** 70), 1 + 0j, 0.5 - 1j,
           np.float32(1.0), np.float64(1.0), np.int32(1), np.float32(-0.0),
           IntColor.R)
NUMS = (0, 1, 2, -1, 0.0, -0.0, 1.0, 0.5, 2.5, True, False, NAN, INF)
SCALES = (1.0, 2.0, 0.0, -0.0, 1, True, 0.5, 3.0)
TEXTS = ("a", "ab", "", "b", "ba", b"a", b"ab", b"", b"\x00")
INDICES = (None, Ellipsis, 0, 1, -1, 2, 3, -4, True, False)
OPTIONALS = (None, 1.0, 2, True, -0.0, 0.0, 1)
KEYS = ("a", "b", "c")
DICT_KEYS = ("a", "b", 1, True, 1.0, 2, 2.0, 0, 0.0, -0.0, False)
SET_ELEMS = (0, 8, 16, 1, 9, 0.0, True, 2.0, "a", "b")
FN_SCALARS = (1.0, 2.0, 1, True, -0.0, 0.0, 0.5, 2)
CB_KS = (1.0, 2.0, 0.5, 1)
SCHEDULE_FLOATS = (0.5, 0.25, 0.125, 1.5, 3.0, 0.0, 1e-3, 7.0, 0.1, 2.75)
SCHEDULE_INTS = (1, 2, 3, 4, 6, 2500)


def _same(a, b) -> bool:
  """Identical as values: same type and repr (so 1 vs 1.0, 0.0 vs -0.0
  and the order of containers all differ)."""
  return type(a) is type(b) and repr(a) == repr(b)


def _equalish(a, b) -> bool:
  try:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
      return True
    return bool(a == b)
  except Exception:
    return False


def twin(rng, v, pool):
  """A value of ``pool`` equal to ``v`` under ``==`` (or NaN for NaN) but
  not the same (another type or sign), or None."""
  found = [u for u in pool if _equalish(u, v) and not _same(u, v)]
  return rng.choice(found) if found else None


def _pick_other(rng, v, pool):
  others = [u for u in pool if not _same(u, v)]
  return rng.choice(others) if others else v


def _vary_atom(rng, v, pool):
  if rng.random() < 0.5:
    t = twin(rng, v, pool)
    if t is not None:
      return t
  return _pick_other(rng, v, pool)


class Kind:
  """A kind of value: ``draw(rng)`` a spec, ``vary(rng, spec, inplace)`` a
  new spec of the same shape (``inplace``: one that ``mutate`` can reach
  on the same object), ``make(spec)`` a fresh object, ``mutate(obj, spec)``
  the object changed in place (returns the object to use), ``hook(spec)``
  class state set every step, ``use(value, x)`` the traced use."""

  def __init__(self, name, draw, vary, make, use, mutate=None, hook=None,
               hashable=True):
    self.name, self.draw, self.vary, self.make, self.use = (
        name, draw, vary, make, use)
    self.mutate, self.hook, self.hashable = mutate, hook, hashable


def _scalar_kind(name, pool, use):
  return Kind(name, lambda rng: rng.choice(pool),
              lambda rng, s, inplace: _vary_atom(rng, s, pool),
              lambda s: s, use)


# containers: spec = (ctype, items); dict items are (key, value) pairs

def _draw_items(rng, ctype):
  if ctype == "namedtuple":
    return tuple(rng.choice(NUMS) for _ in range(2))
  if ctype in ("set", "frozenset"):
    return tuple(rng.sample(SET_ELEMS, rng.randint(1, 3)))
  n = rng.randint(0 if ctype in ("tuple", "list") else 1, 3)
  if ctype in ("dict", "odict"):
    if rng.random() < 0.25:
      keys = rng.choice([(1, "a"), (2, 1), (True, 2), (1.0, "b"), (0,),
                         (-0.0, 2)])
    else:
      keys = tuple(rng.sample(KEYS, n))
    return tuple((k, rng.choice(NUMS)) for k in keys)
  return tuple(rng.choice(NUMS) for _ in range(n))


def _vary_items(rng, ctype, items):
  r = rng.random()
  if r < 0.4 and len(items) > 1 and ctype != "namedtuple":
    for _ in range(8):
      perm = list(items)
      rng.shuffle(perm)
      if repr(perm) != repr(list(items)):
        return tuple(perm)                      # another order only
  if r < 0.75 and items:
    i = rng.randrange(len(items))
    if ctype in ("dict", "odict"):
      k, e = items[i]
      t = twin(rng, k, DICT_KEYS) if rng.random() < 0.3 else None
      new = (k, _vary_atom(rng, e, NUMS)) if t is None or any(
          _equalish(t, k2) for k2, _ in items[:i] + items[i + 1:]) else (t, e)
    elif ctype in ("set", "frozenset"):
      new = _vary_atom(rng, items[i], SET_ELEMS)
    else:
      new = _vary_atom(rng, items[i], NUMS)
    return items[:i] + (new,) + items[i + 1:]
  return _draw_items(rng, ctype)


def _make_container(spec):
  ctype, items = spec
  if ctype == "tuple":
    return tuple(items)
  if ctype == "list":
    return list(items)
  if ctype == "namedtuple":
    return NT2(*items)
  if ctype == "dict":
    return dict(items)
  if ctype == "odict":
    return collections.OrderedDict(items)
  if ctype == "set":
    return set(items)
  return frozenset(items)


def _mutate_container(obj, spec):
  ctype, items = spec
  if ctype == "list":
    obj[:] = items
  elif ctype in ("dict", "odict"):
    obj.clear()
    obj.update(items)
  elif ctype == "set":
    obj.clear()
    obj.update(items)
  else:
    return _make_container(spec)
  return obj


def _container_kind(ctype):
  use = use_set if ctype in ("set", "frozenset") else use_container
  mutable = ctype in ("list", "dict", "odict", "set")
  return Kind(ctype, lambda rng: (ctype, _draw_items(rng, ctype)),
              lambda rng, s, inplace: (ctype, _vary_items(rng, ctype, s[1])),
              _make_container, use,
              mutate=_mutate_container if mutable else None,
              hashable=not mutable)


# objects: spec = (a, b, class-level value) and the like

def _vary_ab(rng, spec, inplace, pool_c=None):
  a, b, c = spec
  r = rng.random()
  if pool_c is not None and (inplace or r < 0.5):
    return (a, b, _vary_atom(rng, c, pool_c))   # class state only
  if r < 0.75:
    return (_vary_atom(rng, a, NUMS), b, c)
  return (a, _vary_atom(rng, b, NUMS), c)


def _draw_ab(rng, pool_c=None):
  return (rng.choice(NUMS), rng.choice(NUMS),
          rng.choice(pool_c) if pool_c else None)


def _set_ab(obj, spec):
  obj.a, obj.b = spec[0], spec[1]
  return obj


def _frozen_mutate(obj, spec):
  if (obj.a, obj.b) == (spec[0], spec[1]) and _same(obj.a, spec[0]) and \
      _same(obj.b, spec[1]):
    return obj                                   # the class attribute moved
  return FrozenDC(spec[0], spec[1])


def _frozen_hook(spec):
  FrozenDC.SCALE = spec[2]


def _cls_attr_hook(spec):
  ClsAttrObj.SCALE = spec[2]


def _cls_attr_mutate(obj, spec):
  obj.a = spec[0]
  return obj


def _partial_eq_vary(rng, spec, inplace):
  a, b, c = spec
  if rng.random() < 0.6:
    return (a, _vary_atom(rng, b, NUMS), c)     # only what __eq__ ignores
  return (_vary_atom(rng, a, NUMS), b, c)


def _draw_enum(rng):
  return (rng.choice(["Color", "IntColor"]), rng.choice("RGB"),
          rng.choice(SCALES))


def _vary_enum(rng, spec, inplace):
  cls, member, factor = spec
  if inplace or rng.random() < 0.5:
    return (cls, member, _vary_atom(rng, factor, SCALES))
  if rng.random() < 0.5:
    return ("IntColor" if cls == "Color" else "Color", member, factor)
  return (cls, _pick_other(rng, member, "RGB"), factor)


def _enum_hook(spec):
  globals()[spec[0]].FACTOR = spec[2]


def _make_enum(spec):
  return globals()[spec[0]][spec[1]]


W_POOL = ((1.0, 2.0, 3.0), (0.5, -1.0, 0.0), (1.0, 1.0, 1.0))
HIDDEN = (1.0, 2.0, -0.0, 0.0, 1, True, 0.5)


def _draw_pt(rng):
  return (rng.choice(W_POOL), rng.choice(HIDDEN))


def _vary_pt(rng, spec, inplace):
  w, h = spec
  if inplace or rng.random() < 0.6:
    return (w, _vary_atom(rng, h, HIDDEN))
  return (_pick_other(rng, w, W_POOL), h)


def _pt_maker(cls):
  return lambda spec: cls(jnp.asarray(spec[0], jnp.float32), spec[1])


def _pt_mutate(obj, spec):
  obj.w = jnp.asarray(spec[0], jnp.float32)
  obj.hidden = spec[1]
  return obj


def _static_mutate(obj, spec):
  obj.k = spec
  return obj


# arrays: spec = (variant, dtype, values, mask)

NP_VALUES = ((1.0, 2.0, 3.0), (0.0, -0.0, 1.0), (1.0, 1.0, 1.0),
             (2.0, 0.5, -1.0))
NP_DTYPES = ("float32", "float64", "int32", "bool")


def _draw_np(rng):
  variant = rng.choice(["plain", "view", "masked", "0d"])
  return (variant, rng.choice(NP_DTYPES), rng.choice(NP_VALUES),
          tuple(rng.random() < 0.3 for _ in range(3)))


def _vary_np(rng, spec, inplace):
  variant, dtype, values, mask = spec
  r = rng.random()
  if r < 0.4:
    return (variant, dtype, _pick_other(rng, values, NP_VALUES), mask)
  if r < 0.7 and variant == "masked":
    return (variant, dtype, values, tuple(not m for m in mask))
  if inplace:
    return (variant, dtype, _pick_other(rng, values, NP_VALUES), mask)
  return (variant, _pick_other(rng, dtype, NP_DTYPES), values, mask)


def _make_np(spec):
  variant, dtype, values, mask = spec
  data = np.asarray(values, np.float64).astype(dtype)
  if variant == "plain":
    return data
  if variant == "0d":
    return np.asarray(data[1])
  if variant == "masked":
    return np.ma.masked_array(data, mask=mask)
  base = np.zeros(6, dtype)           # a strided view of a larger base
  view = base[::2]
  view[...] = data
  return view


def _mutate_np(obj, spec):
  variant, dtype, values, mask = spec
  if obj.dtype != np.dtype(dtype) or variant == "0d":
    return _make_np(spec)
  obj[...] = np.asarray(values, np.float64).astype(dtype)
  if variant == "masked":
    obj.mask = mask
  return obj


JAX_VALUES = ((1.0, 2.0, 3.0), (0.0, -0.0, 1.0), (2.0, 2.0, 2.0))


def _draw_jax(rng):
  return (rng.choice(["vec", "vec", "weak0d", "strong0d"]),
          rng.choice(["float32", "int32"]), rng.choice(JAX_VALUES),
          rng.random() < 0.3)


def _vary_jax(rng, spec, inplace):
  variant, dtype, values, committed = spec
  r = rng.random()
  if r < 0.4:
    return (variant, dtype, _pick_other(rng, values, JAX_VALUES), committed)
  if r < 0.6:
    return (variant, dtype, values, not committed)
  if r < 0.8 and variant != "vec":
    return ("weak0d" if variant == "strong0d" else "strong0d", dtype, values,
            committed)
  return (variant, _pick_other(rng, dtype, ("float32", "int32")), values,
          committed)


def _make_jax(spec):
  variant, dtype, values, committed = spec
  if variant == "vec":
    a = jnp.asarray(values, dtype)
  elif variant == "weak0d":   # a Python scalar made an array: weakly typed
    a = jnp.asarray(float(values[1]) if dtype == "float32"
                    else int(values[1]))
  else:
    a = jnp.asarray(values[1], dtype)
  if committed:
    a = jax.device_put(a, jax.devices()[0])
  return a


# functions: spec = (variant, s)

def _mul(s, y):
  return y * s + jnp.copysign(0.5, s)


def _make_scale(s):
  def scale(y):
    return y * s + jnp.copysign(0.5, s)
  return scale


class Scaler:
  def __init__(self, s):
    self.s = s

  def apply(self, y):
    return y * self.s + jnp.copysign(0.5, self.s)


FN_VARIANTS = ("nested", "lambda", "partial", "wraps", "bound", "jitted")


def _make_fn(spec):
  variant, s = spec
  if variant == "nested":
    return _make_scale(s)
  if variant == "lambda":
    return lambda y: y * s + jnp.copysign(0.5, s)
  if variant == "partial":
    return functools.partial(_mul, s)
  if variant == "wraps":
    inner = _make_scale(s)

    @functools.wraps(_mul)
    def wrapped(y):
      return inner(y)
    return wrapped
  if variant == "bound":
    return Scaler(s).apply
  return jax.jit(_make_scale(s))


def _vary_fn(rng, spec, inplace):
  variant, s = spec
  r = rng.random()
  if r < 0.6:
    return (variant, _vary_atom(rng, s, FN_SCALARS))
  if r < 0.8:
    return (_pick_other(rng, variant, FN_VARIANTS), s)
  return (rng.choice(FN_VARIANTS), rng.choice(FN_SCALARS))


CB_VARIANTS = ("debug", "debug_pre", "io", "pure")


def _vary_cb(rng, spec, inplace):
  variant, k = spec
  if rng.random() < 0.6:
    return (variant, k)            # the same value: still a fresh object
  return (variant, _vary_atom(rng, k, CB_KS))


KINDS = {k.name: k for k in [
    _scalar_kind("scalar", SCALARS, use_scalar),
    Kind("lr", lambda rng: rng.choice(SCHEDULE_FLOATS),
         lambda rng, v, inplace: _pick_other(rng, v, SCHEDULE_FLOATS),
         lambda s: s, use_lr),
    Kind("count", lambda rng: rng.choice(SCHEDULE_INTS),
         lambda rng, v, inplace: _pick_other(rng, v, SCHEDULE_INTS),
         lambda s: s, use_count),
    _scalar_kind("text", TEXTS, use_text),
    _scalar_kind("index", INDICES, use_index),
    _scalar_kind("optional", OPTIONALS, use_optional),
    *[_container_kind(c) for c in ("tuple", "list", "namedtuple", "dict",
                                   "odict", "set", "frozenset")],
    Kind("frozen_dc", lambda rng: _draw_ab(rng, SCALES),
         lambda rng, s, inplace: _vary_ab(rng, s, inplace, SCALES),
         lambda s: FrozenDC(s[0], s[1]), use_frozen_dc,
         mutate=_frozen_mutate, hook=_frozen_hook),
    Kind("hash_dc", _draw_ab, lambda rng, s, inplace: _vary_ab(rng, s, inplace),
         lambda s: HashDC(s[0], s[1]), use_ab, mutate=_set_ab),
    Kind("partial_eq", _draw_ab, _partial_eq_vary,
         lambda s: PartialEq(s[0], s[1]), use_ab),
    Kind("enum", _draw_enum, _vary_enum, _make_enum, use_enum,
         mutate=lambda obj, s: _make_enum(s), hook=_enum_hook),
    Kind("pytree_hidden", _draw_pt, _vary_pt, _pt_maker(HiddenPT), use_pytree,
         mutate=_pt_mutate, hashable=False),
    Kind("pytree_aux", _draw_pt, _vary_pt, _pt_maker(AuxPT), use_pytree,
         mutate=_pt_mutate, hashable=False),
    Kind("static_obj", lambda rng: rng.choice(HIDDEN),
         lambda rng, s, inplace: _vary_atom(rng, s, HIDDEN),
         StaticCfg, use_static, mutate=_static_mutate),
    Kind("plain", _draw_ab, lambda rng, s, inplace: _vary_ab(rng, s, inplace),
         lambda s: PlainObj(s[0], s[1]), use_ab, mutate=_set_ab),
    Kind("slots", _draw_ab, lambda rng, s, inplace: _vary_ab(rng, s, inplace),
         lambda s: SlotObj(s[0], s[1]), use_ab, mutate=_set_ab),
    Kind("cls_attr", lambda rng: _draw_ab(rng, SCALES),
         lambda rng, s, inplace: _vary_ab(rng, s, inplace, SCALES),
         lambda s: ClsAttrObj(s[0]), use_cls_attr, mutate=_cls_attr_mutate,
         hook=_cls_attr_hook),
    Kind("numpy", _draw_np, _vary_np, _make_np, use_numpy, mutate=_mutate_np,
         hashable=False),
    Kind("jax", _draw_jax, _vary_jax, _make_jax, use_jax, hashable=False),
    Kind("fn", lambda rng: (rng.choice(FN_VARIANTS), rng.choice(FN_SCALARS)),
         _vary_fn, _make_fn, use_fn),
    Kind("callback", lambda rng: (rng.choice(CB_VARIANTS), rng.choice(CB_KS)),
         _vary_cb, None, use_callback, hashable=False),
]}

# how often each kind is drawn
KIND_WEIGHTS = {
    "scalar": 6, "lr": 2, "count": 1, "text": 1, "index": 1, "optional": 1, "tuple": 1, "list": 1,
    "namedtuple": 1, "dict": 3, "odict": 1, "set": 1, "frozenset": 1,
    "frozen_dc": 2, "hash_dc": 1, "partial_eq": 1, "enum": 2,
    "pytree_hidden": 2, "pytree_aux": 1, "static_obj": 1, "plain": 1,
    "slots": 1, "cls_attr": 2, "numpy": 2, "jax": 2, "fn": 2, "callback": 3,
}

CARRIERS = ("cell", "lambda", "partial", "default", "kwdefault", "global",
            "attr", "slots_attr", "method", "class_attr", "pytree_leaf",
            "pytree_aux", "static_value")
FORMS = ("jit", "grad", "vmap", "checkpoint", "custom_jvp", "scan", "fori",
         "while", "cond", "static_fn")
# eager scan, cond and vmap cost the most to compile (stock compiles every
# step's fresh function): drawn less often
FORM_WEIGHTS = (4, 3, 1, 2, 2, 1, 2, 2, 1, 3)
TOPS = ("def", "lambda", "partial", "method", "wraps")
XS = ((0.3, -1.2, 2.0), (1.5, 0.25, -0.5), (-2.0, -0.5, 1.0))


# ---------------------------------------------------------------------------
# Programs.

@dataclasses.dataclass
class Slot:
  kind: str
  carrier: str
  long_lived: bool          # the carrier's holder lives across steps
  specs: list               # per step
  actions: list             # per step: "new", "same" or "mutate"


@dataclasses.dataclass
class Program:
  seed: int
  index: int
  forms: list
  top: str
  x: tuple
  trace_log: bool
  slots: list
  # a part writing at trace time to a dict its closure holds beside an
  # array (:func:`_state_writer`); drawn on its own stream
  state_writer: bool = False

  @property
  def steps(self) -> int:
    return len(self.slots[0].specs)


def _hashable(kind, spec) -> bool:
  if not KINDS[kind].hashable:
    return False
  try:
    hash(KINDS[kind].make(spec))
    return True
  except Exception:
    return False


def generate(seed: int, index: int) -> Program:
  """Program ``index`` of ``seed`` (the same for the same pair)."""
  rng = random.Random(f"value-grammar:{seed}:{index}")
  forms = [rng.choices(FORMS, FORM_WEIGHTS)[0]]
  if rng.random() < 0.25:
    forms.append(rng.choice([f for f in FORMS if f != forms[0]]))
  n_steps = rng.randint(3, 4)
  names, weights = zip(*KIND_WEIGHTS.items())
  slots = []
  for _ in range(rng.choice([1, 2, 2, 3])):
    kind = rng.choices(names, weights)[0]
    k = KINDS[kind]
    spec = k.draw(rng)
    if kind == "callback" and "grad" in forms:   # no JVP for the others
      spec = ("debug" if spec[0] in ("io", "pure") else spec[0], spec[1])
    carrier = rng.choice(CARRIERS)
    if carrier == "static_value" and not _hashable(kind, spec):
      carrier = "cell"
    specs, actions = [spec], ["new"]
    for _ in range(n_steps - 1):
      r = rng.random()
      mutable = k.mutate is not None
      if r < 0.2 and len(specs) >= 2:
        action, new = "new", specs[-2]           # back to an earlier value
      elif r < 0.4:
        action, new = "same", spec
      elif r < 0.6 and mutable and carrier != "static_value":
        action, new = "mutate", k.vary(rng, spec, True)
      else:
        action, new = "new", k.vary(rng, spec, False)
      if carrier == "static_value" and not _hashable(kind, new):
        action, new = "same", spec
      specs.append(new)
      actions.append(action)
      spec = new
    slots.append(Slot(kind, carrier, rng.random() < 0.4, specs, actions))
  program = Program(seed, index, forms, rng.choice(TOPS), rng.choice(XS),
                     rng.random() < 0.5, slots)
  focus = FOCUS.get(index % FOCUS_PERIOD)
  if focus is not None:   # its own generator: other programs stay the same
    focus(random.Random(f"value-grammar-focus:{seed}:{index}"), program)
  # its own generator too: every other draw of a program stays as it was
  program.state_writer = random.Random(
      f"value-grammar-state:{seed}:{index}").random() < STATE_WRITERS
  _special_values(random.Random(f"value-grammar-special:{seed}:{index}"),
                  program)
  return program


#: The share of programs drawn with values XLA simplifies by
#: (:func:`_special_values`).
SPECIAL = 0.25
#: Inputs stock's module returns bit for bit through an operation XLA
#: removes (``x * 1``, ``x + 0``), where a runtime operation flushes the
#: subnormal, makes -0.0 + 0.0 a 0.0 or gives the NaN another sign.
SPECIAL_XS = ((1e-39, -0.0, 2.0), (-0.0, 1e-39, float("nan")))
#: A closed-over jax array's values XLA removes an operation by.
SPECIAL_JAX_VALUES = ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (-1.0, -1.0, -1.0))


def _special_values(rng, program) -> None:
  """For a share of programs (:data:`SPECIAL`): an input of subnormals,
  -0.0 or a NaN, and jax arrays whose values are all 1, 0 or -1 at some
  steps, where stock's module bakes the array and XLA removes ``x * a``
  or ``x + a`` by its value, and a cache passing it as an argument would
  not."""
  if rng.random() >= SPECIAL:
    return
  program.x = rng.choice(SPECIAL_XS)
  for slot in program.slots:
    if slot.kind != "jax":
      continue
    values = rng.choice(SPECIAL_JAX_VALUES)
    for step, spec in enumerate(slot.specs):
      if rng.random() < 0.5 and slot.actions[step] == "new":
        slot.specs[step] = (spec[0], spec[1], values, spec[3])


#: The share of programs with a state writer (:func:`_state_writer`).
STATE_WRITERS = 0.3


# ---------------------------------------------------------------------------
# Focused programs: classes a drawn program meets rarely (a dict's values in
# another insertion order, a schedule reaching a value Python's arithmetic
# raises on), made the first slot of every program whose index is one
# residue modulo FOCUS_PERIOD, so every budget of FOCUS_PERIOD programs or
# more meets each. The rest of the program stays as drawn.

FOCUS_PERIOD = 10


def _focus_dict_order(rng, program):
  """A dict of three keys whose values come back in another insertion
  order from step to step (fresh objects, or the same dict refilled)."""
  items = tuple((k, rng.choice(NUMS)) for k in rng.sample(KEYS, 3))
  orders = [items, items[::-1], items[1:] + items[:1]]
  long_lived = rng.random() < 0.4
  carrier = rng.choice(("cell", "lambda", "partial", "default", "global",
                        "attr", "pytree_leaf", "pytree_aux"))
  specs = [("dict", orders[step % 3]) for step in range(program.steps)]
  actions = ["new"] + ["mutate" if long_lived else "new"] * (
      program.steps - 1)
  program.slots[0] = Slot("dict", carrier, long_lived, specs, actions)


def _focus_raising_schedule(rng, program):
  """A schedule (a float hyperparameter, or an int count) whose later step
  makes the trace's Python arithmetic raise (``1.0 / 0.0``, an int past
  int32) after steps that trace, through a carrier the key reads, under
  ``jit`` or ``grad`` and with no trace-time log."""
  if rng.random() < 0.6:
    kind, pool, trigger = "lr", [v for v in SCHEDULE_FLOATS if v], 0.0
  else:
    kind, pool, trigger = "count", [n for n in SCHEDULE_INTS
                                    if n < 1000], 2500
  first, second = rng.sample(pool, 2)
  specs = ([first, second, trigger] + [first])[:program.steps]
  program.slots[0] = Slot(kind, rng.choice(("cell", "default", "global",
                                           "attr", "lambda")),
                          False, specs, ["new"] * program.steps)
  program.forms = [rng.choice(("jit", "grad"))]
  program.trace_log = False


FOCUS = types.MappingProxyType({3: _focus_dict_order,
                                8: _focus_raising_schedule})


def _floaty(v) -> bool:
  if type(v) is float:
    return True
  if isinstance(v, (tuple, list)):
    return any(_floaty(e) for e in v)
  return False


def tolerant(program: Program) -> bool:
  """Whether a Python float is drawn anywhere (used as a multiplier: tier
  A passes a changed float literal to the shared executable as an argument,
  where XLA may fold stock's constant: the last ulp can differ)."""
  return any(_floaty(s) for slot in program.slots for s in slot.specs)


def describe(program: Program) -> str:
  lines = [f"program {program.index} of seed {program.seed}: forms "
           f"{program.forms}, top {program.top!r}, x={program.x}, "
           f"trace log {'on' if program.trace_log else 'off'}, state "
           f"writer {'on' if program.state_writer else 'off'}"]
  for i, s in enumerate(program.slots):
    steps = ", ".join(f"{a}:{spec!r}" for a, spec in zip(s.actions, s.specs))
    lines.append(f"  s{i}: {s.kind} via {s.carrier}"
                 f"{' (long-lived holder)' if s.long_lived else ''}: {steps}")
  return "\n".join(lines)


# ---------------------------------------------------------------------------
# Running a program.

G0 = G1 = G2 = G3 = None


def _global_reader(i, name, use, tlog):
  if i == 0:
    return lambda x: _use(name, use, G0, x, tlog)
  if i == 1:
    return lambda x: _use(name, use, G1, x, tlog)
  if i == 2:
    return lambda x: _use(name, use, G2, x, tlog)
  return lambda x: _use(name, use, G3, x, tlog)


def _apply_static(name, use, v, x):
  return _use(name, use, v, x, None)


def _apply_fn(fn, x):
  return fn(x)


def _fresh(f):
  return types.FunctionType(f.__code__, f.__globals__, f.__name__,
                            f.__defaults__, f.__closure__)


class PassState:
  """What lives across the steps of one pass: long-lived jitted functions
  (made with whatever ``jax.jit`` is now), mutated values and holders."""

  def __init__(self, program):
    # fresh function objects: stock's caches (keyed on the function and
    # its static arguments' hash and equality) must not carry one pass's
    # or program's traces into the next
    self.apply_static = jax.jit(_fresh(_apply_static),
                                static_argnums=(0, 1, 2))
    self.apply_fn = jax.jit(_fresh(_apply_fn), static_argnums=0)
    self.values = {}
    self.holders = {}


def _value(state, program, i, step, boxes):
  slot = program.slots[i]
  k = KINDS[slot.kind]
  spec = slot.specs[step]
  if slot.kind == "callback":            # always a fresh object and log
    box = CallbackBox(spec[0], spec[1])
    boxes.append(box)
    return box
  action = slot.actions[step]
  if action == "same" and i in state.values:
    v = state.values[i]
  elif action == "mutate" and i in state.values:
    v = k.mutate(state.values[i], spec)
  else:
    v = k.make(spec)
  state.values[i] = v
  if k.hook is not None:
    k.hook(spec)
  return v


def _part(state, program, i, v, tlog):
  """A fresh function of ``x`` reaching the value ``v`` through slot ``i``'s
  carrier."""
  slot = program.slots[i]
  use = KINDS[slot.kind].use
  name = f"s{i}"
  c = slot.carrier
  if c == "cell":
    def part(x):
      return _use(name, use, v, x, tlog)
    return part
  if c == "lambda":
    return lambda x: _use(name, use, v, x, tlog)
  if c == "partial":
    return functools.partial(_use, name, use, v, tlog=tlog)
  if c == "default":
    def part(x, v=v):
      return _use(name, use, v, x, tlog)
    return part
  if c == "kwdefault":
    def part(x, *, v=v):
      return _use(name, use, v, x, tlog)
    return part
  if c == "global":
    globals()[f"G{i}"] = v
    return _global_reader(i, name, use, tlog)
  if c in ("attr", "slots_attr"):
    cls = Holder if c == "attr" else SlotHolder
    h = state.holders.get(i) if slot.long_lived else None
    if h is None:
      h = state.holders[i] = cls(v)
    h.v = v
    return lambda x: _use(name, use, h.v, x, tlog)
  if c == "method":
    h = state.holders.get(i) if slot.long_lived else None
    if h is None:
      h = state.holders[i] = Applier(name, use, v, tlog)
    h.v, h.tlog = v, tlog
    return h.apply
  if c == "class_attr":
    cls = CARRIER_CLASSES[i]
    cls.V = v
    inst = cls()
    return lambda x: _use(name, use, inst.V, x, tlog)
  if c == "pytree_leaf":
    node = LeafNode(v)
    return lambda x: _use(name, use, node.v, x, tlog)
  if c == "pytree_aux":
    node = AuxNode(jnp.ones(3, jnp.float32), v)
    return lambda x: _use(name, use, node.v, x, tlog) | {"w": x * node.w}
  ap = state.apply_static                 # static_value
  return lambda x: ap(name, use, v, x)


def _state_writer(step, writers):
  """A part whose closure holds a dict holding an array (which a lifted
  trace rebuilds, as a copy) and a count it increments at trace time, and a
  plain list each trace appends to (which it does not rebuild): a trace of
  the user's function leaves the count equal to the list's length. Each
  ``(dict, list)`` is recorded in ``writers``."""
  box = {"w": jnp.full(3, 0.5 + step % 2, jnp.float32), "n": 0}
  seen = []
  writers.append((box, seen))

  def part(x):
    box["n"] += 1
    seen.append(1)
    return x * box["w"]
  return part


def _top(kind, parts):
  if kind == "def":
    def f(x):
      return {name: part(x) for name, part in parts}
    return f
  if kind == "lambda":
    return lambda x: {name: part(x) for name, part in parts}
  if kind == "partial":
    return functools.partial(_call_parts, parts)
  if kind == "method":
    return Model(parts).apply

  @functools.wraps(_call_parts)
  def wrapped(x):
    return {name: part(x) for name, part in parts}
  return wrapped


def _call_parts(parts, x):
  return {name: part(x) for name, part in parts}


def _form(form, state, make, x):
  if form == "jit":
    return jax.jit(make())(x)
  if form == "grad":
    f = make()
    return jax.jit(jax.grad(lambda y: _combine(f(y), y).sum()))(x)
  if form == "vmap":
    return jax.jit(jax.vmap(make()))(jnp.stack([x, x[::-1] * 0.5]))
  if form == "checkpoint":
    return jax.jit(jax.checkpoint(make()))(x)
  if form == "custom_jvp":
    f = make()

    def g(y):
      # made inside the closure, at every trace of g (the rule reads f
      # itself: h is no cell of g's)
      def h_jvp(primals, tangents):
        (z,), (t,) = primals, tangents
        out = _combine(f(z), z)
        return out, t * jnp.cos(out)
      h = jax.custom_jvp(lambda z: _combine(f(z), z))
      h.defjvp(h_jvp)
      return h(y)
    return jax.jit(g)(x), jax.jit(jax.grad(lambda y: g(y).sum()))(x)
  if form == "scan":
    f = make()
    return jax.lax.scan(lambda c, _: (c * 0.5 + 0.25 * _combine(f(c), c),
                                      f(c)), x, None, length=2)
  if form == "fori":
    f = make()
    return jax.lax.fori_loop(
        0, 2, lambda i, c: c * 0.5 + 0.25 * _combine(f(c), c), x)
  if form == "while":
    f = make()
    return jax.lax.while_loop(
        lambda s: s[0] < 2,
        lambda s: (s[0] + 1, s[1] * 0.5 + 0.25 * _combine(f(s[1]), s[1])),
        (0, x))
  if form == "cond":
    f = make()
    return jax.lax.cond(jnp.sum(x) > 0, f,
                        lambda y: jax.tree_util.tree_map(jnp.zeros_like,
                                                         f(y)), x)
  return state.apply_fn(make(), x)       # static_fn


@dataclasses.dataclass
class Raised:
  """An outcome that is an exception (compared by type)."""
  type: type
  message: str

  def __repr__(self):
    return f"raised {self.type.__name__}: {self.message[:160]}"


@dataclasses.dataclass
class StepOutcome:
  results: dict             # form -> pytree of arrays, or Raised
  trace_log: list | None
  callback_logs: list       # per callback box of the step
  # per state writer made in the step: (its dict's count, its list's length)
  writes: list = dataclasses.field(default_factory=list)


def run_pass(program: Program) -> list:
  """Every step of the program once, with whatever ``jax.jit`` and
  ``jax.lax`` are now, on fresh function objects."""
  state = PassState(program)
  # every pass starts from the same class state (an enum step sets its
  # class's FACTOR; the other class keeps what an earlier pass left)
  Color.FACTOR = IntColor.FACTOR = 1.0
  x = jnp.asarray(program.x, jnp.float32)
  records = []
  for step in range(program.steps):
    tlog = [] if program.trace_log else None
    boxes, writers = [], []
    values = [_value(state, program, i, step, boxes)
              for i in range(len(program.slots))]

    def make():
      parts = tuple((f"s{i}", _part(state, program, i, v, tlog))
                    for i, v in enumerate(values))
      if program.state_writer:
        parts += (("w", _state_writer(step, writers)),)
      return _top(program.top, parts)
    results = {}
    for form in program.forms:
      try:
        results[form] = jax.block_until_ready(_form(form, state, make, x))
      except Exception as e:   # noqa: BLE001: compared with stock's
        results[form] = Raised(type(e), str(e))
    jax.effects_barrier()
    records.append((results, tlog, boxes, writers))
  jax.effects_barrier()
  # logs read at the end: a later step running an earlier callback shows
  return [StepOutcome(r, None if t is None else list(t),
                      [list(b.log) for b in boxes],
                      [(box["n"], len(seen)) for box, seen in writers])
          for r, t, boxes, writers in records]


# ---------------------------------------------------------------------------
# The oracle.

def _leaf_difference(g, w, rtol):
  if not (hasattr(g, "dtype") and hasattr(w, "dtype")):
    return None if type(g) is type(w) and repr(g) == repr(w) else \
        f"{g!r} against {w!r}"
  if (g.shape, g.dtype) != (w.shape, w.dtype):
    return f"{g.dtype}{list(g.shape)} against {w.dtype}{list(w.shape)}"
  if getattr(g, "weak_type", None) != getattr(w, "weak_type", None):
    return f"weak_type {g.weak_type} against {w.weak_type} ({g.dtype})"
  if getattr(g, "sharding", None) != getattr(w, "sharding", None):
    return f"sharding {g.sharding} against {w.sharding}"
  if getattr(g, "committed", None) != getattr(w, "committed", None):
    return f"committed {g.committed} against {w.committed}"
  a, b = np.asarray(g), np.asarray(w)
  if a.dtype.kind in "fc":
    parts = [(a.real, b.real), (a.imag, b.imag)] if a.dtype.kind == "c" \
        else [(a, b)]
    for p, q in parts:
      pn, qn = np.isnan(p), np.isnan(q)
      if (pn != qn).any():
        return f"NaN positions: {a} against {b}"
      ok = ~pn
      if (np.signbit(p[ok]) != np.signbit(q[ok])).any():
        return f"signs: {a} against {b}"
      if rtol:
        pf, qf = p[ok].astype(np.float64), q[ok].astype(np.float64)
        inf = np.isinf(pf) | np.isinf(qf)
        if (pf[inf] != qf[inf]).any() or not np.all(
            np.abs(pf[~inf] - qf[~inf]) <= rtol * np.abs(qf[~inf])):
          return f"values (rtol {rtol}): {a} against {b}"
      elif not np.array_equal(p[ok], q[ok]):
        return f"values: {a!r} against {b!r}"
    return None
  if not np.array_equal(a, b):
    return f"values: {a!r} against {b!r}"
  return None


def result_difference(got, want, rtol) -> str | None:
  """None if ``got`` is ``want`` bit for bit (``rtol`` for floats)."""
  if isinstance(want, Raised) or isinstance(got, Raised):
    if isinstance(want, Raised) and isinstance(got, Raised):
      return None if got.type is want.type else \
          f"{got!r} where stock {want!r}"
    return f"{got!r} where stock returned" if isinstance(got, Raised) else \
        f"returned where stock {want!r}"
  g_leaves, g_tree = jax.tree_util.tree_flatten(got)
  w_leaves, w_tree = jax.tree_util.tree_flatten(want)
  if g_tree != w_tree:
    return f"tree {g_tree} against {w_tree}"
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(want)[0]]
  for path, g, w in zip(paths, g_leaves, w_leaves):
    d = _leaf_difference(g, w, rtol)
    if d:
      return f"at {path}: {d}"
  return None


def _is_subset(got, want) -> bool:
  return all(entry in want for entry in got)


def compare_passes(got: list, want: list, rtol: float, label: str) -> list:
  """Differences of one cache pass from stock's, step by step."""
  diffs = []
  for step, (g, w) in enumerate(zip(got, want)):
    for form in w.results:
      d = result_difference(g.results[form], w.results[form], rtol)
      if d:
        diffs.append(("result", f"{label} step {step} {form}: {d}"))
    if repr(g.callback_logs) != repr(w.callback_logs):
      diffs.append(("callback", f"{label} step {step}: callback logs "
                    f"{g.callback_logs} where stock {w.callback_logs}"))
    # A hit skips the trace and its side effects (docs/contract.md rule
    # 12): the log may miss entries, but what it has must be stock's.
    if w.trace_log is not None and not _is_subset(g.trace_log, w.trace_log):
      diffs.append(("trace_log", f"{label} step {step}: trace-time log "
                    f"{g.trace_log} where stock {w.trace_log}"))
    # Each trace that runs writes to the user's dict (never a copy's), and
    # no function object traces more often than stock's (a hit, fewer).
    for n, ((count, traces), (_, stock_traces)) in enumerate(
        zip(g.writes, w.writes)):
      if count != traces or traces > stock_traces:
        diffs.append(("state_write", f"{label} step {step} writer {n}: "
                      f"{count} write(s) to the user's dict in {traces} "
                      f"trace(s) where stock traced {stock_traces} time(s)"))
  return diffs


class _Capture(logging.Handler):
  def __init__(self):
    super().__init__(logging.WARNING)
    self.lines = []

  def emit(self, record):
    message = record.getMessage()
    if "verify mismatch" in message:
      self.lines.append(message)


@dataclasses.dataclass
class Verdict:
  program: Program
  diffs: list               # (category, text)
  verify_mismatches: int
  verify_log: list
  stats: dict

  @property
  def failed(self) -> bool:
    return bool(self.diffs) or self.verify_mismatches > 0

  def categories(self) -> list:
    cats = sorted({c for c, _ in self.diffs})
    return cats + (["verify_mismatch"] if self.verify_mismatches else [])

  def report(self, limit=12) -> str:
    lines = [describe(self.program)]
    if self.diffs:
      lines.append(f"differences from stock ({len(self.diffs)}):")
      lines += [f"  [{c}] {t[:400]}" for c, t in self.diffs[:limit]]
    if self.verify_mismatches:
      lines.append(f"verify mode counted {self.verify_mismatches} "
                   "mismatch(es) (the closure key shared a trace it should "
                   "not have; stock's answer was returned):")
      lines += [f"  {t[:400]}" for t in self.verify_log[:4]]
    return "\n".join(lines)

  def __str__(self):
    return self.report() if self.failed else \
        f"program {self.program.index} of seed {self.program.seed}: agrees"


def check(program: Program) -> Verdict:
  """The program with stock ``jax.jit`` once, then twice with the cache in
  verify mode; each pass on fresh function objects. The cache is left on
  or off, and in verify mode or not, as it was found (a suite run with
  ``--closure-cache-verify`` goes on with it on after this)."""
  import jax_closure_cache as jcc
  from jax_closure_cache import cache
  was_on, was_verifying = jcc.is_enabled(), cache.verifying()
  jcc.disable()
  jcc.clear()
  want = run_pass(program)
  logger = logging.getLogger("jax_closure_cache")
  capture = _Capture()
  logger.addHandler(capture)
  try:
    jcc.enable(verify=True)
    try:
      got = [run_pass(program), run_pass(program)]
      stats = jcc.stats()
    finally:
      jcc.disable()
  finally:
    logger.removeHandler(capture)
    jcc.enable(verify=was_verifying)
    if not was_on:
      jcc.disable()
  rtol = 1e-6 if tolerant(program) else 0.0
  diffs = []
  for n, g in enumerate(got, 1):
    diffs += compare_passes(g, want, rtol, f"pass {n}")
  verdict = Verdict(program, diffs, stats["verify_mismatches"],
                    capture.lines, stats)
  jcc.clear()
  return verdict


# ---------------------------------------------------------------------------
# Shrinking a failing program.

def _without_step(program, k):
  p = copy.deepcopy(program)
  for s in p.slots:
    del s.specs[k]
    del s.actions[k]
    s.actions[0] = "new"
    for j in range(1, len(s.specs)):
      if s.actions[j] == "same" and not _same_spec(s.specs[j],
                                                   s.specs[j - 1]):
        s.actions[j] = "new"
  return p


def _same_spec(a, b) -> bool:
  return repr(a) == repr(b) and type(a) is type(b)


def _candidates(program):
  p = program
  for i in range(len(p.slots)):
    if len(p.slots) > 1:
      q = copy.deepcopy(p)
      del q.slots[i]
      yield q
  for i in range(len(p.forms)):
    if len(p.forms) > 1:
      q = copy.deepcopy(p)
      del q.forms[i]
      yield q
  for k in range(p.steps):
    if p.steps > 2:
      yield _without_step(p, k)
  if p.trace_log:
    q = copy.deepcopy(p)
    q.trace_log = False
    yield q
  if p.top != "def":
    q = copy.deepcopy(p)
    q.top = "def"
    yield q
  for i, s in enumerate(p.slots):
    if s.carrier != "cell" and s.carrier != "static_value":
      q = copy.deepcopy(p)
      q.slots[i].carrier, q.slots[i].long_lived = "cell", False
      yield q
    if s.long_lived:
      q = copy.deepcopy(p)
      q.slots[i].long_lived = False
      yield q
  if p.forms != ["jit"]:
    q = copy.deepcopy(p)
    q.forms = ["jit"]
    yield q


def shrink(verdict: Verdict, budget: int = 40) -> Verdict:
  """A smaller program failing with one of ``verdict``'s categories."""
  want = set(verdict.categories())
  best = verdict
  tries = 0
  progress = True
  while progress and tries < budget:
    progress = False
    for cand in _candidates(best.program):
      tries += 1
      v = check(cand)
      if v.failed and want & set(v.categories()):
        best = v
        progress = True
        break
      if tries >= budget:
        break
  return best
