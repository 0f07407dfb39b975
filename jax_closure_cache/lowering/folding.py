"""Where passing a constant as an argument changes what XLA computes.

Two kinds of difference, each found structurally:

* the sign of a zero (reason ``folds_zero``);
* a reassociation (reason ``folds_constants``): XLA rewrites
  ``(x * c1) * c2`` as ``x * (c1 * c2)`` and ``(x + c1) + c2`` as
  ``x + (c1 + c2)`` where it sees both scalars as constants, and rounds
  otherwise than the order the program wrote (a learning rate ``lr`` in
  ``(g * lr) * 0.5``), through a reshape, transpose, reversal or
  broadcast between the two; a sum of two products by such scalars
  (``x * c1 + x * c2``) was measured to differ too. A scalar
  passed as an argument (a changed literal, a lifted 0-d array) keeps the
  written order in the cache's module only. Two array constants are
  reassociated alike (``(x * c1) * c2``, ``(x + c1) + c2``); an array and
  a scalar were not seen to be. Likewise (reason ``folds_constants``) a
  function of values computed from lifted inputs alone other than IEEE's
  correctly rounded arithmetic and moves (``tanh(c)``, ``log(c)``,
  ``rsqrt(c)``, a complex product or quotient): XLA evaluates it at
  compile time in stock's module, with its own arithmetic, where the
  cache's computes it at run time; a ``pow`` whose exponent is such a
  value (XLA rewrites ``x ** 3.0`` as products); a quotient by such a
  value that is an array, a square root or complex (XLA rewrites ``x / c``
  as ``x * (1 / c)`` and ``x / sqrt(c)`` as ``x * rsqrt(c)``, folding the
  reciprocal); and a complex product by one (XLA simplifies it with the
  constant's parts). A real scalar divisor is divided by in both modules.
  So is (reason ``folds_constants``) a sum, a contraction, a ``min`` or
  ``max`` of such values, arithmetic on them narrower than 32 bits (XLA's
  evaluator rounds after every operation, the runtime drops roundings it
  finds excess), a product or square of them that an addition of a
  runtime value takes, moved too (the runtime fuses the two into one
  multiply-add), a transpose of them in a dot (``x @ W.T``: stock's module
  lays the constant out anew, the cache's moves the transpose into the
  dot and multiplies with another kernel), and a chain
  reassociated across a branch XLA inlines, a one-trip loop it removes or
  a choice by a constant predicate. A scatter of such values at lifted
  positions (a cross-entropy gradient's) is not modelled.

The sign of a zero:

XLA simplifies ``x + 0`` to ``x`` wherever it can see the zero: an array
constant of zeros, or one it folded from constants (``c * 0.0``,
``broadcast(0.0)``). That is not IEEE's sum where ``x`` holds -0.0
(``-0.0 + 0.0`` is ``0.0``). Stock bakes a closed-over array into its
module; the cache passes it as an argument (tier B lifts it, tier A passes
the jaxpr's constants and changed literals). A value computed from those
alone is a constant XLA folds in stock's module and a runtime value in the
cache's, so an addition of such a value and a value that may be all zeros
is simplified in one module and summed in the other: the sign of a zero
can differ. :func:`difference` finds such an addition.

The answer is structural (which values may be zero follows from literals,
constants and the equations, never from a lifted array's contents), so it
holds for every call of a key. Whether a closed-over array's values are
all zeros changes from call to call, so it is not read here: each call
reads it (``structure.constant_reads``' ``by_zero``, the hit's leaf
answers, tier A's baked constants).

Invariants:
* Over-approximating: a primitive this module does not know keeps a zero
  where any operand may be zero; a nested jaxpr it cannot map input by
  input is read with every input as lifted as its most lifted operand.
* Never an error: a jaxpr it cannot read is answered with a reason.
"""

from __future__ import annotations

import math
import types
from typing import NamedTuple

import numpy as np

from jax_closure_cache._compat import lowering as _compat


class _State(NamedTuple):
  """What a value may be: computed from a lifted input (``lifted``), from a
  call argument (``varying``), all zeros (``zero``; XLA can see it only
  where no call argument reaches it)."""
  lifted: bool
  varying: bool
  zero: bool

  @property
  def folded_by_stock_only(self) -> bool:
    """A constant in stock's module, a runtime value in the cache's."""
    return self.lifted and not self.varying


_CONSTANT = _State(False, False, False)
_ARGUMENT = _State(False, True, False)
_LIFTED = _State(True, False, False)

#: operations XLA simplifies with a zero operand (``x + 0`` is ``x``), or
#: whose folding by XLA's evaluator treats a signed zero otherwise than
#: the runtime does (``max(-0.0, 0.0)``)
_ZERO_SENSITIVE = frozenset({"add", "add_any", "sub", "max", "min"})
#: the result is all zeros only where every operand is
_ALL_ZERO = frozenset({"add", "add_any", "sub", "max", "min", "concatenate",
                       "select_n", "pad", "atan2", "clamp"})
#: The families of moves, the one vocabulary of this module's rules and
#: ``structure``'s: moves XLA reassociates a constant through (``(x *
#: c).reshape(...) * 2``; not a slice, a negation or a conversion)
_CHAIN_MOVES = frozenset({"reshape", "transpose", "rev", "broadcast_in_dim",
                          "squeeze", "expand_dims", "copy", "copy_p"})
#: moves taking, joining or choosing elements by their static parameters
_PART_MOVES = frozenset({"slice", "concatenate", "pad", "select_n", "split"})
#: moves taking elements by a runtime index (a part of an array that is not
#: all zeros may be)
_INDEXED_MOVES = frozenset({"gather", "dynamic_slice"})
#: moves of elements that compute nothing (a conversion is not one: it
#: rounds)
_SHAPE_MOVES = _CHAIN_MOVES | _PART_MOVES | _INDEXED_MOVES
#: operations keeping every value where it is, placing or marking it
_PLACEMENTS = frozenset({"device_put", "pvary", "sharding_constraint",
                         "optimization_barrier", "mesh_cast", "reshard",
                         "stop_gradient"})
#: operations that move, convert or negate values: on a constant all 1, -1
#: or an infinity, their result is one too, and one not so is not one (a
#: conversion only where it keeps every value: ``_compat.exact_conversion``;
#: ``c.astype(bool)`` and ``c.astype(int)`` compute 1 from 5.7 or 1.5)
VALUE_MOVES = _SHAPE_MOVES | _PLACEMENTS | frozenset({
    "convert_element_type", "neg", "stack"})
#: operations that move or convert values: on constants, all zeros only
#: where an operand is (any other operation on constants alone may fold to
#: zeros: ``ones - 1.0``, ``log(ones)``, ``floor(0.5)``)
_MOVES = VALUE_MOVES - _INDEXED_MOVES | frozenset({"reduce_precision"})
#: moves keeping every element (none dropped, none rounded): an array of
#: one value exactly where their operand is
_WHOLE_MOVES = _CHAIN_MOVES | _PLACEMENTS | frozenset({"neg"})
#: scalar arithmetic on literals, evaluated here as XLA folds it (``-1.0 /
#: 4.0``, a gradient's seed): is the result zero?
_SCALAR = types.MappingProxyType({"neg": np.negative, "add": np.add, "sub": np.subtract,
           "mul": np.multiply, "div": np.divide, "max": np.maximum,
           "min": np.minimum, "sqrt": np.sqrt, "exp": np.exp, "log": np.log,
           "abs": np.abs, "sign": np.sign, "square": np.square})
#: operations whose value on constants XLA's compile-time evaluator gives
#: exactly as the runtime computes it (comparisons, moves, rounding to an
#: integer, a sign); any other may round otherwise, so on lifted floating
#: values alone it is a finding: ``tanh``, ``log``, a sum's or a product's
#: order, and IEEE's arithmetic too (``c * 1e-10`` of a subnormal result,
#: which the evaluator keeps and the runtime flushes to zero; ``c - c *
#: 1.0000001``, which the runtime fuses into one multiply-add, with one
#: rounding where the evaluator makes two)
_EXACT_ON_CONSTANTS = _MOVES | frozenset({
    "abs", "sign", "floor", "ceil", "round", "eq", "ne", "lt", "le", "gt",
    "ge", "and", "or", "not", "xor", "iota", "is_finite",
    "argmax", "argmin", "dynamic_slice", "dynamic_update_slice", "gather",
    "sort"})
# (``max``, ``min``, ``clamp`` and their reductions are not among them: XLA's
# evaluator was measured to fold ``min(0.0, -0.0)`` otherwise than the
# runtime, and a lifted array's zeros and their signs are not known here)
#: those of them exact on complex values too
_EXACT_ON_COMPLEX = _MOVES | frozenset({"eq", "ne", "real", "imag",
                                        "complex", "conj"})
#: a nested jaxpr XLA never simplifies as the equation's own code (a
#: scatter's combiner)
_NOT_INLINED = frozenset({"update_jaxpr"})
#: sums, whose value on constants XLA's evaluator computes in its own
#: order: a finding where values computed from lifted inputs reach one (a
#: sum of constants placed at lifted positions, a cross-entropy gradient's
#: scatter of -1/n at the labels, is read as the other modules' alike)
_REDUCTIONS = frozenset({"reduce_sum", "reduce_prod", "cumsum", "cumprod",
                         "cumlogsumexp"})
#: products, which the runtime fuses with an addition that takes them
_PRODUCTS = frozenset({"mul", "square", "integer_pow"})
#: operations on a scalar's broadcast whose result is one too (every
#: element the same value)
_SCALAR_KEEPING = frozenset(_SCALAR) | frozenset({
    "broadcast_in_dim", "reshape", "convert_element_type", "transpose",
    "squeeze", "expand_dims", "copy", "copy_p", "rev", "integer_pow",
    "rsqrt", "tanh", "logistic", "log1p", "expm1"})
#: call-like primitives: one jaxpr input per operand, one output per output
_CALL_JAXPR = ("jaxpr", "call_jaxpr", "fun_jaxpr")


class Finding(NamedTuple):
  """Why passing some of a jaxpr's constants as arguments would compute
  otherwise than stock's module: ``reason`` (``folds_zero``,
  ``folds_constants``, or ``folding_unread`` for a jaxpr it cannot read,
  as fallbacks are counted) and ``detail``."""
  reason: str
  detail: str


_UNREADABLE = "folding_unread"   # (a jaxpr this module cannot read: not shared)


def difference(closed, lifted_inputs: int = 0,
               constants_lifted: bool = False,
               lifted_literals: frozenset = frozenset(),
               lifted_constants: frozenset | set = frozenset(),
               nested_lifted: bool | None = None) -> Finding | None:
  """Where ``closed`` computes otherwise with some of its constants passed
  as arguments (the description), or None. Its first ``lifted_inputs``
  inputs are passed where stock bakes them; with ``constants_lifted`` its
  constants too (else those whose ``id`` is in ``lifted_constants``: a
  stock trace's closed-over arrays a lifted trace would pass), and the
  top-level literals at ``lifted_literals`` (``(equation index, operand
  index)``). The constants of the jaxprs it holds are passed with
  ``nested_lifted`` (by default, with ``constants_lifted``)."""
  if nested_lifted is None:
    nested_lifted = constants_lifted
  try:
    return _difference(closed, lifted_inputs, constants_lifted,
                       lifted_literals, lifted_constants, nested_lifted)[0]
  except Exception as e:   # never an error: not shared
    return Finding(_UNREADABLE, f"its jaxpr could not be read "
                   f"({type(e).__name__}: {e})")


def uniform_reads(closed, lifted: int | None = None) -> frozenset:
  """The lifted inputs whose elements all being one value changes what
  stock's module computes (an array of one value is a scalar's broadcast
  there, which XLA reassociates with a scalar constant: ``(x * c) *
  0.7``): by ``structure.constant_reads``' index (with ``lifted``, its
  first ``lifted`` inputs, passed where stock bakes them; else its
  constants, all passed). Where :func:`difference` finds something, the
  call is not shared anyway (then, whatever was noted before it)."""
  try:
    if lifted is None:
      return _difference(closed, 0, True, frozenset(), frozenset(), True)[1]
    return _difference(closed, lifted, False, frozenset(), frozenset(),
                       False)[1]
  except Exception:   # (difference's finding refuses the call)
    return frozenset()


def _difference(closed, lifted_inputs, constants_lifted, lifted_literals,
                lifted_constants, nested_lifted) -> tuple:
  """``(finding or None, uniform_reads)``."""
  jaxpr, consts = _compat.closed_parts(closed)
  env: dict = {}
  chains = _Chains()
  # (uniform_reads' index: the lifted inputs, then the constants)
  seeds = [*jaxpr.invars[:lifted_inputs], *jaxpr.constvars]
  for v, c in zip(jaxpr.constvars, consts):
    if constants_lifted or id(c) in lifted_constants:
      env[v] = _LIFTED
    else:
      env[v] = _CONSTANT._replace(zero=_all_zero(c))
      chains.note_constant(v, c)
  for i, v in enumerate(jaxpr.invars):
    env[v] = _LIFTED if i < lifted_inputs else _ARGUMENT
  for i, v in enumerate(seeds):
    if env[v].lifted and math.prod(getattr(v.aval, "shape", ())) > 1:
      chains.uniform[v] = frozenset({i})
  found = _walk(jaxpr, env, lifted_literals, nested_lifted=nested_lifted,
                chains=chains)
  return found, frozenset(chains.uniform_reads)


def _all_zero(c) -> bool:
  # False and 0 alike; a value that cannot be read may be zeros
  return _compat.all_zero(c, booleans=True, unknown=True)


#: the var sets of :class:`_Chains` that a call's inputs and outputs carry
#: as they are (``scalars`` is read from the operand's state on the way in)
_TAGS = ("roots", "products", "transposed")


class _Chains:
  """What the rules track through a jaxpr, and across the calls XLA
  inlines: ``chained``, var -> (family, whether a lifted value is among
  its constants, the constants' kind: ``"scalar"`` or ``"array"``, and an
  array's :meth:`uniformity`) for the result of a ``mul``/``div`` or
  ``add``/``sub`` of a runtime value and a constant of stock's module
  (which XLA reassociates with a further constant of the kind);
  ``uniform``, var -> its :meth:`uniformity` where known, and
  ``uniform_reads``, the lifted inputs (by :func:`uniform_reads`' index)
  whose elements all being one value would make a chain one XLA
  reassociates (an array of one value is a scalar's broadcast in stock's
  module);
  ``scalars``, the vars that are a scalar constant (broadcast too); and
  ``roots``, the vars that are a square root (or its reciprocal) of values
  computed from lifted inputs alone (XLA turns ``x / sqrt(c)`` into
  ``x * rsqrt(c)`` and folds the ``rsqrt`` in stock's module)."""
  __slots__ = ("chained", "scalars", "roots", "valued", "mapped", "products",
               "transposed", "bounded", "uniform", "uniform_reads")

  def __init__(self):
    self.chained: dict = {}
    self.uniform: dict = {}
    self.uniform_reads: set = set()
    # var -> ("max" or "min", whether the bound is computed from lifted
    # inputs alone): a runtime value bounded by a constant of stock's
    # module (XLA makes a clamp of a ``max`` and a ``min`` by constants,
    # as their order says)
    self.bounded: dict = {}
    self.scalars: set = set()
    self.roots: set = set()
    # the vars whose values (not only their positions: a scatter's or a
    # gather's indices) are computed from lifted inputs; None until a walk
    # starts with every lifted input as one
    self.valued: set | None = None
    self.mapped: set = set()   # the inputs ``into`` read valued or not
    # the vars that are a product of values computed from lifted inputs
    # alone (moved too): a constant in stock's module, which an addition
    # of a runtime value fuses with in the cache's (one rounding)
    self.products: set = set()
    # the vars computed from lifted inputs alone through a transpose: a
    # constant laid out anew in stock's module, where the cache's XLA
    # moves the transpose into a dot's dimensions (another kernel, another
    # order of summation)
    self.transposed: set = set()

  def constant_kind(self, x, state: _State) -> str | None:
    """``"scalar"`` for a scalar constant of stock's module (broadcast
    too), ``"array"`` for any other value that is one (not computed from a
    call argument), else None: XLA reassociates two constants of one kind
    (``(x * c1) * c2``)."""
    if self.scalar_constant(x, state):
      return "scalar"
    if state.varying or type(x) is _compat.Literal:
      return None
    return "array"

  def note_constant(self, v, c) -> None:
    """A constant of both modules (``v`` holding ``c``): an array of one
    value is a scalar's broadcast in both; any other array is known not
    to be one."""
    try:
      if np.size(c) > 1:
        if _compat.all_one_value(c):
          self.scalars.add(v)
        else:
          self.uniform[v] = frozenset()
    except Exception:   # (its values unread: it may be one value)
      pass

  def uniformity(self, x) -> frozenset | None:
    """For an array constant ``x``: ``frozenset()`` where its elements are
    known not to be all one value, the lifted inputs it moves whole where
    it is all one value exactly when they are, else None (it may be)."""
    if type(x) is _compat.Literal:
      return None
    return self.uniform.get(x)

  def one_kind(self, kinds: tuple, uniformities: tuple) -> bool:
    """Whether two constants of ``kinds`` (:meth:`constant_kind`, each
    with its :meth:`uniformity`) may be of one kind in stock's module,
    where XLA reassociates them: two scalars or two arrays; an array and a
    scalar where the array may be all one value (a scalar's broadcast
    there). An array that is so exactly when lifted inputs are: not here,
    and they are noted in ``uniform_reads`` (read by value per call)."""
    if None in kinds:
      return False
    if kinds[0] == kinds[1]:
      return True
    u = uniformities[kinds.index("array")]
    if u is None:
      return True
    self.uniform_reads.update(u)
    return False

  def scalar_constant(self, x, state: _State) -> bool:
    if state.varying:
      return False
    if type(x) is _compat.Literal:
      return np.size(x.val) == 1
    # (a one-element array too: XLA broadcasts it as a scalar)
    shape = getattr(x.aval, "shape", None)
    return x in self.scalars or shape is not None and math.prod(shape) == 1

  def into(self, outer_vars, ins: list, inner_vars) -> "_Chains":
    """The tags of a called jaxpr's inputs, from its operands'."""
    inner = _Chains()
    inner.uniform_reads = self.uniform_reads   # (one set, all depths)
    inner.valued = set()
    inner.mapped = set(inner_vars)
    for x, s, v in zip(outer_vars, ins, inner_vars):
      if (s.lifted if type(x) is _compat.Literal
          else self.valued is None or x in self.valued):
        inner.valued.add(v)
      if self.scalar_constant(x, s):
        inner.scalars.add(v)
      if type(x) is _compat.Literal:
        continue
      if x in self.chained:
        inner.chained[v] = self.chained[x]
      if x in self.uniform:
        inner.uniform[v] = self.uniform[x]
      for tag in _TAGS:
        if x in getattr(self, tag):
          getattr(inner, tag).add(v)
    return inner

  def out_of(self, inner: "_Chains", inner_vars, outer_vars) -> None:
    """A call's outputs tagged as its jaxpr's outputs are."""
    for v, x in zip(inner_vars, outer_vars):
      if type(v) is _compat.Literal:
        continue
      if v in inner.chained:
        self.chained[x] = inner.chained[v]
      if v in inner.uniform:
        self.uniform[x] = inner.uniform[v]
      for tag in ("scalars", *_TAGS):
        if v in getattr(inner, tag):
          getattr(self, tag).add(x)
      if self.valued is not None and v in inner.valued:
        self.valued.add(x)


def _walk(jaxpr, env: dict, lifted_literals: frozenset,
          nested_lifted: bool, chains: _Chains | None = None
          ) -> Finding | None:
  def read(x, slot) -> _State:
    if type(x) is _compat.Literal:
      if slot in lifted_literals:
        return _LIFTED
      return _CONSTANT._replace(zero=_all_zero(x.val))
    return env.get(x, _ARGUMENT)

  known: dict = {}   # var -> the NumPy scalar it holds (literal arithmetic)
  chains = _Chains() if chains is None else chains
  chained = chains.chained
  scalar_constant = chains.scalar_constant

  def scalar(x):
    if type(x) is _compat.Literal:
      return x.val if np.ndim(x.val) == 0 else None
    return known.get(x)

  if chains.valued is None:
    chains.valued = set()
  valued = chains.valued   # and every lifted input no call mapped
  valued.update(v for v in (*jaxpr.constvars, *jaxpr.invars)
                if v not in chains.mapped and env.get(v, _ARGUMENT).lifted)

  for n, e in enumerate(jaxpr.eqns):
    ins = [read(x, (n, i)) for i, x in enumerate(e.invars)]
    name = e.primitive.name
    # (a scatter's indices give positions, not values: one of constants at
    # lifted positions, a cross-entropy gradient's, sums alike; any other
    # operand that picks, a gather's or a select's, counts as a value)
    skip = (1,) if name.startswith("scatter") else ()
    if any(x in valued if type(x) is not _compat.Literal else s.lifted
           for i, (x, s) in enumerate(zip(e.invars, ins)) if i not in skip):
      valued.update(e.outvars)
    if (name in _REDUCTIONS and _signed(e) and e.invars
        and not any(s.varying for s in ins)
        and type(e.invars[0]) is not _compat.Literal
        and e.invars[0] in valued):
      return Finding("folds_constants", (
          f"`{name}` of values computed from lifted inputs alone: XLA's "
          "evaluator sums them at compile time in stock's module, in its "
          "own order, where the cache's module sums at run time (the last "
          "bits differ)"))
    if (name in _SCALAR or name == "convert_element_type") and not any(
        s.lifted or s.varying for s in ins):
      vals = [scalar(x) for x in e.invars]
      if vals and all(v is not None for v in vals) and len(e.outvars) == 1:
        value = _evaluate(name, vals, e.outvars[0].aval)
        if value is not None:
          known[e.outvars[0]] = value
          env[e.outvars[0]] = _CONSTANT._replace(zero=bool(value == 0))
          continue
    if name in _ZERO_SENSITIVE and _signed(e) and any(
        s.folded_by_stock_only for s in ins) and any(
            s.zero and not s.varying for s in ins):
      return Finding("folds_zero", (
          f"`{name}` takes a value computed from lifted inputs alone "
          "(a constant XLA folds in stock's module) and one that may "
          "be all zeros: XLA simplifies x + 0 to x, which keeps a -0.0 "
          "IEEE's sum does not (and folds max and min otherwise than "
          "the runtime)"))
    if (name == "broadcast_in_dim" and len(e.invars) == 1
        and scalar_constant(e.invars[0], ins[0])):
      chains.scalars.add(e.outvars[0])
    if ((name not in _EXACT_ON_CONSTANTS
         or _complex(e) and name not in _EXACT_ON_COMPLEX)
        and not name.startswith("scatter") and name not in _REDUCTIONS
        and _signed(e) and ins
        and not _jaxprs_in(e.params) and not any(s.varying for s in ins)
        and any(s.lifted and _inexact(x) for x, s in zip(e.invars, ins))):
      # (lifted floating values: lifted integers, a scatter's indices,
      # choose positions, which both modules compute alike. A scatter's
      # compile-time value may combine in another order: not modelled, as
      # a cross-entropy gradient scatters constants at lifted labels. A
      # contraction of such values, ``a @ b``, is a finding, and so is a
      # reduction, above, where values of lifted inputs reach it.)
      return Finding("folds_constants", (
          f"`{name}` of values computed from lifted inputs alone: XLA "
          "evaluates it at compile time in stock's module, with its own "
          "arithmetic, where the cache's module computes it at run time "
          "(the last bits differ)"))
    if (name not in _SHAPE_MOVES and ins and not any(s.varying for s in ins)
        and any(s.folded_by_stock_only for s in ins)
        and _narrow_float(*e.invars, *e.outvars)):
      return Finding("folds_constants", (
          f"`{name}` of a float narrower than 32 bits computed from lifted "
          "inputs alone: XLA's evaluator rounds to it after every operation "
          "in stock's module (and keeps another NaN payload for an 8-bit "
          "float), where the runtime computes in 32 bits and drops a "
          "rounding it finds excess"))
    if name == "pow" and any(s.lifted and not s.varying for s in ins):
      return Finding("folds_constants", (
          "`pow` of a value computed from lifted inputs alone: XLA rewrites "
          "a constant power in stock's module (x ** 3.0 as a product)"))
    found = _constant_divisor(e, ins, chains) or _complex_product(e, ins)
    if found:
      return found
    found = _fused(e, ins, chains)
    if found:
      return found
    if name in ("sqrt", "rsqrt") and ins and ins[0].folded_by_stock_only:
      chains.roots.add(e.outvars[0])
    lifted_alone = (bool(ins) and not any(s.varying for s in ins)
                    and any(s.folded_by_stock_only for s in ins))
    if (name in _PRODUCTS and _signed(e) and lifted_alone
        and not _exact_scaling(e, ins)):
      chains.products.add(e.outvars[0])   # (a square is a product too)
    if lifted_alone and (name == "transpose" or any(
        x in chains.transposed for x in e.invars
        if type(x) is not _compat.Literal)):
      chains.transposed.update(e.outvars)
    if name == "dot_general" and any(
        x in chains.transposed for x in e.invars
        if type(x) is not _compat.Literal):
      return Finding("folds_constants", (
          "`dot_general` of a transpose of values computed from lifted "
          "inputs alone (x @ W.T): stock's module lays the constant out "
          "transposed, the cache's XLA moves the transpose into the dot's "
          "dimensions and multiplies with another kernel, summing in "
          "another order"))
    if (e.invars and len(e.outvars) == 1 and name in _SCALAR_KEEPING
        and all(scalar_constant(x, s) for x, s in zip(e.invars, ins))):
      chains.scalars.add(e.outvars[0])   # a scalar's broadcast, computed on
    if (name in _WHOLE_MOVES or name == "convert_element_type"
        and _keeps_distinct(e.invars[0].aval.dtype,
                            e.params.get("new_dtype"))) and len(
        e.invars) == 1 and (type(e.invars[0]) is not _compat.Literal
                            and e.invars[0] in chains.uniform):
      # (each element moved, none dropped or rounded: one value exactly
      # where the operand is)
      for v in e.outvars:
        chains.uniform[v] = chains.uniform[e.invars[0]]
    if (name in _CHAIN_MOVES or name == "convert_element_type"
        and _narrow_float(*e.invars, *e.outvars)) and e.invars and (
            type(e.invars[0]) is not _compat.Literal):
      # (XLA's CPU computes a narrow float's arithmetic in float32 and
      # removes the conversions between, as excess precision allows: a
      # chain goes on through them)
      before = chained.get(e.invars[0])
      if before is not None:
        chained[e.outvars[0]] = before
      if e.invars[0] in chains.roots:
        chains.roots.add(e.outvars[0])
    if ((name in _MOVES or name in _SHAPE_MOVES) and e.invars
        and type(e.invars[0]) is not _compat.Literal
        and e.invars[0] in chains.products):
      # (a slice, a pad, a negation between: the runtime fuses through)
      chains.products.update(e.outvars)
    if name == "select_n" and len(e.invars) > 1 and not ins[0].varying:
      # a constant choice, which XLA folds where it sees the predicate (in
      # stock's module, a lifted one too): a chain goes on through it
      found_chains = {chained[x] for x in e.invars[1:]
                      if type(x) is not _compat.Literal and x in chained}
      if len({(c[0], c[2]) for c in found_chains}) > 1:
        return Finding("folds_constants", (
            "a choice by a constant predicate between results of operations "
            "by constants of two families or kinds (a product and a sum, "
            "by a scalar and by an array): XLA folds the choice and "
            "reassociates the chain it keeps"))
      before = next(iter(found_chains), None)
      if before is not None:
        # (the arm XLA keeps is not known here: an array of one value
        # where any may be)
        us = [c[3] for c in found_chains]
        before = (before[0], any(c[1] for c in found_chains), before[2],
                  None if None in us else frozenset().union(*us))
        # (a choice stock's module alone folds, by a lifted predicate:
        # the chain goes on there only)
        chained[e.outvars[0]] = (before if not ins[0].folded_by_stock_only
                                 else (before[0], True, *before[2:]))
    found = _reassociated(e, ins, chains)
    if found:
      return found
    found = _bounds(e, ins, chains.bounded)
    if found:
      return found
    if (name in _EXPANDED and e.invars
        and any(type(x) is not _compat.Literal
                and (c := chained.get(x, _NONE))[1]
                and chains.one_kind((c[2], "scalar"), (c[3], None))
                for x in e.invars)):
      return Finding("folds_constants", (
          f"`{name}` of the result of an operation by a lifted scalar: its "
          "lowering is arithmetic with constants (lgamma's x - 1, exp2's x "
          "* ln 2), which XLA folds together with that scalar in stock's "
          "module (reassociating), and rounds otherwise than the module "
          "that takes it as an argument"))
    outs, found = _nested(e, ins, nested_lifted, chains)
    if found:
      return found
    if outs is None:
      lifted = any(s.lifted for s in ins)
      varying = any(s.varying for s in ins)
      if name == "iota":   # 0, 1, 2, ...: all zeros only when one long
        zero = all(math.prod(v.aval.shape) <= 1 for v in e.outvars)
      elif not lifted and not varying and name not in _MOVES:
        zero = True   # constants alone: XLA may fold them to zeros
      elif name == "select_n":
        zero = len(ins) > 1 and all(s.zero for s in ins[1:])
      elif name.startswith("scatter") and len(ins) >= 3:
        zero = ins[0].zero and ins[2].zero   # operand and updates
      elif name == "sub" and len(e.invars) == 2 and _same_var(*e.invars):
        zero = True   # x - x
      elif name in _ALL_ZERO:
        zero = bool(ins) and all(s.zero for s in ins)
      else:   # a zero operand may give zeros (mul, dot, what is unknown)
        zero = any(s.zero for s in ins)
      outs = [_State(lifted, varying, zero)] * len(e.outvars)
    for v, s in zip(e.outvars, outs):
      env[v] = s
  return None


#: Primitives JAX lowers to an expansion in XLA's arithmetic (CHLO's
#: decompositions and JAX's own) that begins with constants applied to the
#: operand: XLA reassociates them with an operation by a constant that
#: gave the operand (``lgamma(x + c)``, ``acosh(x + c)``, ``exp2(x * c)``
#: measured to differ in the last bits; the rest of the family alike).
_EXPANDED = frozenset({
    "lgamma", "digamma", "igamma", "igammac", "igamma_grad_a",
    "random_gamma_grad", "polygamma", "zeta", "regularized_incomplete_beta",
    "erf_inv", "erf", "erfc", "bessel_i0e", "bessel_i1e", "acosh", "asinh",
    "atanh", "acos", "asin", "atan", "sinh", "cosh", "tan", "exp2"})
_NONE = (None, False, None, None)   # no chain (``chained``'s entries' shape)


def _bounds(e, ins: list, bounded: dict) -> Finding | None:
  """The finding where ``e`` bounds a runtime value by constants of
  stock's module, one at least a value computed from lifted inputs alone:
  a ``clamp``, or a ``max`` of a ``min`` (or the reverse), which XLA folds
  into a clamp in stock's module as the bounds' order says (crossed
  bounds: another NaN's sign). Notes a first bound in ``bounded``."""
  name = e.primitive.name
  if name == "clamp" and len(ins) == 3 and any(
      s.folded_by_stock_only for s in (ins[0], ins[2])):
    return Finding("folds_constants", (
        "`clamp` by a bound computed from lifted inputs alone: XLA folds "
        "a clamp by constants in stock's module, as their order says"))
  if (name not in ("max", "min") or len(ins) != 2
      or ins[0].varying == ins[1].varying):
    return None
  k = 0 if ins[1].varying else 1   # the bound's position (not varying)
  x = e.invars[1 - k]
  lifted = ins[k].folded_by_stock_only
  before = bounded.get(x) if type(x) is not _compat.Literal else None
  if before is not None and before[0] != name and (lifted or before[1]):
    return Finding("folds_constants", (
        f"`{name}` of a `{before[0]}` by constants, one computed from lifted "
        "inputs alone: XLA makes the two a clamp in stock's module, as the "
        "bounds' order says (crossed bounds keep another NaN's sign)"))
  bounded[e.outvars[0]] = (name, lifted)
  return None


#: the families XLA reassociates a scalar constant within
_FAMILY = types.MappingProxyType({"mul": "mul", "div": "mul", "add": "add",
                                  "add_any": "add", "sub": "add"})


def _reassociated(e, ins: list, chains: _Chains):
  """The finding where equation ``e`` and the one giving its runtime
  operand each take a constant of stock's module of one kind (two scalars,
  two arrays, or an array that may be all one value and a scalar:
  ``_Chains.one_kind``) in one family (``(x * c1) * c2``), or
  ``e`` adds two products of scalar constants (``x * c1 + x * c2``), a
  lifted value among those constants: XLA folds them together in stock's
  module only. Notes ``e``'s own result in ``chained``. None where there
  is nothing to find."""
  family = _FAMILY.get(e.primitive.name)
  chained = chains.chained
  kinds = [chains.constant_kind(x, s) for x, s in zip(e.invars, ins)]
  if e.primitive.name == "dot_general" and (
      "scalar" in kinds or _elementwise_dot(e)):
    # XLA rewrites a product by a one-element constant, and a dot that
    # sums nothing (batch dimensions and contracted ones of size 1 alone:
    # einsum("i,i->i"), an outer product), as a multiply
    family = "mul"
  found = _product_of_products(e, chains, kinds)
  if found:
    return found
  if family is None or len(e.invars) != 2 or not _signed(e):
    return None
  constant = [k is not None for k in kinds]
  if constant[0] != constant[1]:   # a runtime value and a constant
    k = constant.index(True)
    operand = e.invars[1 - k]
    before = chained.get(operand) if type(operand) is not _compat.Literal \
        else None
    lifted = ins[k].lifted
    # (a constant divided or subtracted by the chain, ``c - (x + 1.0)``,
    # is not reassociated: XLA turns ``x - c`` into ``x + -c`` only)
    commutes = k == 1 or e.primitive.name in ("mul", "add", "dot_general")
    if (before is not None and before[0] == family and commutes
        and (lifted or before[1]) and chains.one_kind(
            (before[2], kinds[k]), (before[3], chains.uniformity(
                e.invars[k])))):
      return Finding("folds_constants", (
          f"`{e.primitive.name}` takes a constant of stock's module "
          f"and the result of a `{family}` by another: XLA folds the two "
          "constants together there (reassociating the product or sum), "
          "and rounds otherwise than the module that takes a lifted one as "
          "an argument"))
    # (a constant divided by a runtime value, ``c / x``, starts no chain
    # XLA reassociates)
    if ins[1 - k].varying and (k == 1 or e.primitive.name != "div"):
      chained[e.outvars[0]] = (family, lifted, kinds[k],
                               chains.uniformity(e.invars[k]))
    return None
  if family == "add" and not any(constant):
    parts = [chained.get(x) if type(x) is not _compat.Literal else None
             for x in e.invars]
    if all(p is not None and p[0] == "mul" and chains.one_kind(
        (p[2], "scalar"), (p[3], None)) for p in parts) and any(
            p[1] for p in parts):
      return Finding("folds_constants", (
          f"`{e.primitive.name}` of two products by scalar constants of "
          "stock's module: XLA factors them there (x * c1 + x * c2 as "
          "x * (c1 + c2)), and rounds otherwise than the module that takes "
          "a lifted one as an argument"))
  return None


def _product_of_products(e, chains: _Chains, kinds: list):
  """The finding where ``e`` multiplies (or squares, raises, contracts)
  results of products by array constants of stock's module, a lifted
  value among them (``(x * C1) * (y * C2)``, ``square(x * C)``, a dot of
  two such): XLA gathers the constants there and multiplies them together
  (``(x * y) * (C1 * C2)``), rounding otherwise than the module that takes
  a lifted one as an argument. None where there is nothing to find."""
  name = e.primitive.name
  if name not in ("mul", "dot_general", "square", "integer_pow") or any(
      k is not None for k in kinds) or not _signed(e):
    return None
  parts = [chains.chained.get(x) if type(x) is not _compat.Literal
           else None for x in e.invars]
  if all(p is not None and p[0] == "mul" and p[2] == "array"
         for p in parts) and any(p[1] for p in parts):
    return Finding("folds_constants", (
        f"`{name}` of products by array constants of stock's module: XLA "
        "multiplies the constants together there ((x * C1) * (y * C2) as "
        "(x * y) * (C1 * C2)), and rounds otherwise than the module that "
        "takes a lifted one as an argument"))
  return None


def _constant_divisor(e, ins: list, chains: _Chains) -> Finding | None:
  """The finding where ``e`` divides by a value computed from lifted inputs
  alone (a constant in stock's module) that XLA rewrites there: an array
  (``x / c`` as ``x * (1 / c)``, the reciprocal folded), a square root
  (``x / sqrt(c)`` as ``x * rsqrt(c)``), or any complex divisor; the
  runtime divides in the cache's module, and the last bits differ. A real
  scalar divisor is divided by in both."""
  if e.primitive.name != "div" or len(e.invars) != 2 or not _signed(e):
    return None
  divisor, state = e.invars[1], ins[1]
  if not state.folded_by_stock_only:
    return None
  if (_complex(e) or not chains.scalar_constant(divisor, state)
      or (type(divisor) is not _compat.Literal and divisor in chains.roots)):
    return Finding("folds_constants", (
        "`div` by a value computed from lifted inputs alone (an array, a "
        "square root, or a complex number): XLA rewrites it in stock's "
        "module as a product by the reciprocal it folds at compile time, "
        "where the cache's module divides at run time (the last bits "
        "differ)"))
  return None


def _complex_product(e, ins: list) -> Finding | None:
  """The finding where ``e`` multiplies complex values by one computed from
  lifted inputs alone: XLA expands the product into real arithmetic in
  stock's module and simplifies it with the constant's parts (a zero
  imaginary part), where the cache's module computes it whole."""
  if e.primitive.name != "mul" or not _complex(e) or not any(
      s.folded_by_stock_only for s in ins):
    return None
  return Finding("folds_constants", (
      "complex `mul` by a value computed from lifted inputs alone: XLA "
      "simplifies the product with the constant's parts in stock's module "
      "(the last bits differ)"))


def _narrow_float(*vs) -> bool:
  """Whether one of ``vs`` (vars or literals) is a float narrower than 32
  bits (bfloat16, float16, the 8- and 4-bit floats)."""
  for v in vs:
    d = getattr(getattr(v, "aval", None), "dtype", None)
    name = str(d)
    if name.startswith(("float8", "float4", "bfloat16")) or name == "float16":
      return True
  return False


def _exact_scaling(e, ins: list) -> bool:
  """Whether ``e`` multiplies by a literal power of two (``-1.0 * b``,
  ``0.5 * c``) of the jaxpr's own, not one passed as an argument (a
  changed literal: another call's may be no power of two): a product
  rounded alike, folded or fused."""
  if e.primitive.name != "mul":
    return False
  for x, s in zip(e.invars, ins):
    if type(x) is _compat.Literal and np.ndim(x.val) == 0 and not s.lifted:
      try:
        v = abs(complex(x.val))
      except (TypeError, ValueError):
        return False
      return v != 0 and v == v and v != float("inf") and (
          math.frexp(v)[0] == 0.5)
  return False


def _fused(e, ins: list, chains: _Chains) -> Finding | None:
  """The finding where ``e`` adds a runtime value and a product of values
  computed from lifted inputs alone (``x + c * 1.5``, an Adam moment's
  ``0.9 * m + g``): stock's module folds the product to a constant and
  adds it, rounding twice; the cache's computes both at run time, where
  XLA fuses them into one multiply-add (one rounding)."""
  if e.primitive.name not in ("add", "add_any", "sub") or not _signed(e):
    return None
  if not any(s.varying for s in ins):
    return None
  for x, s in zip(e.invars, ins):
    if (type(x) is not _compat.Literal and not s.varying
        and x in chains.products):
      return Finding("folds_constants", (
          f"`{e.primitive.name}` of a runtime value and a product of values "
          "computed from lifted inputs alone: stock's module folds the "
          "product and rounds it before the addition, the cache's fuses "
          "the two into one multiply-add"))
  return None


def _complex(e) -> bool:
  """Whether an equation's result or an operand is complex."""
  # (a NumPy dtype's kind: an extended dtype, a PRNG key's, is none; its
  # operands too: ``abs`` of a complex value is a formula with a real
  # result)
  return any(isinstance(d := getattr(getattr(v, "aval", None), "dtype",
                                     None), np.dtype)
             and d.kind == "c" for v in (*e.outvars, *e.invars))


def _evaluate(name: str, vals: list, aval):
  """The NumPy scalar a scalar equation on known values gives, in its
  output's dtype; None where it cannot say (then it is read as any
  other equation)."""
  try:
    dtype = np.dtype(aval.dtype)
    with np.errstate(all="ignore"):
      args = [np.asarray(v, dtype) for v in vals]
      out = args[0] if name == "convert_element_type" else _SCALAR[name](*args)
    out = np.asarray(out, dtype)
    return out[()] if out.ndim == 0 else None
  except Exception:
    return None


def _inexact(x) -> bool:
  """Whether an operand holds floating or complex values."""
  return _compat.inexact_dtype(getattr(x.aval, "dtype", None))


def _signed(e) -> bool:
  """Whether an equation's result has signed zeros (a floating type)."""
  return any(_compat.inexact_dtype(getattr(v.aval, "dtype", None))
             for v in e.outvars)


def _same_var(a, b) -> bool:
  return type(a) is not _compat.Literal and a is b


def _jaxprs_in(params) -> list:
  found = []
  for k, p in params.items():
    if k in _NOT_INLINED:
      continue
    for q in (p if isinstance(p, (tuple, list)) else (p,)):
      if hasattr(q, "eqns") or hasattr(getattr(q, "jaxpr", None), "eqns"):
        found.append(q)
  return found


def _nested(e, ins: list, nested_lifted: bool, chains: _Chains):
  """``(output states or None, finding or None)`` of an equation holding
  jaxprs. A call maps its operands to its jaxpr's inputs one to one, a
  ``cond`` to each branch's; a loop's carry (and a scan's slice) is a
  loop parameter, a runtime value in both modules. Any other equation
  reads each jaxpr with every input as lifted and as zero as its most
  lifted, zero-most operand."""
  jaxprs = _jaxprs_in(e.params)
  if not jaxprs:
    return None, None
  p = e.params
  if "body_jaxpr" in p and "cond_nconsts" in p:
    # XLA removes a loop it finds to run once, and folds what it computed:
    # the carry is read as straight-line code's would be, joined over
    # iterations, and a chain goes on into the body and out of the loop
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    carry = list(ins[nc + nb:])
    body = _closed_or_open(p["body_jaxpr"])[0]
    for _ in range(8):
      _, found = _read(p["cond_jaxpr"], [*ins[:nc], *carry], nested_lifted)
      if found:
        return None, found
      inner = chains.into(e.invars[nc + nb:], carry, body.invars[nb:])
      outs, found = _read(p["body_jaxpr"], [*ins[nc:nc + nb], *carry],
                          nested_lifted, inner)
      if found:
        return None, found
      chains.out_of(inner, body.outvars, e.outvars)
      joined = [_join(c, o) for c, o in zip(carry, outs)]
      if joined == carry:
        return carry, None
      carry = joined
    return [_State(True, False, True)] * len(e.outvars), None
  groups = _compat.scan_groups(p) if e.primitive.name == "scan" else None
  if groups is not None:
    nc, ncarry = groups
    length, unroll = p.get("length"), p.get("unroll", 1)
    if not (length == 1 or unroll is True or (
        type(unroll) is int and length is not None and unroll >= length)):
      return _partly_unrolled(e, ins, nested_lifted, chains, groups)
    # removed or unrolled by XLA: straight-line code, the carry joined, a
    # chain on into the body, from one copy into the next (``(y * A) *
    # A``), and out of the loop
    carry = list(ins[nc:nc + ncarry])
    body = _closed_or_open(p["jaxpr"])[0]
    inner = None
    copies = 2 if type(length) is int and length > 1 else 1
    for copy in range(8):
      if inner is None:
        inner = chains.into(e.invars[:nc + ncarry], ins[:nc + ncarry],
                            body.invars[:nc + ncarry])
      else:   # (the previous copy's carry out, chains and all)
        inner = inner.into([*body.invars[:nc], *body.outvars[:ncarry]],
                           [*ins[:nc], *carry], body.invars[:nc + ncarry])
      outs, found = _read(p["jaxpr"], [*ins[:nc], *carry,
                                       *ins[nc + ncarry:]], nested_lifted,
                          inner)
      if found:
        return None, found
      chains.out_of(inner, body.outvars[:ncarry], e.outvars[:ncarry])
      joined = [_join(c, o) for c, o in zip(carry, outs)]
      if joined == carry and copy + 1 >= copies:
        return outs, None
      carry = joined
    return [_State(True, False, True)] * len(e.outvars), None
  call = next((p[k] for k in _CALL_JAXPR if k in p), None)
  if call is not None and len(jaxprs) == 1 and len(
      _compat.jaxpr_inputs(call)) == len(ins):
    # XLA inlines a call: a chain goes on across it, both ways
    inner, _ = _closed_or_open(call)
    inner_chains = chains.into(e.invars, ins, inner.invars)
    outs, found = _read(call, ins, nested_lifted, inner_chains)
    if chains.valued is not None:   # which outputs, as the call says
      chains.valued.difference_update(e.outvars)
    chains.out_of(inner_chains, inner.outvars, e.outvars)
    return outs, found
  if "branches" in p and len(ins) >= 1:
    # a constant index (in stock's module: a lifted one too): XLA inlines
    # the branch it picks, and a chain goes on into it and out
    inlined = not ins[0].varying
    outs, found = None, None
    for b in p["branches"]:
      inner, body = None, _closed_or_open(b)[0]
      if inlined:
        inner = chains.into(e.invars[1:], ins[1:], body.invars)
        if ins[0].folded_by_stock_only:   # inlined in stock's module only
          inner.chained = {v: (c[0], True, *c[2:])
                           for v, c in inner.chained.items()}
      b_outs, found = _read(b, ins[1:], nested_lifted, inner)
      if found:
        return None, found
      if inlined:
        chains.out_of(inner, body.outvars, e.outvars)
        if ins[0].folded_by_stock_only:
          for v in e.outvars:
            if v in chains.chained:
              c = chains.chained[v]
              chains.chained[v] = (c[0], True, *c[2:])
      outs = b_outs if outs is None else [_join(x, y)
                                          for x, y in zip(outs, b_outs)]
    return outs, None
  widest = _State(any(s.lifted for s in ins), False,
                  any(s.zero for s in ins))
  zero_out = widest.zero
  for j in jaxprs:
    outs, found = _read(j, [widest] * len(_compat.jaxpr_inputs(j)),
                        nested_lifted)
    if found:
      return None, found
    zero_out = zero_out or any(o.zero for o in outs)
  out = _State(widest.lifted, any(s.varying for s in ins), zero_out)
  return [out] * len(e.outvars), None


def _elementwise_dot(e) -> bool:
  """Whether a ``dot_general`` sums nothing: every contracted dimension of
  size 1 (or none), so XLA makes it an elementwise multiply (of
  broadcasts)."""
  try:
    (contract, _), _ = e.params["dimension_numbers"]
    shape = e.invars[0].aval.shape
    return all(shape[d] == 1 for d in contract)
  except (KeyError, TypeError, ValueError, AttributeError, IndexError):
    return False


def _partly_unrolled(e, ins: list, nested_lifted: bool, chains: _Chains,
                     groups: tuple):
  """``_nested``'s answer for a scan XLA keeps as a loop: its carry (and
  slice) a loop parameter, read once; and where it is unrolled by ``k >
  1`` (each trip runs ``k`` copies of the body, the carry passed from one
  to the next as straight-line code), read a second time on the first
  copy's carry, a chain going on from one copy into the next (``(x * c) *
  c``: XLA reassociates it in stock's module)."""
  p, (nc, ncarry) = e.params, groups
  unroll = p.get("unroll", 1)
  body = _closed_or_open(p["jaxpr"])[0]
  loop = [_loop_parameter(s) for s in ins[nc:]]
  first = chains.into(e.invars[:nc], ins[:nc], body.invars[:nc])
  outs, found = _read(p["jaxpr"], [*ins[:nc], *loop], nested_lifted, first)
  if found:
    return None, found
  if type(unroll) is int and unroll > 1 and len(outs) >= ncarry:
    second = first.into([*body.invars[:nc], *body.outvars[:ncarry]],
                        [*ins[:nc], *outs[:ncarry]],
                        [*body.invars[:nc], *body.invars[nc:nc + ncarry]])
    again, found = _read(p["jaxpr"], [*ins[:nc], *outs[:ncarry],
                                      *loop[ncarry:]], nested_lifted, second)
    if found:
      return None, found
    outs = [_join(a, b) for a, b in zip(outs, again)]
  return [_loop_parameter(o) for o in outs], None


def _join(a: _State, b: _State) -> _State:
  return _State(a.lifted or b.lifted, a.varying or b.varying,
                a.zero or b.zero)


def _keeps_distinct(old, new) -> bool:
  """Whether a conversion from dtype ``old`` to ``new`` keeps distinct
  values distinct: the same dtype (a weak type made strong), or a float
  widened (a large integer made a float may round to another's value)."""
  try:
    old, new = np.dtype(old), np.dtype(new)
  except TypeError:
    return False
  return old == new or (old.kind == new.kind == "f"
                        and new.itemsize >= old.itemsize)


def _loop_parameter(s: _State) -> _State:
  """A value a loop carries or slices: a parameter of the loop's body,
  which XLA folds in neither module."""
  return _State(s.lifted, True, False)


def _read(j, ins: list, nested_lifted: bool, chains: _Chains | None = None):
  """``(output states, finding)`` of a nested jaxpr given its inputs'
  (and, for a call, their ``chains``, which the walk extends)."""
  inner, consts = _closed_or_open(j)
  env = {v: (_LIFTED if nested_lifted else _CONSTANT._replace(
      zero=_all_zero(c))) for v, c in zip(inner.constvars, consts)}
  env.update(zip(inner.invars, ins))
  if not nested_lifted and consts:
    chains = _Chains() if chains is None else chains
    for v, c in zip(inner.constvars, consts):
      chains.note_constant(v, c)
  found = _walk(inner, env, frozenset(), nested_lifted, chains)
  if found:
    return None, found
  return [_read_literal(v) if type(v) is _compat.Literal
          else env.get(v, _ARGUMENT) for v in inner.outvars], None


def _read_literal(v) -> _State:
  return _CONSTANT._replace(zero=_all_zero(v.val))


def _closed_or_open(j):
  # (a closed jaxpr has ``eqns`` too: its constants are read first)
  if isinstance(j, _compat.ClosedJaxpr):
    return _compat.closed_parts(j)
  return j, ()
