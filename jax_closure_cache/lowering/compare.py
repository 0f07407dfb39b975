"""Verify mode's oracle: would stock's trace of this function object now
compute what the hit runs?

:func:`first_difference` walks stock's closed jaxpr and the hit's in
lockstep: the same primitives with equal parameters (``structure``'s
rules: atoms by type and bits, nested jaxprs by structure or, where that
differs, compared as the top level is, callables by identity), operands
that correspond, the same output types, effects and
outputs. A stock constant corresponds to the hit's input that holds the
same object (a lifted leaf), or to a value of equal type and bits (a
constant the trace made itself, or a Python scalar the hit takes as an
argument).

Invariants: it never calls a user's ``__eq__``; it reads jaxprs and
constants only; None means "the same computation".
"""

from __future__ import annotations

import numpy as np

from jax_closure_cache._compat import lowering as _compat
from jax_closure_cache.lowering import structure


class _Value:
  """A binder bound to a concrete value (a constant or a leaf)."""
  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value


def _same_value(x, y) -> bool:
  if x is y:
    return True
  try:
    a, b = np.asarray(x), np.asarray(y)
  except Exception:   # not an array-like value: only identity counts
    return False
  return (a.dtype == b.dtype and a.shape == b.shape
          and a.tobytes() == b.tobytes()
          and (type(x) is type(y) or not _scalar_type(x, y)))


def _scalar_type(x, y) -> bool:   # Python scalars must agree in type
  return type(x) in (bool, int, float, complex) or type(y) in (
      bool, int, float, complex)


def first_difference(stock_closed, hit_closed, leaves: list) -> str | None:
  """None if ``hit_closed`` (a jaxpr whose first inputs take ``leaves``)
  computes what ``stock_closed`` does, else where they first differ."""
  stock, stock_consts = _parts(stock_closed)
  hit, hit_consts = _parts(hit_closed)
  n = len(hit.invars) - len(stock.invars)
  if n != len(leaves):
    return (f"the hit takes {len(hit.invars)} inputs for "
            f"{len(stock.invars)} arguments and {len(leaves)} leaves")
  bound: dict = {}   # hit var -> _Value
  for v, c in zip(hit.constvars, hit_consts):
    bound[v] = _Value(c)
  for v, c in zip(hit.invars[:n], leaves):
    bound[v] = _Value(c)
  env: dict = {}   # stock var -> hit var, or _Value
  for v, c in zip(stock.constvars, stock_consts):
    env[v] = _Value(c)
  for i, (v, w) in enumerate(zip(stock.invars, hit.invars[n:])):
    if v.aval != w.aval:
      return f"argument {i}: {v.aval} against {w.aval}"
    env[v] = w

  def same(x, y) -> bool:
    if type(x) is _Value:   # stock's nested jit's constant
      if type(y) is _Value:
        return _same_value(x.value, y.value)
      if type(y) is _compat.Literal:
        return _same_value(x.value, y.val)
      b = bound.get(y)
      return b is not None and _same_value(x.value, b.value)
    if type(y) is _Value:   # the hit's nested jit's constant
      if type(x) is _compat.Literal:
        return _same_value(x.val, y.value)
      mapped = env.get(x)
      return type(mapped) is _Value and _same_value(mapped.value, y.value)
    if type(x) is _compat.Literal:
      if type(y) is _compat.Literal:
        return x.aval == y.aval and _same_value(x.val, y.val)
      b = bound.get(y)
      return b is not None and _same_value(x.val, b.value)
    mapped = env.get(x)
    if mapped is y:
      return True
    if type(mapped) is _Value:
      if type(y) is _compat.Literal:
        return _same_value(mapped.value, y.val)
      b = bound.get(y)
      return b is not None and _same_value(mapped.value, b.value)
    return False

  if len(stock.eqns) != len(hit.eqns):
    first = _first_eqn_difference(stock, hit, same, env)
    return first or (f"{len(stock.eqns)} equations against "
                     f"{len(hit.eqns)}")
  first = _first_eqn_difference(stock, hit, same, env)
  if first:
    return first
  if len(stock.outvars) != len(hit.outvars) or not all(
      map(same, stock.outvars, hit.outvars)):
    return "the outputs differ"
  if not _same_effects(stock.effects, hit.effects, same):
    return f"effects {stock.effects} against {hit.effects}"
  return None


def _same_effects(stock_effects, hit_effects, same) -> bool:
  """Whether two sets of effects are the same, an effect tied to an input
  (a reference's read or write) by its class and corresponding input
  (``same``: in a jaxpr JAX ties it to the jaxpr's own variable)."""
  if stock_effects == hit_effects:
    return True
  if len(stock_effects) != len(hit_effects):
    return False
  tied = _compat.JaxprInputEffect
  if {x for x in stock_effects if not isinstance(x, tied)} != {
      x for x in hit_effects if not isinstance(x, tied)}:
    return False
  unmatched = [x for x in hit_effects if isinstance(x, tied)]
  for x in stock_effects:
    if not isinstance(x, tied):
      continue
    for j, y in enumerate(unmatched):
      if type(x) is type(y) and same(x.input, y.input):
        del unmatched[j]
        break
    else:
      return False
  return True


def _parts(jaxpr) -> tuple:   # a closed jaxpr's, or an open one's (0.10)
  if isinstance(jaxpr, _compat.ClosedJaxpr):
    return _compat.closed_parts(jaxpr)
  return jaxpr, ()


def _first_eqn_difference(stock, hit, same, env) -> str | None:
  for i, (e, f) in enumerate(zip(stock.eqns, hit.eqns)):
    where = f"equation {i} ({e.primitive})"
    if e.primitive is not f.primitive:
      return f"{where}: {e.primitive} against {f.primitive}"
    (e_ins, e_params), (f_ins, f_params) = _operands(e), _operands(f)
    if len(e_ins) != len(f_ins) or not all(map(same, e_ins, f_ins)):
      permuted = (_cond_in_order(e_ins, f_ins, f_params, same)
                  or _loop_in_order(e_ins, f_ins, f_params, same)
                  or _call_in_order(e_ins, f_ins, f_params, same))
      if permuted is None:
        return f"{where}: its operands differ"
      f_ins, f_params = permuted
    if (_params(e, e_params) != _params(f, f_params)
        and not _same_nested(e, e_params, f_params)):
      return f"{where}: its parameters differ"
    if [v.aval for v in e.outvars] != [v.aval for v in f.outvars]:
      return f"{where}: its output types differ"
    if not _same_effects(e.effects, f.effects, same):
      return f"{where}: its effects differ"
    for v, w in zip(e.outvars, f.outvars):
      env[v] = w
  return None


def _same_nested(e, e_params: dict, f_params: dict) -> bool:
  """Whether parameters that differ in structure are nested jaxprs (or
  tuples of them) computing the same from the same inputs, each compared
  by :func:`first_difference` (which allows the operand orders allowed
  here: a loop inside a ``custom_vjp_call`` orders a lifted leaf apart
  from stock's constants as a top-level one does), every other parameter
  equal by its key."""
  if e_params.keys() != f_params.keys():
    return False
  ignored = structure.NOT_LOWERED.get(e.primitive.name, ())
  return all(_same_param(p, f_params[k]) for k, p in e_params.items()
             if k not in ignored)


def _same_param(p, q) -> bool:
  try:
    if structure.param_key(p, named=False) == structure.param_key(
        q, named=False):
      return True
  except structure.NotShared:   # constants too large to key: by value below
    pass
  if type(p) is _compat.PyTreeDef and type(q) is _compat.PyTreeDef:
    return structure.treedef_key(p, False) == structure.treedef_key(q, False)
  jaxprs = (_compat.ClosedJaxpr, _compat.Jaxpr)
  if isinstance(p, jaxprs) and isinstance(q, jaxprs):
    return first_difference(p, q, []) is None
  if type(p) in (tuple, list) and type(q) is type(p) and len(p) == len(q):
    return all(map(_same_param, p, q))
  return False


def _cond_in_order(e_ins, f_ins, f_params, same):
  """A ``cond``'s operands and branches with the operands after the index
  in the order of ``e_ins``, where ``f_ins`` holds the same ones in
  another order (a lifted leaf is the trace's input, which JAX's branch
  tracing orders apart from the constants stock's trace has there); None
  if they are not such a permutation."""
  if ("branches" not in f_params or len(e_ins) != len(f_ins) or not e_ins
      or not same(e_ins[0], f_ins[0])):
    return None
  order = _group_order(e_ins, f_ins, 1, len(f_ins), same)
  if order is None:
    return None
  branches = [_compat.with_inputs_in_order(b, order)
              for b in f_params["branches"]]
  if any(b is None for b in branches):
    return None
  return ([f_ins[0], *[f_ins[k + 1] for k in order]],
          dict(f_params, branches=tuple(branches)))


def _group_order(e_ins, f_ins, start, stop, same):
  """The positions in ``f_ins[start:stop]`` of ``e_ins[start:stop]`` (a
  permutation, relative to ``start``), or None."""
  order, free = [], list(range(start, stop))
  for x in e_ins[start:stop]:
    k = next((k for k in free if same(x, f_ins[k])), None)
    if k is None:
      return None
    free.remove(k)
    order.append(k - start)
  return order


def _loop_in_order(e_ins, f_ins, f_params, same):
  """A ``while_loop``'s or ``scan``'s operands and jaxprs with its constant
  operands in the order of ``e_ins``, where ``f_ins`` holds the same
  constants in another order (as :func:`_cond_in_order`: JAX orders a
  lifted leaf apart from the constants stock's trace has there); the
  carried and scanned operands must agree in place. None otherwise."""
  if len(e_ins) != len(f_ins):
    return None
  if "body_jaxpr" in f_params and "cond_jaxpr" in f_params:
    nc, nb = f_params["cond_nconsts"], f_params["body_nconsts"]
    groups = ((0, nc), (nc, nc + nb))
  elif "jaxpr" in f_params and "num_consts" in f_params:
    groups = ((0, f_params["num_consts"]),)
  else:
    return None
  end = groups[-1][1]
  if not all(map(same, e_ins[end:], f_ins[end:])):
    return None
  orders = [_group_order(e_ins, f_ins, a, b, same) for a, b in groups]
  if any(o is None for o in orders):
    return None
  ins = [f_ins[a + k] for (a, _), o in zip(groups, orders) for k in o]
  ins += f_ins[end:]
  params = dict(f_params)
  if len(groups) == 2:
    (oc, ob), carry = orders, len(f_ins) - end
    cond = _compat.with_inputs_in_order(
        f_params["cond_jaxpr"], [*oc, *range(len(oc), len(oc) + carry)])
    body = _compat.with_inputs_in_order(
        f_params["body_jaxpr"], [*ob, *range(len(ob), len(ob) + carry)])
    if cond is None or body is None:
      return None
    params.update(cond_jaxpr=cond, body_jaxpr=body)
  else:
    (o,) = orders
    rest = len(f_ins) - end
    order = [*o, *range(len(o), len(o) + rest)]
    jaxpr = _compat.with_inputs_in_order(f_params["jaxpr"], order)
    if jaxpr is None:
      return None
    params["jaxpr"] = jaxpr
    if "linear" in params and len(params["linear"]) == len(order):
      params["linear"] = tuple(params["linear"][k] for k in order)
  return ins, params


#: a call's parameters that hold one item per operand
_PER_OPERAND = ("in_shardings", "in_layouts", "donated_invars")


def _call_in_order(e_ins, f_ins, f_params, same):
  """A call's (``checkpoint``'s ``remat2``, a nested ``jit``) operands and
  jaxpr in the order of ``e_ins``, where ``f_ins`` holds the same ones in
  another order (as :func:`_cond_in_order`: JAX orders a lifted leaf
  apart from the constants stock's trace has there); every operand is one
  input of the jaxpr, and the parameters kept per operand follow it. None
  if they are not such a permutation."""
  jaxpr = f_params.get("jaxpr")
  if (jaxpr is None or "num_consts" in f_params or len(e_ins) != len(f_ins)
      or len(_compat.jaxpr_inputs(jaxpr)) != len(f_ins)):
    return None
  order = _group_order(e_ins, f_ins, 0, len(f_ins), same)
  if order is None:
    return None
  reordered = _compat.with_inputs_in_order(jaxpr, order)
  if reordered is None:
    return None
  params = dict(f_params, jaxpr=reordered)
  for k in _PER_OPERAND:
    if k in params and len(params[k]) == len(order):
      params[k] = tuple(params[k][i] for i in order)
  return [f_ins[k] for k in order], params


def _operands(e) -> tuple[list, dict]:
  """An equation's operands and parameters, a nested jit's constants made
  its first operands: one side closes a nested jit over an array that the
  other passes as that jit's argument (the same computation)."""
  if not structure.nested_jit_constants(e):
    return list(e.invars), e.params
  consts, params = structure.constants_as_inputs(e)
  return [*map(_Value, consts), *e.invars], params


def _params(e, params: dict) -> tuple:
  ignored = structure.NOT_LOWERED.get(e.primitive.name, ())
  try:
    # nested jaxprs without their debug names: the package names a lifted
    # leaf's input, pjit a hoisted constant's, and no computation reads them
    return tuple((k, structure.param_key(p, named=False))
                 for k, p in params.items() if k not in ignored)
  except structure.NotShared as err:
    return ("not comparable", str(err), id(e))
