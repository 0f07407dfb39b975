"""Auto-dynamic Python scalars: which closed-over ints and floats may be
passed as weakly typed arguments, decided per key structure and verified.

A Python scalar in a closure is baked into stock's trace; one that keeps
changing (a learning-rate schedule, a temperature, a step counter) would
compile once per value. Passing it as an argument shares one executable --
but only if the trace with the value abstracted *is* the trace with the
value baked. Code that branches on the value's type (``isinstance(n,
int)``), library code that dispatches on it (``x ** n`` is ``integer_pow``
for a Python int, ``pow`` for a tracer; ``fori_loop`` with a Python bound is
a ``scan``), or a value read through a path the rebuild does not reach
would compute something else, silently.

:func:`verify` decides: it traces the function (no compile) with the
candidate scalars baked, as stock would, for the current values and for the
previous miss's values, and once with them as arguments; the dynamic jaxpr,
re-traced with the values known (so constant folding Python did on a value
at trace time is accounted for), must equal each static one: the same
equations, primitives, params and avals, literals equal up to float32
rounding. Anything else keeps the positions static for that structure.

Invariants:
* A mask (the set of scalar ordinals passed as arguments) belongs to one key
  *structure*: the key with every scalar masked. A key of another structure
  never uses it (ordinals count scalars in walk order, so the same ordinal
  names another value in another structure).
* A position becomes dynamic only after :func:`verify` passed for it, once
  per code, structure and position set; a failure keeps it static for good
  (until ``clear()``) and is explained, naming the first difference.
* Verification runs the user's code at trace time; whatever it changed in
  the state the function reaches is put back, so side effects happen only
  in the traces stock would also run.
* Python ``bool`` is never dynamic (it is how code selects branches).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from jax_closure_cache import _compat
from jax_closure_cache.key import state_watch
from jax_closure_cache import cache
from jax_closure_cache.key import masks
from jax_closure_cache.key import rebuild


class Decision(NamedTuple):
  """What one (code, user code, options) key decided for one structure."""
  structure: Any
  dynamic: frozenset      # verified ordinals, passed as arguments
  never: frozenset        # ordinals that failed verification


_decisions: dict[tuple, Decision] = {}
_last_keys: dict[tuple, tuple] = {}
_MAX = 1 << 12   # codes made in a loop: start over past this
for _d in (_decisions, _last_keys):
  cache.register_clear_hook(_d.clear)

#: Verification cost, for ``stats()['auto_dynamic']``: runs, outcomes and
#: seconds spent (zeroed by ``clear()``).
COST = {"verifications": 0, "verified": 0, "rejected": 0, "seconds": 0.0}
cache.register_report("auto_dynamic", lambda: dict(COST))
cache.register_clear_hook(lambda: COST.update(verifications=0, verified=0,
                                              rejected=0, seconds=0.0))


def structure(key) -> Any:
  """``key`` with every Python scalar masked (by type)."""
  return masks.mask_scalars(key)


def mask_for(dk, key) -> frozenset | None:
  """The verified ordinals for ``key``'s structure, or None."""
  d = _decisions.get(dk)
  if d is None or not d.dynamic or d.structure != structure(key):
    return None
  return d.dynamic


def verified(dk) -> frozenset | None:
  """The verified ordinals of ``dk``'s latest structure, or None."""
  d = _decisions.get(dk)
  return d.dynamic if d is not None and d.dynamic else None


def last_key(dk):
  return _last_keys.get(dk)


def remember_last_key(dk, full_key) -> None:
  if len(_last_keys) >= _MAX:
    _last_keys.clear()
  _last_keys[dk] = full_key


def candidates(dk, previous_key, key) -> frozenset | None:
  """Ordinals that would become dynamic on this miss: the scalars that
  differ from the last miss of ``dk`` (same structure), with those already
  verified, less those that failed; None if there are none new."""
  changed = masks.scalars_that_differ(previous_key, key)
  if not changed:
    return None
  d = _decisions.get(dk)
  s = structure(key)
  if d is not None and d.structure == s:
    changed -= d.never
    if not changed or changed <= d.dynamic:
      return None
    return d.dynamic | changed
  return frozenset(changed)


def decide(dk, key, ordinals: frozenset, ok: bool) -> None:
  s = structure(key)
  d = _decisions.get(dk)
  if d is None or d.structure != s:
    d = Decision(s, frozenset(), frozenset())
  if ok:
    d = d._replace(dynamic=ordinals)
  else:
    d = d._replace(never=d.never | (ordinals - d.dynamic))
  _put(dk, d)


def _put(dk, d: Decision) -> None:
  if dk not in _decisions and len(_decisions) >= _MAX:
    _decisions.clear()   # codes made in a loop: start over
  _decisions[dk] = d


def never(dk, key, ordinals: frozenset) -> None:
  """After a failed dynamic trace: these ordinals stay static."""
  s = structure(key)
  d = _decisions.get(dk)
  if d is None or d.structure != s:
    d = Decision(s, frozenset(), frozenset())
  _put(dk, d._replace(dynamic=d.dynamic - ordinals, never=d.never | ordinals))


def never_for(dk, key) -> frozenset:
  d = _decisions.get(dk)
  if d is None or d.structure != structure(key):
    return frozenset()
  return d.never


# -- verification --------------------------------------------------------------

def _scalar_value(part):
  """The Python value a key's scalar part holds."""
  t, v = part
  if t is float and isinstance(v, str):
    return float.fromhex(v)
  return v


def _values_at(key, ordinals) -> list:
  scalars: list = []
  masks.mask_scalars(key, scalars)
  return [_scalar_value(scalars[i]) for i in sorted(ordinals)]


def _aval(v):
  a = v.aval
  return (str(a), getattr(a, "weak_type", None))


def _shape(closed) -> tuple[list, list]:
  """A jaxpr as comparable parts: per equation its primitive, params,
  inputs (variables numbered by first appearance; literals and constants,
  which Python folding or the substitution may turn into one another, as
  values) and output types; and those values, compared numerically."""
  jaxpr = closed.jaxpr
  consts = {v: c for v, c in zip(jaxpr.constvars, closed.consts)}
  names: dict = {v: i for i, v in enumerate(jaxpr.invars)}
  values: list = []
  parts: list = [tuple(_aval(v) for v in jaxpr.invars)]

  def operand(v):
    if isinstance(v, _compat.Literal) or v in consts:
      values.append(v.val if isinstance(v, _compat.Literal) else consts[v])
      return ("value", _aval(v))
    return ("var", names.setdefault(v, len(names)))
  for eqn in jaxpr.eqns:
    ins = tuple(operand(v) for v in eqn.invars)
    for v in eqn.outvars:
      names.setdefault(v, len(names))
    parts.append((str(eqn.primitive), str(sorted(eqn.params.items())), ins,
                  tuple(_aval(v) for v in eqn.outvars)))
  parts.append(tuple(operand(v) for v in jaxpr.outvars))
  return parts, values


def _same(dynamic, static) -> str | None:
  """None if the two traces compute the same, else the first difference."""
  parts_d, values_d = _shape(dynamic)
  parts_s, values_s = _shape(static)
  for a, b in zip(parts_d, parts_s):
    if a != b:
      return f"{_show(a)} where stock traces {_show(b)}"
  if len(parts_d) != len(parts_s):
    return "the traces have different numbers of equations"
  if len(values_d) != len(values_s):
    return "the traces capture different constants"
  for x, y in zip(values_d, values_s):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype or not np.allclose(
        x, y, rtol=4e-7, atol=0, equal_nan=True):
      return f"the value {x} where stock traces {y}"
  return None


def _show(part) -> str:
  if len(part) == 4 and isinstance(part[0], str):
    return f"{part[0]}[{part[1][:80]}]"
  return "other inputs or outputs"


def verify(fun, a, key, previous_key, ordinals, args, kwargs) -> str | None:
  """None if passing the scalars at ``ordinals`` as arguments traces what
  baking them traces, for this call's values and the last miss's; else why
  not. ``a`` is ``fun``'s analysis with ``ordinals`` dynamic."""
  started = time.perf_counter()
  COST["verifications"] += 1
  watch = state_watch.StateWatch(fun)
  try:
    why = _verify(fun, a, key, previous_key, ordinals, args, kwargs)
  except Exception as e:   # a trace that fails keeps the values static
    why = f"tracing with the value as an argument raised {type(e).__name__}"
  finally:
    watch.restore()
    COST["seconds"] += time.perf_counter() - started
  COST["verified" if why is None else "rejected"] += 1
  return why


def _verify(fun, a, key, previous_key, ordinals, args, kwargs):
  jax = _compat.jax
  is_scalar = [type(x) in (int, float) for x in a.leaves]
  arrays = [x for x, s in zip(a.leaves, is_scalar) if not s]
  now = [x for x, s in zip(a.leaves, is_scalar) if s]
  if len(now) != len(ordinals):
    return "the scalars passed as arguments are not the ones that changed"

  def merged(arrays, scalars):
    it_a, it_s = iter(arrays), iter(scalars)
    return [next(it_s) if s else next(it_a) for s in is_scalar]

  def static(values):
    def f(arrays, *args, **kwargs):
      rebuilt = rebuild.rebuild(fun, a.key, merged(arrays, values))
      return rebuilt(*args, **kwargs)
    return jax.make_jaxpr(f)(arrays, *args, **kwargs)

  def dynamic_trace(arrays, scalars, *args, **kwargs):
    rebuilt = rebuild.rebuild(fun, a.key, merged(arrays, scalars))
    return rebuilt(*args, **kwargs)
  dyn = jax.make_jaxpr(dynamic_trace)(arrays, now, *args, **kwargs)
  n_arrays = len(jax.tree_util.tree_leaves(arrays))

  for values in (now, _values_at(previous_key, ordinals)):
    want = static(values)

    def substituted(arrays, *args, values=values, **kwargs):
      flat = jax.tree_util.tree_leaves((arrays, args, kwargs))
      return _eval_folding(dyn.jaxpr, dyn.consts,
                           [*flat[:n_arrays], *values, *flat[n_arrays:]])
    why = _same(jax.make_jaxpr(substituted)(arrays, *args, **kwargs), want)
    if why is not None:
      return why
  return None


# Scalar arithmetic Python may have done on a value before it reached jax
# (``lr * 0.5``): folded in NumPy, in the equation's own dtype, so the
# verification compiles nothing.
_FOLD = {"mul": np.multiply, "add": np.add, "sub": np.subtract,
         "div": np.divide, "neg": np.negative, "max": np.maximum,
         "min": np.minimum, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
         "pow": np.power, "abs": np.abs,
         "integer_pow": lambda x, y: np.power(x, y),
         "convert_element_type": lambda x, **_: x}


def _eval_folding(jaxpr, consts, args) -> list:
  """``jaxpr`` evaluated on ``args`` (tracers and known values): equations
  whose inputs are all known NumPy-foldable values are computed now,
  everything else is bound as ``eval_jaxpr`` binds it."""
  env: dict = {}

  def read(v):
    return v.val if isinstance(v, _compat.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    fold = _FOLD.get(eqn.primitive.name)
    if (fold is not None and len(eqn.outvars) == 1
        and not any(isinstance(x, _compat.Tracer) for x in ins)
        and all(np.ndim(x) == 0 for x in ins)):
      params = ({"y": eqn.params["y"]} if eqn.primitive.name == "integer_pow"
                else {})
      dtype = eqn.outvars[0].aval.dtype
      out = [np.asarray(fold(*[np.asarray(x, dtype) for x in ins],
                             **params), dtype)]
    else:
      out = _compat.bind_equation(eqn, ins)
    env.update(zip(eqn.outvars, out))
  return [read(v) for v in jaxpr.outvars]
