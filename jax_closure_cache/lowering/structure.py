"""A jaxpr's structure, as the key of the lowering it shares (tier A).

Two closed jaxprs with equal :func:`of` keys lower to the same computation
once their constants (and their top-level floating-point literals) are
passed as arguments: the key holds every input and output type (dtype,
weak type, sharding), each equation's primitive, parameters and operands
(variables numbered by first use), effects and the debug names the
lowering prints; it holds no constant's value.

Invariants:
* No user equality: atoms by exact type and bits (``0.0`` and ``-0.0``,
  ``1`` and ``True`` differ), containers in their order; a value of a
  class jax does not define (a callable, a user object) by identity, as a
  lowering that calls back into Python holds that very object; each
  equation's context (``threefry_partitionable``, ``compute_on``, XLA
  metadata: JAX interns it) by identity.
* Nested jaxprs by their own structure; their constants by value when
  small, else the jaxpr is not shared (:class:`NotShared`).
* Parameters no lowering reads (a custom rule's differentiation
  functions, :data:`NOT_LOWERED`) are left out.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
import operator
import types
import weakref
from typing import Any, NamedTuple

import numpy as np

from jax_closure_cache import cache
from jax_closure_cache.atoms import float_key
from jax_closure_cache.lowering import folding
from jax_closure_cache._compat import lowering as _compat

#: Constants of nested jaxprs up to this many elements are keyed by value.
NESTED_CONST_ELEMENTS = 1 << 12

#: Per primitive, the parameters its lowering never reads: the custom
#: rules' differentiation functions (made afresh by every trace), which
#: only transformations at trace time use, and the source placement a
#: ``device_put`` records for its transpose.
NOT_LOWERED = types.MappingProxyType({
    "device_put": frozenset({"srcs"}),
    "custom_jvp_call": frozenset({"jvp_jaxpr_fun", "jvp_jaxpr_thunk",
                                  "symbolic_zeros"}),
    "custom_vjp_call": frozenset({"fwd_jaxpr_thunk", "bwd", "out_trees",
                                  "symbolic_zeros"}),
})


class NotShared(Exception):
  """The jaxpr holds what its structure cannot key (the reason)."""


class Identity:
  """An object keyed by identity (holding it, so its id is not reused)."""
  __slots__ = ("obj",)

  def __init__(self, obj):
    self.obj = obj

  def __eq__(self, other):
    return type(other) is Identity and other.obj is self.obj

  def __hash__(self):
    return id(self.obj)

  def __repr__(self):
    return f"<{type(self.obj).__name__} by identity>"


class Structure(NamedTuple):
  """``key`` (hashable, no constant's value), the values of the top-level
  floating-point literals (``literals``, which a shared lowering may take
  as arguments) and their bits (``bits``, compared where it does not), and
  the constants of the top-level nested jits (``hoisted``, which a shared
  lowering takes as arguments, :func:`hoists`), and ``fixed``, the dtype
  and bits of every other top-level literal and, where a literal may be
  lifted, of every literal and one-element constant of the jaxprs it
  holds (constants of stock's module and of the shared one); ``held``,
  each of ``literals``' dtype and bytes (:func:`held_value`)."""
  key: tuple
  literals: tuple
  bits: tuple
  hoisted: tuple = ()
  fixed: frozenset = frozenset()
  held: tuple = ()


def of(closed) -> Structure:
  """The structure of a closed jaxpr pjit lowers; raises :class:`NotShared`."""
  jaxpr, _ = _compat.closed_parts(closed)
  literals: list = []
  bits: list = []
  hoisted: list = []
  fixed: set = set()
  held: list = []
  key = _open_structure(jaxpr, literals, bits, hoisted, fixed=fixed,
                        held=held)
  if literals:
    # and those of the jaxprs it holds: constants of both modules, which
    # XLA inlines beside the top level's and merges with an equal one
    fixed |= _params_values(jaxpr.eqns)
  return Structure(key, tuple(literals), tuple(bits), tuple(hoisted),
                   frozenset(fixed), tuple(held))


#: :func:`constant_refusal`'s answer for a jax array, by identity while
#: the array lives (``id -> (weak reference, answer)``): its values, devices
#: and commitment never change, so an array closed over call after call is
#: read once, not copied to the host on every call.
_ARRAY_ANSWERS = cache.STORE.table("structure.array_answers",
                                   cache.Store.CALLS)


def acceptable_constant(c) -> bool:
  """A constant a shared executable can take as an argument: a NumPy array
  or scalar (jax's own subclasses too), a Python number, or a jax array
  on one device not committed to it; never a boolean one, one holding a
  -0.0, a NaN or a subnormal, or one of zeros (XLA folds those by value
  once baked; one all 1, -1 or an infinity where an operation XLA removes
  by it reads it: :func:`identity_constant`)."""
  return constant_refusal(c) is None


def constant_refusal(c) -> str | None:
  """Why ``c`` cannot be an argument of a shared executable (None: it can;
  see :func:`acceptable_constant`). Reads a jax array's values once while
  it lives, a NumPy array's on every call (it may be changed in place)."""
  return constant_answer(c)[0]


def constant_answer(c) -> tuple:
  """``(constant_refusal(c), by_value)``, read once: ``by_value``, whether
  the refusal is for ``c``'s values alone (a boolean, a zero, a NaN, a
  subnormal), a constant stock's module computes with by value, which a
  shared lowering may bake as stock does, keyed by its bytes
  (``shared._baked_constants``)."""
  return _read_once(_ARRAY_ANSWERS, _answer, c)


def _answer(c) -> tuple:
  placement = _placement_refusal(c)
  if placement is not None:
    return placement, False
  refusal = _refusal(c)
  return refusal, refusal is not None


#: :func:`identity_constant`'s answer for a jax array, as
#: :data:`_ARRAY_ANSWERS` keeps :func:`constant_refusal`'s.
_IDENTITY_ANSWERS = cache.STORE.table("structure.identity_answers",
                                      cache.Store.CALLS)


def identity_constant(c, partly: bool = False) -> bool:
  """Whether ``c`` is all 1, -1 or an infinity
  (``_compat.all_identity``): a constant XLA removes an operation by in
  stock's module (:func:`constant_reads` says which constants such an
  operation reads); with ``partly``, whether any element is one (a part
  of the constant is read). A jax array's values are read once while it
  lives."""
  return _read_once(_IDENTITY_ANSWERS, _identity_answer, c)[partly]


def _identity_answer(c) -> tuple:
  return _compat.all_identity(c), _compat.all_identity(c, True)


#: :func:`lifted_refusal`'s reading of a jax array (:func:`leaf_answer`),
#: kept as :data:`_ARRAY_ANSWERS` keeps :func:`constant_refusal`'s.
LEAF_ANSWERS = cache.STORE.table("structure.leaf_answers",
                                 cache.Store.CALLS)

#: :func:`lifted_refusal`'s answer for a leaf all 1, -1 or an infinity.
IDENTITY_LEAF = ("an array all 1, -1 or an infinity that an operation XLA "
                 "removes by it reads (x * 1, max(x, -inf)): stock's module "
                 "removes it, where the runtime's flushes a subnormal x and "
                 "keeps a NaN's sign")
#: :func:`lifted_refusal`'s answer for a leaf holding a -0.0 of which a
#: part is taken.
NEGATIVE_ZERO_LEAF = ("an array holding a -0.0 of which a part is taken "
                      "(c[0]): stock's module folds the part, giving 0.0")
#: :func:`lifted_refusal`'s answer for a leaf of one value.
UNIFORM_LEAF = ("an array of one value that a chain of operations by "
                "constants reads ((x * c) * 0.7): stock's module makes it a "
                "scalar's broadcast and folds the two constants together, "
                "rounding once where the runtime rounds twice")
#: :func:`lifted_refusal`'s answer for a leaf of zeros.
ZERO_LEAF = ("an array of zeros that an addition reads (x + 0): stock's "
             "module removes it, keeping a -0.0 and a subnormal x that the "
             "runtime's addition makes 0.0")


class LeafReads(NamedTuple):
  """Which lifted leaves (by index) an operation XLA removes by their
  value reads: ``by_identity`` where all 1, -1 or an infinity, ``by_zero``
  where all zeros, ``partly`` those where any element counts, and
  ``by_uniform`` where all one value (``ConstantReads``' fields of the
  same names)."""
  by_identity: frozenset
  by_zero: frozenset
  partly: frozenset = frozenset()
  by_uniform: frozenset = frozenset()

  def merged(self, other: "LeafReads") -> "LeafReads":
    """Both reads, field by field."""
    return LeafReads(*(a | b for a, b in zip(self, other)))


#: The bits of :func:`_leaf_answer`: a refusal by tier A's rules; all (or
#: any element) 1, -1 or an infinity; all (or any element) zero; any
#: element -0.0; more than one element, all one value.
(REFUSED, ALL_IDENTITY, ANY_IDENTITY, ALL_ZERO, ANY_ZERO, NEGATIVE_ZERO,
 UNIFORM) = (1, 2, 4, 8, 16, 32, 64)


def value_masks(reads: LeafReads | None, n: int) -> tuple:
  """Per lifted leaf (of ``n``), the answer bits that refuse it under
  ``reads`` (every leaf read as a whole and by part where None): a
  refusal always; 1, -1 or an infinity where an operation reads it so;
  zeros where an addition does; a -0.0 where a part is taken
  (``reads.partly``: XLA folds ``c[0]`` of a baked array to a 0.0)."""
  masks = []
  for i in range(n):
    mask = REFUSED
    part = reads is None or i in reads.partly
    if part:
      mask |= NEGATIVE_ZERO
    if reads is None or i in reads.by_identity:
      mask |= ANY_IDENTITY if part else ALL_IDENTITY
    if reads is None or i in reads.by_zero:
      mask |= ANY_ZERO if part else ALL_ZERO
    if reads is None or i in reads.by_uniform:
      mask |= UNIFORM
    masks.append(mask)
  return tuple(masks)


def lifted_refusal(leaves, reads: LeafReads | None,
                   masks: tuple | None = None) -> str | None:
  """Why the closure key's lifted ``leaves`` cannot be passed this call to
  an executable that takes them as arguments, where stock's module bakes
  them: tier A's rules for a constant (:func:`constant_refusal`: a NaN, a
  subnormal, a boolean; a -0.0 in an array stored as an iota), and
  :data:`IDENTITY_LEAF`, :data:`ZERO_LEAF`, :data:`NEGATIVE_ZERO_LEAF` or
  :data:`UNIFORM_LEAF` for a leaf ``reads`` names (every leaf where it is
  None); None where they can. ``masks``: :func:`value_masks` of ``reads``,
  where the caller keeps them. A jax array is read once while it lives."""
  if masks is None or len(masks) != len(leaves):
    masks = value_masks(reads, len(leaves))
  for c, mask in zip(leaves, masks):
    bits, refusal = leaf_answer(c)
    if bits & mask:
      if bits & REFUSED:
        return refusal
      if bits & mask & (ALL_IDENTITY | ANY_IDENTITY):
        return IDENTITY_LEAF
      if bits & mask & NEGATIVE_ZERO:
        return NEGATIVE_ZERO_LEAF
      if bits & mask & UNIFORM:
        return UNIFORM_LEAF
      return ZERO_LEAF
  return None


def leaf_answer(c) -> tuple:
  """``(bits, refusal)`` of a lifted leaf (:func:`_leaf_answer`); a jax
  array's kept in :data:`LEAF_ANSWERS` by its id while it lives (``id ->
  (weak reference, answer)``), which a hit's check reads
  inline."""
  known = LEAF_ANSWERS.get(id(c))
  if known is not None and known[0]() is c:
    return known[1]
  return _read_once(LEAF_ANSWERS, _leaf_answer, c)


def uniform_constant(c) -> bool:
  """``_compat.all_one_value(c)``, read from :func:`leaf_answer` (a jax
  array's kept while it lives) where that answer holds it: tier A's
  per-call check of a constant a chain reads where all one value."""
  bits, _ = leaf_answer(c)
  if bits & REFUSED or _compat.extended_dtype(getattr(c, "dtype", None)):
    return _compat.all_one_value(c)   # (not read into the answer)
  return bool(bits & UNIFORM)


def leaves_known(leaves, masks, answers: dict = LEAF_ANSWERS) -> bool:
  """Whether every leaf has an answer kept in ``answers``
  (:data:`LEAF_ANSWERS`: the leaf itself, alive) with none of the bits its
  mask (:func:`value_masks`) refuses: a hit's value check passes without
  reading a value. False sends the caller to :func:`lifted_refusal`. The
  extension ``front/_entrance.c`` has the same loop in C."""
  if len(leaves) != len(masks):
    return False
  for c, mask in zip(leaves, masks):
    known = answers.get(id(c))
    if known is None or known[0]() is not c or known[1][0] & mask:
      return False
  return True


#: :func:`_leaf_answer` for an array with no element XLA folds by
_ORDINARY = (0, None)


def _leaf_answer(c) -> tuple:
  """``(bits, refusal)``: :data:`REFUSED` with tier A's reason, or which
  of all (any element) 1, -1 or an infinity and all (any element) zero
  hold, whether all its elements are one value, and whether any element
  is -0.0 (which a part taken loses; XLA
  keeps it in a whole array, baked or not, except one it stores as an
  iota: :func:`_stored_as_iota`, refused). A leaf of an extended
  dtype (a typed PRNG key) has no values XLA folds by; one whose values
  cannot be read is refused."""
  if _compat.extended_dtype(getattr(c, "dtype", None)):
    return _ORDINARY
  try:
    refusal = _refusal(c, zeros=False, negative_zero=False)
    if refusal is not None:
      return REFUSED, refusal
    negative = _negative_zero(c)
    if negative and _stored_as_iota(c):
      return REFUSED, _IOTA_WITH_NEGATIVE_ZERO
    bits = ((NEGATIVE_ZERO if negative else 0)
            | (ALL_IDENTITY if _compat.all_identity(c) else 0)
            | (ANY_IDENTITY if _compat.all_identity(c, True) else 0)
            | (ALL_ZERO if _compat.all_zero(c) else 0)
            | (ANY_ZERO if _compat.all_zero(c, partly=True) else 0)
            | (UNIFORM if _compat.all_one_value(c) else 0))
  except Exception as e:   # (a transfer refused, say): never an error
    return REFUSED, f"its values could not be read ({type(e).__name__})"
  return (bits, None) if bits else _ORDINARY


#: :func:`_leaf_answer`'s refusal of an array :func:`_stored_as_iota`.
_IOTA_WITH_NEGATIVE_ZERO = (
    "an array holding a -0.0 whose values are 0, s, 2s, ... (XLA stores "
    "such a baked constant as an iota, giving 0.0)")


def _stored_as_iota(c) -> bool:
  """Whether ``c``'s elements in order (flattened, as a folded reshape
  makes them) are 0, s, 2s, ... by value (``-0.0 == 0``): XLA's simplifier
  may store such a baked constant as an iota, a -0.0 of it as 0.0. A
  complex array counts always (its imaginary -0.0 is lost the same way)."""
  v = np.asarray(c).ravel()
  if np.iscomplexobj(v):
    return True
  v = v.astype(np.float64)
  step = v[1] - v[0] if v.size > 1 else 0.0
  return bool(v.size and v[0] == 0 and np.array_equal(
      v, np.arange(v.size) * step))


def _read_once(table: dict, read, c):
  """``read(c)``; for a jax array (whose values, devices and commitment
  never change: ``_compat.IMMUTABLE_ARRAYS``, a typed PRNG key's too),
  kept in ``table`` by its id while it lives."""
  if type(c) not in _compat.IMMUTABLE_ARRAYS:
    return read(c)
  known = table.get(id(c))
  if known is not None and known[0]() is c:
    return known[1]
  answer = read(c)
  try:
    ref = weakref.ref(c, functools.partial(_forget, table, id(c)))
  except TypeError:
    return answer
  table[id(c)] = (ref, answer)
  return answer


def _forget(table: dict, i: int, ref) -> None:
  known = table.get(i)
  if known is not None and known[0] is ref:   # not a later array's
    table.pop(i, None)


def _refusal(c, zeros: bool = True,
             negative_zero: bool = True) -> str | None:
  t = type(c)
  if t is bool or getattr(c, "dtype", None) == np.bool_:
    # XLA folds a constant predicate (``x * convert(mask)``), and rewrites
    # it as an argument into a select: the sign of a zero differs
    return "a boolean constant"
  placement = _placement_refusal(c)
  if placement is not None:
    return placement
  if negative_zero and _negative_zero(c):
    # XLA folds a part taken of a baked array (c[0]) to 0.0 where it is
    # -0.0 (lifted leaves are refused so only where a part is taken:
    # _leaf_answer)
    return "a constant holding a -0.0"
  if zeros and _compat.all_zero(c):
    # XLA folds x + c to x for a baked c of zeros, keeping x's -0.0
    return "a constant of zeros (XLA folds x + 0 in stock's module)"
  if _compat.holds_nan(c):
    # XLA folds max(x, nan) with a baked NaN to a NaN of another sign
    return "a constant holding a NaN (XLA folds it in stock's module)"
  if _compat.holds_subnormal(c):
    # XLA folds a baked subnormal exactly; the runtime reads an argument's
    # as a zero (x < 1e-40 in float32)
    return ("a constant holding a subnormal value (the runtime flushes an "
            "argument's to zero, XLA folds stock's exactly)")
  return None


def _placement_refusal(c) -> str | None:
  """Why ``c`` is neither an argument of a shared executable nor a value
  one may bake: committed to a device, on more than one, or of a type
  other than arrays and numbers; or None."""
  t = type(c)
  if t is _compat.ArrayImpl and _compat.committed(c):
    return "a constant committed to a device"
  if t is _compat.ArrayImpl and not _compat.single_device(c):
    return "a constant on more than one device"
  if (t is _compat.ArrayImpl or t is np.ndarray
      or isinstance(c, _compat.np_generic)
      or t in (int, float, bool, complex)
      or (isinstance(c, np.ndarray) and _compat.defined_by_jax(t))):
    return None
  return f"a constant of type {t.__name__}"


def constants_as_inputs(e) -> tuple[list, dict]:
  """A nested jit equation's constants, and its parameters with those
  constants made its leading inputs (unspecified shardings and layouts,
  never donated, as pjit's hoisted constants): the same computation when
  the constants are passed first."""
  inner, consts = _compat.closed_parts(e.params["jaxpr"])
  k = len(consts)
  params = dict(e.params)
  params["jaxpr"] = _compat.with_leading_inputs(
      inner, [*inner.constvars, *inner.invars], inner.eqns, inner.outvars, k)
  params["in_shardings"] = ((_compat.UNSPECIFIED,) * k
                            + tuple(params["in_shardings"]))
  params["in_layouts"] = (None,) * k + tuple(params["in_layouts"])
  params["donated_invars"] = (False,) * k + tuple(params["donated_invars"])
  return list(consts), params


def nested_jit_constants(e) -> list:
  """The constants an equation's nested jit closes over (none for another
  primitive, or a nested jaxpr without constants)."""
  if e.primitive.name not in _JITS:
    return []
  inner = e.params.get("jaxpr")
  if type(inner) is not _compat.ClosedJaxpr:
    return []
  return list(_compat.closed_parts(inner)[1])


def hoists(e) -> bool:
  """Whether a top-level equation is a nested jit whose constants (closed
  over by an inner ``jax.jit``) a shared lowering passes as arguments."""
  consts = nested_jit_constants(e)
  return bool(consts) and all(map(acceptable_constant, consts))


def lifted_literal(v) -> bool:
  """Whether a top-level operand is a literal a shared lowering can take as
  an argument: a floating-point or complex scalar whose value, as its
  dtype holds it, is neither a zero nor a NaN (XLA folds those otherwise
  than it computes with an argument; ``1e-50`` is a float32 zero). As an
  equation's operand also: at a position :func:`keyed_operands` does not
  name, of an equation that reads a runtime value (:func:`lifted_operands`)."""
  return type(v) is _Literal and literal_facts(v).liftable


class LiteralFacts(NamedTuple):
  """What the structure reads off a literal, all from its value's exact
  type and bits and its dtype: ``atom``, its key (:func:`_atom`);
  ``refusal``, why no shared lowering may hold it (:func:`_check_literal`)
  or None; ``liftable``, whether a shared lowering may take it as an
  argument (:func:`_liftable_value`); ``identity``, whether it is all 1,
  -1 or an infinity (``_compat.all_identity``); ``held``, its dtype and
  its value's bytes as the dtype holds it (:func:`held_value`), or None
  where that dtype cannot hold it."""
  atom: tuple
  refusal: str | None
  liftable: bool
  identity: bool
  held: tuple | None


#: (atom, dtype) -> :class:`LiteralFacts`: a pure function of the key, so
#: a trace's literals (the same few constants of a library's functions,
#: call after call) are read once; emptied when it reaches
#: :data:`LITERAL_CAPACITY` (a schedule's value is new every step)
_LITERALS = cache.STORE.table("structure.literal_facts", cache.Store.CALLS)
LITERAL_CAPACITY = 4096


def literal_facts(v) -> LiteralFacts:
  """:class:`LiteralFacts` of the literal ``v``."""
  atom = _atom(v.val)
  dtype = v.aval.dtype
  key = (atom, dtype)
  facts = _LITERALS.get(key)
  if facts is None:
    facts = _read_literal(v, atom, dtype)
    if len(_LITERALS) >= LITERAL_CAPACITY:
      _LITERALS.clear()
    _LITERALS[key] = facts
  return facts


def _read_literal(v, atom: tuple, dtype) -> LiteralFacts:
  try:
    _check_literal(v)
  except NotShared as e:
    return LiteralFacts(atom, str(e), False, False, None)
  return LiteralFacts(
      atom, None, dtype.kind in "fc" and _liftable_value(v.val, dtype),
      _compat.all_identity(_python_value(v.val)),
      held_value(np.asarray(v.val, dtype)))


def held_value(a: np.ndarray) -> tuple:
  """An array's dtype and bytes: a constant of stock's module as XLA
  holds it (a literal's Python float and its float32 array alike)."""
  return (a.dtype, a.shape, a.tobytes())


def _liftable_value(x, dtype) -> bool:
  """Whether a floating or complex scalar literal, as ``dtype`` holds it,
  is neither a zero (of either sign), a NaN nor subnormal (the runtime
  flushes an argument's to zero, XLA folds stock's exactly; either part
  of a complex); 1, -1 and the infinities are keyed where an operation
  XLA removes by them reads them (:func:`keyed_operands`): read on a
  Python number
  (a literal nearly always is one), as making arrays for :func:`_zero`
  and ``holds_nan`` costs ten times more. A literal its dtype cannot
  hold is refused by :func:`_check_literal` first."""
  if isinstance(x, (float, complex)) or np.ndim(x) == 0:
    s = np.asarray(x, dtype).item()
    if isinstance(s, (float, complex)):
      tiny = _compat.smallest_normal(dtype)
      return (bool(s) and s == s
              and not any(0 < abs(p) < tiny for p in (s.real, s.imag)))
    x = s
  a = np.asarray(x, dtype)
  return (not _zero(a) and not _compat.holds_nan(x)
          and not _compat.holds_subnormal(a))


def _check_literal(v) -> None:
  """Raises :class:`NotShared` for a Python number its floating dtype
  cannot hold (``1e300`` as float32): JAX's lowering warns of the overflow
  each time it lowers it, which a shared lowering would not."""
  x = v.val
  if isinstance(x, (float, complex)) and v.aval.dtype.kind in "fc":
    big = _compat.largest_finite(v.aval.dtype)
    if any(abs(p) > big and p - p == 0 for p in (x.real, x.imag)):
      raise NotShared("a literal its dtype cannot hold (JAX's lowering warns "
                      "of its overflow every time)")


#: Operands (by primitive, their positions) whose literal stays in the key,
#: never an argument: XLA rewrites ``pow`` by a constant exponent (2.0 into
#: a product, 0.5 into a square root), many times faster than the general
#: ``pow`` an argument exponent compiles to; and it computes a remainder
#: with a constant otherwise than with an argument (``lax.rem(x, 2.0)``: a
#: subnormal ``x`` kept where the argument's flushes it, a NaN's sign).
KEYED_OPERANDS = types.MappingProxyType({
    "pow": frozenset({1}), "rem": frozenset({0, 1}),
    # special functions lowered to a computation over each operand apart
    # (``lgamma(a)`` inside ``igamma(a, x)``), which XLA folds for a
    # constant: another last bit; and ``atan2(x, 1.0)``, rewritten
    **{name: frozenset({0, 1, 2}) for name in (
        "atan2", "igamma", "igammac", "igamma_grad_a", "random_gamma_grad",
        "polygamma", "zeta", "regularized_incomplete_beta")},
    # a comparison's: XLA rewrites ``select(x > c, x, c)`` into ``max(x,
    # c)`` (whose CPU kernel flushes a subnormal ``x``) where the two are
    # one constant, as its CSE makes equal constants
    **{name: frozenset({0, 1}) for name in ("eq", "ne", "lt", "le", "gt",
                                            "ge")},
    # bounds: XLA folds ``max(min(x, hi), lo)`` into a clamp, and a clamp
    # by constants, as their order says (crossed bounds: a NaN's sign)
    "max": frozenset({0, 1}), "min": frozenset({0, 1}),
    "clamp": frozenset({0, 1, 2})})

#: What a value computed from a literal or constant operand and literals
#: alone may not meet, for the operand to be passed as an argument (nor a
#: remainder's operands, :data:`KEYED_OPERANDS`). XLA inlines calls and
#: sinks a loop's constants into its body, then folds what is computed
#: from the constant alone; a comparison or a sign of it decides which
#: operations remain (jnp's ``x // c`` and ``x % c``: another last bit of
#: a large quotient, a subnormal kept, a NaN's sign). Such an operand is
#: keyed by value.
_READ_AS_VALUE = frozenset({"sign", "eq", "ne", "lt", "le", "gt", "ge",
                            "floor", "ceil", "round", "is_finite"})
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
#: How deep :func:`_reads_as_value` follows nested jaxprs (deeper: read as
#: a value)
_NESTING = 8


def keyed_operands(e, facts: list | None = None) -> frozenset:
  """The positions of ``e``'s operands whose literals are keyed by value:
  :data:`KEYED_OPERANDS`; a literal 1, -1 or infinity that an operation of
  :data:`_BY_IDENTITY` reads (here, or moved inside a jaxpr ``e`` holds);
  and, for an equation holding jaxprs, an operand a jaxpr reads as a value
  (:func:`_reads_as_value`). ``facts``: each operand's
  :class:`LiteralFacts` (None for a variable), where the caller has
  them."""
  keyed = KEYED_OPERANDS.get(e.primitive.name, frozenset())
  if facts is None:
    facts = [literal_facts(v) if type(v) is _Literal else None
             for v in e.invars]
  literals = [i for i, f in enumerate(facts) if f is not None]
  if not literals:
    return keyed
  identity = [i for i in literals if facts[i].identity]
  if not _holds_jaxpr(e):
    if identity and _removes_by_identity(e):
      return keyed | frozenset(identity)
    return keyed
  return keyed | frozenset(
      i for i in literals
      if _operand_read_as_value(e, i, _NESTING)
      or i in identity and _operand_read_as_value(e, i, _NESTING,
                                                  by_identity=True))


def _python_value(x):
  """A literal's value as a Python number where it is a scalar (NumPy's
  too), else as it is (``_compat.all_identity`` reads either)."""
  return x.item() if isinstance(x, np.generic) else x


def _operand_read_as_value(e, i: int, depth: int,
                           by_identity: bool = False,
                           by_zero: bool = False,
                           by_part: bool = False,
                           by_derived: bool = False,
                           fixed=(), by_decision: bool = False) -> bool:
  """Whether operand ``i`` of an equation holding jaxprs is read as a
  value by one of them (:func:`_reads_as_value`; with ``by_identity``:
  moved to an operation of :data:`_BY_IDENTITY`; with ``by_zero``:
  reaching one of :data:`_BY_ZERO`; with ``by_part``: a part of it taken
  where XLA sees it as a constant, a one-trip scan's scanned operand
  too; with ``by_derived``: computed otherwise than by moves into an
  operand of either beside a runtime value, ``fixed`` naming the operands
  that are constants or literals); an unknown equation's, read so."""
  inner = _inner_inputs(e)
  if inner is None or depth <= 0:
    return True
  if by_part and e.primitive.name == "scan" and len(inner[0][1]) == len(
      e.invars) and i >= sum(_compat.scan_groups(e.params)):
    return True   # (one trip: its body reads the operand's first slice)
  return any(i in mapping and _reads_as_value(
      j, {mapping[i]}, depth - 1, by_identity, by_zero, by_part, by_derived,
      {mapping[k] for k in fixed if k in mapping}, by_decision)
             for j, mapping in inner)


def _inner_inputs(e) -> list | None:
  """``(jaxpr, {operand index: its input var})`` for each jaxpr ``e``
  holds, the operands mapped being those XLA may see as constants inside:
  a loop's constants, and its carry's first value (and a scan's scanned
  operands) where XLA may remove the loop: a ``scan`` of one trip (its
  length at most its unrolling), any ``while`` (whose trip count XLA may
  find to be one); None for an equation this does not know."""
  p, name = e.params, e.primitive.name
  try:
    if name == "while":
      cond, body = _opened(p["cond_jaxpr"]), _opened(p["body_jaxpr"])
      nc, nb = p["cond_nconsts"], p["body_nconsts"]
      carry = len(e.invars) - nc - nb
      if len(cond.invars) != nc + carry or len(body.invars) != nb + carry:
        return None
      return [(cond, {**{i: cond.invars[i] for i in range(nc)},
                      **{nc + nb + k: cond.invars[nc + k]
                         for k in range(carry)}}),
              (body, {**{nc + i: body.invars[i] for i in range(nb)},
                      **{nc + nb + k: body.invars[nb + k]
                         for k in range(carry)}})]
    if name.startswith("scatter") and p.get("update_jaxpr") is not None:
      # its combiner takes an operand's and an update's elements, never
      # the indices (operand 1)
      combine = _opened(p["update_jaxpr"])
      if len(e.invars) != 3 or len(combine.invars) != 2:
        return None
      return [(combine, {0: combine.invars[0], 2: combine.invars[1]})]
    if name == "cond":   # (operand 0 is the index)
      return [(b, {k + 1: v for k, v in enumerate(b.invars)})
              for b in map(_opened, p["branches"])]
    if name == "scan":
      inner = _opened(p["jaxpr"])
      groups = _compat.scan_groups(p)
      if groups is None or len(inner.invars) != len(e.invars):
        return None
      unroll, length = p.get("unroll", 1), p.get("length")
      if unroll is True or type(length) is int and length <= max(
          1, int(unroll)):   # one trip: XLA removes the loop
        return [(inner, dict(enumerate(inner.invars)))]
      return [(inner, {i: inner.invars[i] for i in range(groups[0])})]
    for k in _CALL_PARAMS:
      if k in p:
        inner = _opened(p[k])
        if len(inner.invars) != len(e.invars):
          return None
        return [(inner, dict(enumerate(inner.invars)))]
  except (KeyError, AttributeError, TypeError, IndexError):
    return None
  return None


def _opened(jaxpr):
  """A closed jaxpr's open one (a scan's is open on jax 0.11)."""
  return getattr(jaxpr, "jaxpr", jaxpr)


def _reads_as_value(jaxpr, inputs: set, depth: int,
                    by_identity: bool = False, by_zero: bool = False,
                    by_part: bool = False, by_derived: bool = False,
                    fixed: set = frozenset(),
                    by_decision: bool = False) -> bool:
  """Whether ``inputs`` (vars of ``jaxpr``) are read as values: a value
  computed from them and literals alone reaches :data:`_READ_AS_VALUE`,
  a keyed operand, or, computed otherwise than by moves (``abs(c)``, ``c *
  2``: XLA folds it, and then removes ``x * 1`` if it is one), an operand
  of :data:`_BY_IDENTITY`; or a nested jaxpr's input read so. With
  ``by_identity``: whether they reach an operand of :data:`_BY_IDENTITY`
  moved alone (:data:`folding.VALUE_MOVES`), all 1, -1 or an infinity where they
  are. With ``by_zero``: whether a value computed from them and literals
  alone reaches an operand of :data:`_BY_ZERO`. With ``by_derived``:
  whether a value computed from them otherwise than by moves reaches an
  operand of either of a floating result beside a value computed from
  neither them, literals nor ``fixed`` (vars known to be constants: on
  constants alone, XLA folds the operation) (``ConstantReads.derived``).
  With ``by_decision``: whether a value computed from them and constants
  alone is a choice's predicate (XLA folds the choice)."""
  derived = set(inputs)   # computed from them and literals alone
  moved = set(inputs)     # moved alone
  fixed = set(fixed) - derived   # computed from other constants alone
  chosen: set = set()   # chosen by a value computed from them (by_derived)
  # their elements, moved beside other values too (``constant_reads``'
  # ``carried``): read by a product or a sum, any element counts
  carried = set(inputs)
  for e in jaxpr.eqns:
    if chosen and any(type(v) is not _Literal and v in chosen
                      for v in e.invars):
      if ((_removes_by_identity(e) or e.primitive.name in _BY_ZERO)
          and _inexact_result(e)):
        return True   # (by_derived: a choice XLA folds, then removes by)
      if _carrying_operands(e) or _holds_jaxpr(e):
        chosen.update(e.outvars)
    if by_identity or by_zero or by_part:
      mixed = [i for i, v in enumerate(e.invars)
               if type(v) is not _Literal and v in carried]
      if mixed:
        if by_part and (_takes_part(e) or _holds_jaxpr(e) and any(
            _operand_read_as_value(e, i, depth, by_part=True)
            for i in mixed)):
          return True   # a part taken of a mix: XLA may fold it (c[0])
        if (_removes_by_identity(e) or name_of(e) in _BY_ZERO) and (
            _inexact_result(e)) and (
                by_part and any(e.invars[i] not in moved for i in mixed)
                or by_identity and _removes_by_identity(e)
                or by_zero and name_of(e) in _BY_ZERO):
          return True
        if any(k in mixed for k in _carrying_operands(e)):
          carried.update(e.outvars)
    hit = [i for i, v in enumerate(e.invars)
           if type(v) is not _Literal and v in derived]
    if not hit:
      if (fixed and e.invars and not e.effects
          and any(type(v) is not _Literal for v in e.invars)
          and all(type(v) is _Literal or v in fixed for v in e.invars)):
        fixed.update(e.outvars)
      continue
    name = e.primitive.name
    alone = len(hit) == sum(type(v) is not _Literal for v in e.invars)
    constant = [k for k, v in enumerate(e.invars)
                if type(v) is _Literal or v in derived or v in fixed]
    if by_decision:
      # (a choice by a constant predicate between a constant arm and a
      # runtime one: XLA folds it; between constants alone, its result is
      # a constant, followed as one)
      if name in _CHOICES and 0 in hit and 0 < len(constant) < len(
          e.invars) or _holds_jaxpr(e) and name not in _CHOICES and any(
          _operand_read_as_value(e, i, depth, by_decision=True,
                                 fixed=constant) for i in hit):
        return True
      if len(constant) == len(e.invars):
        derived.update(e.outvars)
      continue
    if by_part:
      if alone and _takes_part(e) or _holds_jaxpr(e) and any(
          _operand_read_as_value(e, i, depth, by_part=True) for i in hit):
        return True
    elif by_zero:
      if name in _BY_ZERO and _inexact_result(e) or _holds_jaxpr(e) and any(
          _operand_read_as_value(e, i, depth, by_zero=True) for i in hit):
        return True
    elif by_identity:
      if (_removes_by_identity(e) and _inexact_result(e)
          and any(e.invars[i] in moved for i in hit)):
        return True
    elif by_derived:
      if ((_removes_by_identity(e) or name in _BY_ZERO) and _inexact_result(e)
          and len(constant) < len(e.invars)
          and any(e.invars[i] not in moved for i in hit)):
        return True
      if (name in _CHOICES and 0 in hit and len(constant) < len(e.invars)
          or _holds_jaxpr(e) and name not in _CHOICES and any(
              _operand_read_as_value(e, i, depth, by_decision=True,
                                     fixed=constant) for i in hit)):
        chosen.update(e.outvars)
    elif (alone and name in _READ_AS_VALUE
          or not KEYED_OPERANDS.get(name, frozenset()).isdisjoint(hit)
          or _removes_by_identity(e) and any(e.invars[i] not in moved
                                          for i in hit)
          or name in _BY_ZERO and _inexact_result(e)
          and any(e.invars[i] not in moved for i in hit)):
      return True
    if not (by_zero or by_part) and _holds_jaxpr(e) and any(
        _operand_read_as_value(e, i, depth, by_identity,
                               by_derived=by_derived, fixed=constant)
        or not by_identity and e.invars[i] not in moved
        and (_operand_read_as_value(e, i, depth, by_identity=True)
             or _operand_read_as_value(e, i, depth, by_zero=True))
        for i in hit):
      return True
    if len(constant) == len(e.invars):   # (on them and constants alone)
      derived.update(e.outvars)
      if alone and _moves_values(e) and all(e.invars[i] in moved
                                            for i in hit):
        moved.update(e.outvars)
  return False


def name_of(e) -> str:
  """An equation's primitive's name."""
  return e.primitive.name


def _inexact_result(e) -> bool:
  """Whether ``e``'s first result is of a floating or complex type (an
  integer one computes alike whether XLA removes ``x + 0`` or not)."""
  dtype = getattr(getattr(e.outvars[0], "aval", None), "dtype", None) if (
      e.outvars) else None
  return dtype is not None and _compat.inexact_dtype(dtype)


def _builds_inside(e) -> bool:
  """Whether a jaxpr ``e`` holds (at any depth) makes an array from
  literals alone or moves a literal into an array (``jnp.pad``'s value,
  inside its jit): its outputs may hold such elements (conservatively, any
  output)."""
  return any(_builds_from_literals(getattr(q, "jaxpr", q))
             for p in e.params.values() for q in _jaxprs_of(p))


@_compat.weakref_lru_cache
def _builds_from_literals(jaxpr) -> bool:
  for e in jaxpr.eqns:
    if not e.invars or any(type(x) is _Literal for x in e.invars) and (
        _carrying_operands(e) or all(type(x) is _Literal for x in e.invars)):
      return True
    if _holds_jaxpr(e) and _builds_inside(e):
      return True
  return False


cache.STORE.own("structure.builds_from_literals", _builds_from_literals,
                cache.Store.CALLS)


def _holds_jaxpr(e) -> bool:
  return any(hasattr(p, "eqns") or hasattr(getattr(p, "jaxpr", None), "eqns")
             for q in e.params.values()
             for p in (q if isinstance(q, (tuple, list)) else (q,)))


#: operations XLA's simplifier removes or rewrites by a constant operand's
#: value (``_compat.IDENTITY_VALUES``: ``x * 1``, ``x / 1``, ``x * -1`` as a
#: negation, ``max(x, -inf)``, ``min(x, inf)``, a clamp between
#: infinities, ``x ** 1``; also a dot or a convolution by a one-element 1,
#: rewritten as a product: :func:`_removes_by_identity`)
_BY_IDENTITY = frozenset({"mul", "div", "max", "min", "clamp", "pow",
                          # (a small reduction, rewritten as a chain of
                          # products, maxima, minima)
                          "reduce_prod", "reduce_max", "reduce_min",
                          "cumprod", "cummax", "cummin"})


def _removes_by_identity(e) -> bool:
  """Whether ``e`` is one of :data:`_BY_IDENTITY`, or a dot or a
  convolution each of whose outputs reads one element of each operand (a
  contraction of size 1, an outer product), which XLA rewrites as a
  product."""
  name = e.primitive.name
  if name in _BY_IDENTITY:
    return True
  try:
    if name == "dot_general":
      (contract, _), _ = e.params["dimension_numbers"]
      shape = e.invars[0].aval.shape
      return math.prod(shape[d] for d in contract) <= 1
    if name == "conv_general_dilated":
      rhs = e.invars[1].aval.shape
      out_features = rhs[e.params["dimension_numbers"].rhs_spec[0]]
      return math.prod(rhs) <= out_features
  except Exception:   # (parameters not read: counted as one)
    return True
  return False
#: operations XLA's simplifier removes by a constant operand of zeros
#: (``x + 0``, ``x - 0``), keeping a -0.0 and a subnormal ``x`` that the
#: runtime's operation makes 0.0 (measured on CPU: ``x * 0``, ``0 - x``,
#: ``max(x, 0)``, ``x @ 0`` and ``0 / x`` compute alike in both modules)
_BY_ZERO = frozenset({"add", "sub", "add_any", "reduce_sum", "cumsum"})
#: moves that take a part of an array (``c[0]``, ``c[:1]``, a gather): XLA
#: folds the part of a constant, which may be all 1 or 0 where the whole
#: is not
_SUBSET_MOVES = frozenset({"slice", "dynamic_slice", "gather", "select_n",
                           "dynamic_update_slice", "scatter"})


def _takes_part(e) -> bool:
  """Whether ``e`` takes a part of its operands (:data:`_SUBSET_MOVES`, a
  ``split`` into more than one piece, or a ``pad`` cropping by a negative
  width). Parameters this does not read count as taking a part."""
  name = e.primitive.name
  if name in _SUBSET_MOVES or name.startswith("scatter"):
    return True
  try:
    if name == "split":
      return len(e.params["sizes"]) > 1
    if name == "pad":
      return any(lo < 0 or hi < 0
                 for lo, hi, _ in e.params["padding_config"])
  except (KeyError, TypeError, ValueError):
    return True
  return False


def _moves_values(e) -> bool:
  """Whether ``e`` is one of :data:`folding.VALUE_MOVES` (``folding``'s; a
  conversion only where it keeps every value)."""
  name = e.primitive.name
  if name not in folding.VALUE_MOVES:
    return False
  if name == "convert_element_type":
    return _compat.exact_conversion(
        getattr(getattr(e.invars[0], "aval", None), "dtype", None),
        e.params.get("new_dtype"))
  return True


class ConstantReads(NamedTuple):
  """How a closed jaxpr reads its constants, by index: ``by_identity``,
  those moved alone (:data:`folding.VALUE_MOVES`) to an operand of
  :data:`_BY_IDENTITY` (XLA removes the operation where such a constant is
  all 1, -1 or an infinity); ``by_value``, those read as a value (a
  remainder's operand, :data:`_READ_AS_VALUE`, or computed otherwise than
  by moves into an operand of :data:`_BY_IDENTITY`: XLA folds the value,
  which may be one); inside nested jaxprs too, through the operands XLA
  may see as constants there; ``by_zero``, those from which a value
  computed with literals alone reaches an operand of :data:`_BY_ZERO` (XLA
  removes the operation where such a constant is all zeros); ``partly``,
  those of which a part may be read so (taken by :func:`_takes_part`
  from constants alone, here or inside a nested jaxpr, or scanned by a
  one-trip scan): XLA folds the part, so any element of 1, -1, an
  infinity or zero counts; ``derived``, those from which a value computed
  otherwise than by moves (``c - 2.0``, ``c.astype(bool)``, ``i // 2``)
  reaches an operand of :data:`_BY_IDENTITY` or :data:`_BY_ZERO` of a
  floating result: XLA folds it, and removes the operation if it is 1 or
  0, whatever the constant's type (they are in ``by_value`` too);
  ``by_uniform``, those read where all one value (``folding.uniform_reads``:
  a chain XLA reassociates with a scalar constant)."""
  by_identity: frozenset
  by_value: frozenset
  by_zero: frozenset = frozenset()
  partly: frozenset = frozenset()
  derived: frozenset = frozenset()
  by_uniform: frozenset = frozenset()


def constant_reads(closed, lifted: int | None = None) -> ConstantReads:
  """:class:`ConstantReads` of ``closed``; with ``lifted``, of its first
  ``lifted`` inputs instead (the closure key's lifted arrays, which stock's
  module bakes as constants beside the jaxpr's own), by their index. Read
  once per jaxpr while it lives (a miss asks for it at several stages)."""
  return _constant_reads(closed, lifted)


class _Taints:
  """:func:`constant_reads`' state over one jaxpr's equations: per var,
  the constants (by index) it is computed from with literals alone
  (``reach``) and those it moves (``moved``: all 1, -1 or an infinity
  where they are); those whose elements it may hold, moved beside runtime
  values too (``carried``: ``concatenate([c, x])``, ``where(p, c, x)``,
  where XLA may simplify the mix away and read an element by its value);
  those that decide which value it holds (``decided``: a choice by a
  predicate computed from them, a call given one, which XLA folds, then
  removing an operation by the literal it chose); the vars computed from
  literals alone (``built``: ``jnp.ones(8)``, an iota, constants of both
  modules beside which a constant's operation is folded too) and those
  that may hold their elements (``held``: ``concatenate([y, zeros])``).
  And the constants found read so far, by way (:class:`ConstantReads`'
  fields: ``identity`` is its ``by_identity``, ``valued`` its
  ``by_value``)."""

  __slots__ = ("reach", "moved", "carried", "decided", "built", "held",
               "identity", "valued", "zero", "partly", "derived")

  def __init__(self, seeds):
    self.reach = {v: frozenset({i}) for i, v in enumerate(seeds)}
    self.moved = dict(self.reach)
    self.carried = dict(self.reach)
    self.decided: dict = {}
    self.built: set = set()
    self.held: set = set()
    self.identity: set = set()
    self.valued: set = set()
    self.zero: set = set()
    self.partly: set = set()
    self.derived: set = set()

  def found(self, lifted: int | None, uniform: frozenset) -> ConstantReads:
    """The reads found (and ``uniform``, ``folding.uniform_reads``'), of
    the first ``lifted`` inputs where given (the jaxpr's own constants are
    baked in both modules)."""
    ways = (self.identity, self.valued | self.derived, self.zero,
            self.partly, self.derived, uniform)
    if lifted is not None:
      ways = [{i for i in w if i < lifted} for w in ways]
    return ConstantReads(*map(frozenset, ways))


@_compat.weakref_lru_cache
def _constant_reads(closed, lifted: int | None) -> ConstantReads:
  jaxpr, _ = _compat.closed_parts(closed)
  seeds = list(jaxpr.constvars)
  if lifted is not None:
    seeds[:0] = jaxpr.invars[:lifted]
  t = _Taints(seeds)
  reach, moved, built, held = t.reach, t.moved, t.built, t.held
  none = frozenset()
  for e in jaxpr.eqns:
    carry = [t.carried.get(x, none) if type(x) is not _Literal else none
             for x in e.invars]
    if any(carry):
      _note_carried(e, carry, t)
    sources = [reach.get(x, none) if type(x) is not _Literal else none
               for x in e.invars]
    _note_decided(e, sources, carry, t)
    if any(k < len(e.invars) and (type(e.invars[k]) is _Literal
                                  or e.invars[k] in held)
           for k in _carrying_operands(e)) or _holds_jaxpr(e) and (
               any(type(x) is _Literal or x in held for x in e.invars)
               or _builds_inside(e)):
      held.update(e.outvars)   # (a pad's literal value too; a call's)
    hit = [i for i, found in enumerate(sources) if found]
    if not hit:
      if not e.effects and all(
          type(x) is _Literal or x in built for x in e.invars):
        # (a call on literals alone too: jax.jit(lambda: jnp.zeros(4))(),
        # relu(-jnp.ones(4)); XLA inlines and folds it)
        built.update(e.outvars)
        held.update(e.outvars)
      continue
    moves = [moved.get(x, none) if type(x) is not _Literal else none
             for x in e.invars]
    name = e.primitive.name
    nested = _holds_jaxpr(e)
    inexact = _inexact_result(e)
    alone = len(hit) == sum(type(v) is not _Literal and v not in built
                            for v in e.invars)
    for i in hit:
      if alone and _takes_part(e) or nested and _operand_read_as_value(
          e, i, _NESTING, by_part=True):
        t.partly |= sources[i]
      # (an integer operation by 0 or 1 that XLA removes is exact)
      if name in _BY_ZERO and inexact or nested and _operand_read_as_value(
          e, i, _NESTING, by_zero=True):
        # moved alone: read where it is all zeros; computed otherwise
        # (c - 2.0): XLA folds it first, read always
        t.zero |= moves[i]
        if not alone:   # (on constants alone, XLA folds the operation)
          t.derived |= sources[i] - moves[i]
      if _removes_by_identity(e) and inexact or nested and _operand_read_as_value(
          e, i, _NESTING, by_identity=True):
        # moved alone: read where it is all 1, -1 or an infinity; computed
        # otherwise (abs(c), c * 2): XLA folds it first, read always
        t.identity |= moves[i]
        if alone:
          t.valued |= sources[i] - moves[i]
        else:
          t.derived |= sources[i] - moves[i]
      if nested and _operand_read_as_value(
          e, i, _NESTING, by_derived=True,
          fixed=[k for k, x in enumerate(e.invars)
                 if type(x) is _Literal or x in reach]):
        t.derived |= sources[i]
      if (alone and name in _READ_AS_VALUE
          or i in KEYED_OPERANDS.get(name, ())
          or nested and _operand_read_as_value(e, i, _NESTING)):
        t.valued |= sources[i]
    if alone:
      # (an index moves nothing: the elements it picks of a constant are
      # read, by value, and so is the index: c[i] with i closed over)
      movable = _moves_values(e) and none.union(*(
          moves[k] for k in _carrying_operands(e) if k < len(moves)))
      for v in e.outvars:
        reach[v] = none.union(*sources)
        if movable:
          moved[v] = movable
  return t.found(lifted, folding.uniform_reads(closed, lifted))


cache.STORE.own("structure.constant_reads", _constant_reads,
                cache.Store.CALLS)


def _note_carried(e, carry, t: _Taints) -> None:
  """For :func:`constant_reads`: an equation some of whose operands may
  hold a constant's elements (``carry``, per operand): a product or a sum
  (or a nested jaxpr's) reading one beside a runtime value (not moved
  alone: ``moved``, read as a whole) counts any element of those
  constants, and a move passes them on."""
  none = frozenset()
  name = e.primitive.name
  nested = _holds_jaxpr(e)
  inexact = _inexact_result(e)
  for i, found in enumerate(carry):
    found = found - t.moved.get(e.invars[i], none) if found else found
    if not found:
      continue
    if _removes_by_identity(e) and inexact or nested and _operand_read_as_value(
        e, i, _NESTING, by_identity=True):
      t.identity |= found
      t.partly |= found
    if name in _BY_ZERO and inexact or nested and _operand_read_as_value(
        e, i, _NESTING, by_zero=True):
      t.zero |= found
      t.partly |= found
    if _takes_part(e) or nested and _operand_read_as_value(
        e, i, _NESTING, by_part=True):   # XLA may fold the part (c[0])
      t.partly |= found
  _pass_carried(e, carry, t.carried, _NESTING)


def _pass_carried(e, carry, into: dict, depth: int) -> None:
  """Note in ``into`` what of ``carry`` (per operand) each output of ``e``
  may hold: a call's, by what its jaxpr moves to each output (a scatter's
  combiner is no call); any other's, through its carrying operands."""
  none = frozenset()
  if _holds_jaxpr(e) and not e.primitive.name.startswith("scatter"):
    for v, found in zip(e.outvars, _carried_out(e, carry, none, depth)):
      if found:
        into[v] = found
    return
  passed = none.union(*(carry[k] for k in _carrying_operands(e)
                        if k < len(carry)))
  if passed:
    for v in e.outvars:
      into[v] = passed


#: Equations choosing among their operands by operand 0 (a predicate, an
#: index): XLA folds the choice where that operand is a constant.
_CHOICES = frozenset({"select_n", "cond"})


def _note_decided(e, sources, carry, t: _Taints) -> None:
  """For :func:`constant_reads`: which constants decide ``e``'s result
  (``decided``): those deciding an operand, a choice's predicate's, and,
  for an equation holding jaxprs, those of an operand that decides a
  choice inside (:func:`_reads_as_value`'s ``by_decision``), and those
  computed otherwise than by moves into a mix with a runtime value (a
  stack, a choice's arm); where a product
  or a sum of a floating result reads a value so decided beside a runtime
  one, they are ``derived`` (read by value, whatever their type).
  ``sources`` and ``carry``: per operand, its ``reach`` and ``carried``."""
  none, moved, decided, held = frozenset(), t.moved, t.decided, t.held
  operands = [decided.get(x, none) if type(x) is not _Literal else none
              for x in e.invars]
  found = none.union(*operands)
  mixed = not all(sources[k] or type(x) is _Literal
                  for k, x in enumerate(e.invars))
  nested = _holds_jaxpr(e)
  if found and mixed and ((_removes_by_identity(e) or e.primitive.name in
                           _BY_ZERO) and _inexact_result(e)):
    t.derived |= found
  if nested and found:
    # (a decided value a callee multiplies or adds: the call is inlined)
    for k, d in enumerate(operands):
      if d and (_operand_read_as_value(e, k, _NESTING, by_identity=True)
                or _operand_read_as_value(e, k, _NESTING, by_zero=True)):
        t.derived |= d
  # the taint goes on through what moves a decided value (not an index a
  # decided value picks runtime values by), through calls, and through an
  # operation on constants and decided values alone; an operation with a
  # runtime operand of its own computes at run time in both modules
  carrying = _carrying_operands(e)
  if found and not nested:
    if all(type(x) is _Literal or sources[k] or operands[k]
           for k, x in enumerate(e.invars)):
      pass
    elif carrying:
      found = none.union(*(operands[k] for k in carrying
                           if k < len(operands)))
    else:
      found = none
  if e.primitive.name in _CHOICES and sources and sources[0] and mixed and any(
      type(x) is _Literal or sources[k] or operands[k] or x in held
      for k, x in enumerate(e.invars) if k):
    # (a constant choice of a constant arm: XLA folds it to that arm)
    found = found | sources[0]
  index = _index_operands(e)
  if index and any(sources[k] for k in index) and any(
      type(e.invars[k]) is _Literal or sources[k] or (carry and carry[k])
      or e.invars[k] in held for k in _carrying_operands(e)
      if k < len(e.invars)):
    # (a constant index into constant elements: XLA folds the part picked,
    # and with a runtime index rewrites the update around it)
    found = found.union(*(sources[k] for k in index))
  # an element carried through a mix (not moved alone), computed on with
  # constants alone (concatenate([c, y])[0] - 2.0): XLA folds it
  if carry and not _carrying_operands(e) and not nested:
    extra = none.union(*(c - moved.get(e.invars[k], none)
                         for k, c in enumerate(carry) if c))
    if extra and all(type(x) is _Literal or sources[k] or carry[k]
                     for k, x in enumerate(e.invars)):
      found = found | extra
  if mixed and not _holds_jaxpr(e):
    # a value computed from constants (not moved: abs(c), c - 2.0) mixed
    # with a runtime one (stacked, chosen): XLA folds it, then reads it
    found = found.union(*(
        sources[k] - moved.get(e.invars[k], none)
        for k in _carrying_operands(e)
        if k < len(sources) and type(e.invars[k]) is not _Literal))
  if nested and mixed:
    fixed = [k for k, x in enumerate(e.invars)
             if type(x) is _Literal or sources[k]]
    found = found.union(*(
        found_k for k, found_k in enumerate(sources) if found_k
        and _operand_read_as_value(e, k, _NESTING, by_decision=True,
                                   fixed=fixed)))
  outs = [found] * len(e.outvars)
  if mixed and _holds_jaxpr(e) and not e.primitive.name.startswith("scatter"):
    # (computed constants a call moves to an output beside runtime values)
    computed = [sources[k] - moved.get(x, none)
                if type(x) is not _Literal else none
                for k, x in enumerate(e.invars)]
    if any(computed):
      outs = [found | c for c in _carried_out(e, computed, none)]
  for v, found_v in zip(e.outvars, outs):
    if found_v:
      decided[v] = found_v


#: Equations calling their jaxpr once with their operands in order (their
#: outputs its outputs), which XLA inlines.
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat",
                    "checkpoint", "custom_jvp_call", "custom_vjp_call"})


def _carried_out(e, carry, none, depth: int = _NESTING) -> list:
  """Per output of ``e``, an equation holding jaxprs, what of ``carry``
  (per operand) it may hold: a call's, by what its jaxpr moves to each
  output; any other's (a loop, a branch), all of it."""
  p = e.params
  inner = next((_opened(p[k]) for k in _CALL_PARAMS if k in p), None) if (
      e.primitive.name in _CALLS) else None
  if (inner is None or depth <= 0 or not hasattr(inner, "eqns")
      or len(inner.invars) != len(carry)
      or len(inner.outvars) != len(e.outvars)):
    return [none.union(*carry)] * len(e.outvars)
  held = {v: c for v, c in zip(inner.invars, carry) if c}
  for q in inner.eqns:
    ins = [held.get(x, none) if type(x) is not _Literal else none
           for x in q.invars]
    if not any(ins):
      continue
    _pass_carried(q, ins, held, depth - 1)
  return [held.get(v, none) if type(v) is not _Literal else none
          for v in inner.outvars]


def _index_operands(e) -> tuple:
  """The operands of a part-taking ``e`` that say which elements it takes
  or updates (a ``select_n``'s predicate is a choice's: ``_CHOICES``)."""
  name, n = e.primitive.name, len(e.invars)
  if name == "dynamic_slice":
    return tuple(range(1, n))
  if name == "dynamic_update_slice":
    return tuple(range(2, n))
  if name == "gather" or name.startswith("scatter"):
    return (1,) if n > 1 else ()
  return ()


def _carrying_operands(e):
  """The operands whose elements ``e``'s result may hold as they are (a
  move's; a choice's cases, not its predicate; an update's operand and
  update, not its indices; a conversion's where it keeps every value)."""
  name = e.primitive.name
  if name == "select_n":
    return range(1, len(e.invars))
  if name in ("dynamic_slice", "gather"):
    return (0,)
  if name in ("dynamic_update_slice", "pad"):
    return (0, 1)
  if name.startswith("scatter"):
    return (0, 2)
  if _moves_values(e):
    return range(len(e.invars))
  return ()


def lifted_operands(e, live: bool) -> tuple:
  """For each operand of a top-level equation, whether a shared lowering
  takes it as an argument: a :func:`lifted_literal` at a position
  :func:`keyed_operands` does not name, of an equation that reads a
  runtime value (``live``, :func:`reads_runtime`: one on constants and
  literals alone is folded by XLA in stock's module, where its result's
  sign of zero, subnormals and NaN bits are the compiler's, not the
  runtime's). The one rule the structural key (:func:`_open_structure`)
  and the lowering (``shared._lower_lifted``) both follow."""
  return tuple(f is not None for f in lifted_operand_facts(e, live))


def lifted_operand_facts(e, live: bool) -> tuple:
  """:func:`lifted_operands`, with each lifted literal's
  :class:`LiteralFacts` where it is True and None where it is False."""
  if not live:
    return (None,) * len(e.invars)
  facts = [literal_facts(v) if type(v) is _Literal else None
           for v in e.invars]
  keyed = keyed_operands(e, facts)
  return tuple(f if f is not None and f.liftable and i not in keyed
               else None for i, f in enumerate(facts))


def reads_runtime(runtime: set, e, literal: bool | None = None) -> bool:
  """Whether the top-level equation ``e`` reads a runtime value: one of
  ``runtime`` (the jaxpr's inputs and what was computed from them, which
  it extends by ``e``'s outputs if so). Constants and literals alone are
  not: stock bakes them. ``literal``: whether an operand is a literal,
  where the caller knows."""
  invars = e.invars
  if literal is None:
    literal = _Literal in map(type, invars)
  if literal:
    live = any(type(v) is not _Literal and v in runtime for v in invars)
  else:
    live = not runtime.isdisjoint(invars)
  if live:
    runtime.update(e.outvars)
  return live


def _zero(x) -> bool:
  """Whether a literal is a zero of either sign: kept in the key, never an
  argument (XLA folds a constant zero, and its sign, otherwise than it
  computes with an argument's). A number's truth is ``np.any``'s (a NaN
  is not zero), read without making an array."""
  if type(x) in _NUMBERS or isinstance(x, np.number):
    return not x
  return not np.any(np.asarray(x))


_NUMBERS = frozenset({int, float, complex})


def _open_structure(jaxpr, literals: list | None, bits: list | None,
                    hoisted: list | None = None, named: bool = True,
                    fixed: set | None = None,
                    held: list | None = None) -> tuple:
  # (written for speed: tier A reads every traced jaxpr, at a cost that is
  # a tenth of its trace; each equation's outputs are numbered on
  # definition, in order, so their numbers are implied by their position
  # and are not keyed)
  names: dict = {}
  number = itertools.count()
  top = literals is not None

  def name(v):   # a variable by first use; a literal by type and bits
    if type(v) is _Literal:
      facts = literal_facts(v)
      if facts.refusal is not None:
        raise NotShared(facts.refusal)
      if fixed is not None:
        fixed.add(facts.held)
      return ("lit", v.aval, facts.atom)
    n = names.get(v)
    if n is None:
      n = names[v] = next(number)
    return n

  def lift(v, facts):   # a lifted literal: an argument of the shared lowering
    literals.append(np.asarray(v.val, v.aval.dtype))
    bits.append(facts.atom)
    held.append(facts.held)
    return ("arg", v.aval)

  binders = (tuple(map(name, jaxpr.constvars)),
             tuple(map(_aval, jaxpr.constvars)),
             tuple(map(name, jaxpr.invars)),
             tuple(map(_aval, jaxpr.invars)))
  eqns = []
  runtime = set(jaxpr.invars) if top else None
  for e in jaxpr.eqns:
    primitive = e.primitive.name
    if top and primitive in _JITS and hoists(e):
      # its constants become arguments: not keyed
      inner, consts = _compat.closed_parts(e.params["jaxpr"])
      hoisted.extend(consts)
      params = tuple((k, ("hoisted", _nested(inner, named)) if k == "jaxpr"
                      else param_key(p, named)) for k, p in e.params.items())
    else:
      ignored = NOT_LOWERED.get(primitive, ())
      params = tuple([(k, (t, p) if (t := type(p)) in _PLAIN
                       else param_key(p, named))
                      for k, p in e.params.items() if k not in ignored])
    invars = e.invars
    literal = _Literal in map(type, invars)
    live = top and reads_runtime(runtime, e, literal)
    if not literal:
      operands = tuple(map(names.get, invars))
      if None in operands:   # (a variable used before its definition)
        operands = tuple(map(name, invars))
    elif live:
      operands = tuple(name(v) if f is None else lift(v, f)
                       for v, f in zip(invars, lifted_operand_facts(e, True)))
    else:
      operands = tuple(map(name, invars))
    outvars = e.outvars
    names.update(zip(outvars, number))
    eqns.append((
        _by_identity(e.primitive),
        _by_identity(e.ctx),   # interned: threefry_partitionable, compute_on
        params,
        operands,
        tuple(map(_aval, outvars)),
        _effects(e.effects) if e.effects else ()))
  outs = tuple(lift(v, f) if top and type(v) is _Literal
               and (f := literal_facts(v)).liftable else name(v)
               for v in jaxpr.outvars)
  dbg = jaxpr.debug_info
  return (binders, tuple(eqns), outs, _effects(jaxpr.effects),
          None if dbg is None or not named else (
              dbg.func_src_info, _names(dbg.arg_names),
              _names(dbg.result_paths)))


def _by_identity(obj):
  """``obj`` itself where its class compares and hashes by identity
  (object's own ``__eq__`` and ``__hash__``: a primitive, an equation's
  context), as :class:`Identity` would but without making one; else an
  :class:`Identity`."""
  t = type(obj)
  if t.__eq__ is _OBJECT_EQ and t.__hash__ is _OBJECT_HASH:
    return obj
  return Identity(obj)


_OBJECT_EQ = object.__eq__
_OBJECT_HASH = object.__hash__


_Literal = _compat.Literal
_aval = operator.attrgetter("aval")
_JITS = frozenset({"jit", "pjit"})


def _names(names):
  return None if names is None else tuple(names)


def _effects(effects) -> tuple:
  if not effects:
    return ()
  for e in effects:
    if isinstance(e, _compat.JaxprInputEffect):
      raise NotShared("an effect tied to an input's position")
  return frozenset(effects)   # JAX's effect objects compare by value


def _negative_zero(c) -> bool:
  """Whether a constant holds a -0.0."""
  return _compat.holds_zero(c, negative_only=True)


def _atom(x) -> tuple:
  """An atom by its exact type and bits."""
  t = type(x)
  if t is float:
    return float_key(x)
  if t is complex:
    return (t, float_key(x.real), float_key(x.imag))
  if t is int or t is bool:
    return (t, x)
  a = np.asarray(x)
  return (t, a.dtype, a.shape, a.tobytes())


def param_key(p, named: bool = True, depth: int = 0) -> Any:
  """An equation parameter's key; ``named=False`` leaves out nested
  jaxprs' debug names (source, argument and result names), which no
  computation reads (verify mode compares without them). ``depth``: how
  many functions and hijax objects of jax's the walk is inside.

  The rule depends on the parameter's type alone (:func:`_rule_of`), read
  once per type of the standard library's, numpy's and jax's."""
  t = type(p)
  rule = _RULES.get(t)
  if rule is None:
    rule = _rule_of(t)
  return rule(p, named, depth)


def _float(p, named, depth):
  return float_key(p)


def _complex(p, named, depth):
  return (complex, float_key(p.real), float_key(p.imag))


def _as_is(p, named, depth):   # an int, a bool, a str, None: (type, value)
  return (type(p), p)


def _sequence(p, named, depth):
  # (a NamedTuple of jax's, custom_linear_solve's jaxprs: field by field)
  types_ = frozenset(map(type, p))
  if types_ <= _PLAIN:   # (axes, strides, donated_invars: most of them)
    return (type(p), tuple(map(type, p)), tuple(p))
  return (type(p), tuple([param_key(x, named, depth) for x in p]))


def _mapping(p, named, depth):
  return (dict, tuple([(param_key(k, named, depth), param_key(v, named, depth))
                       for k, v in p.items()]))


def _set(p, named, depth):
  # the members' own keys, unordered (a user's object by identity)
  return (type(p), frozenset([param_key(x, named, depth) for x in p]))


def _closed(p, named, depth):
  jaxpr, consts = _compat.closed_parts(p)
  return ("closed", _nested(jaxpr, named), tuple(map(_nested_const, consts)))


def _open(p, named, depth):
  return ("jaxpr", _nested(p, named))


def _dtype(p, named, depth):
  return (np.dtype, p)


def _constant(p, named, depth):
  return _nested_const(p)


def _treedef(p, named, depth):
  return _treedef_key(p, named, depth)


def _function(p, named, depth):
  if (depth < _WALK_DEPTH and _compat.jax_code(p.__code__)
      and (depth or _evaluates_a_jaxpr(p))):
    return _jax_function_key(p, named, depth + 1)
  return Identity(p)


def _identity(p, named, depth):
  return Identity(p)


def _jax_dataclass(p, named, depth):
  # field by field, never by its __eq__ (which compares a field holding a
  # user's callable, a pure_callback's, by the callable's)
  return (type(p), tuple((f.name, param_key(getattr(p, f.name), named, depth))
                         for f in dataclasses.fields(p)))


def _jax_value(p, named, depth):
  # jax's own value types: shardings, dimension numbers
  return (type(p), p) if _hashable(p) else Identity(p)


def _hi_prim(p, named, depth):
  if depth < _WALK_DEPTH:
    return _hi_prim_key(p, named, depth + 1)
  return _rule_past_walking(type(p))(p, named, depth)


#: types whose values are compared as they are once their types are
#: (``1``, ``True`` differ by type; ``==`` of these is exact)
_PLAIN = frozenset({int, bool, str, bytes, type(None), type(Ellipsis)})


def _rule_of(t: type):
  """The rule of :func:`param_key` for values of type ``t``; kept for the
  types of the standard library, numpy and jax (which live as long)."""
  if t in _PLAIN:
    rule = _as_is
  elif t is float:
    rule = _float
  elif t is complex:
    rule = _complex
  elif t is tuple or t is list or (issubclass(t, tuple) and hasattr(
      t, "_fields") and _compat.defined_by_jax(t)):
    rule = _sequence
  elif t is dict:
    rule = _mapping
  elif t is frozenset or t is set:
    rule = _set
  elif t is _compat.ClosedJaxpr:   # first: on 0.11 it is Jaxpr itself
    rule = _closed
  elif t is _compat.Jaxpr:
    rule = _open
  elif issubclass(t, np.dtype):
    rule = _dtype
  elif issubclass(t, (np.ndarray, _compat.np_generic)):
    rule = _constant
  elif t is _compat.PyTreeDef:
    rule = _treedef
  elif t is types.FunctionType:
    rule = _function
  elif (_compat.HI_PRIM is not None and issubclass(t, _compat.HI_PRIM)
        and _compat.defined_by_jax(t)):
    rule = _hi_prim
  else:
    rule = _rule_past_walking(t)
  module = getattr(t, "__module__", None)
  if (type(module) is str and module.partition(".")[0] in ("builtins", "numpy")
      or _compat.defined_by_jax(t)):
    _RULES[t] = rule
  return rule


def _rule_past_walking(t: type):
  if issubclass(t, (enum.Enum, types.FunctionType, types.MethodType,
                    types.BuiltinFunctionType)):
    return _identity
  if _compat.defined_by_jax(t):
    return _jax_dataclass if dataclasses.is_dataclass(t) else _jax_value
  return _identity


#: :func:`_rule_of`'s answers for the standard library's, numpy's and
#: jax's types
_RULES = cache.STORE.table("structure.param_rules", cache.Store.FACTS, dict)


#: how deep the walk goes into functions and hijax objects of jax's before
#: keying what it reaches by identity (a closure reaching itself)
_WALK_DEPTH = 8


def _evaluates_a_jaxpr(f) -> bool:
  """Whether ``f`` closes over a jaxpr (closure conversion's function,
  which a lowering evaluates; what it and a hijax object reach is walked
  too: their helpers run when they do). Others of jax's code met as an
  equation's parameter (a callback's flat wrapper, run at run time over
  the user's callable and static arguments, which may change after the
  trace) are keyed by identity."""
  for cell in f.__closure__ or ():
    if _filled(cell) and isinstance(cell.cell_contents,
                                    (_compat.ClosedJaxpr, _compat.Jaxpr)):
      return True
  return False


def _jax_function_key(f, named: bool, depth: int):
  """A function of jax's own code over a jaxpr (``Traced.closure_convert``'s,
  which a ``custom_root`` holds) by its code and what it closes over, each
  by :func:`param_key`: two such functions over equal parts compute the
  same (their globals are jax's module's). One with attributes of its own
  is keyed by identity."""
  if getattr(f, "__dict__", None):
    return Identity(f)
  cells = tuple(param_key(c.cell_contents, named, depth) if _filled(c)
                else ("empty",) for c in (f.__closure__ or ()))
  return (types.FunctionType, Identity(f.__code__), cells,
          param_key(f.__defaults__, named, depth),
          param_key(f.__kwdefaults__, named, depth))


def _filled(cell) -> bool:
  try:
    cell.cell_contents
    return True
  except ValueError:   # a cell not yet assigned
    return False


class _JaxEqual:
  """A treedef under JAX's own equality (which also tells apart two
  registrations of one node type), hashed by the walk beside it."""
  __slots__ = ("treedef",)

  def __init__(self, treedef):
    self.treedef = treedef

  def __eq__(self, other):
    return type(other) is _JaxEqual and (other.treedef is self.treedef
                                         or other.treedef == self.treedef)

  def __hash__(self):
    return 0


#: the most nodes a treedef parameter is walked for (a larger one is keyed
#: by identity, as a walk per call would cost more than it saves)
TREEDEF_NODES = 256


def treedef_key(treedef, named: bool = True):
  """:func:`_treedef_key` of any size (verify mode's comparison, once per
  hit it checks, where a larger treedef would be a false mismatch)."""
  return _treedef_key(treedef, named, 0, limit=None)


def _treedef_key(treedef, named: bool, depth: int,
                 limit: int | None = TREEDEF_NODES):
  """A treedef by its nodes in preorder (type by identity, data by
  :func:`param_key`, child count) and, where no node's data is a user's
  object, JAX's own equality too; by identity otherwise (JAX's equality
  would call that object's ``__eq__``), and where it has more than
  :data:`TREEDEF_NODES` nodes."""
  if limit is not None and treedef.num_nodes > limit:
    return Identity(treedef)
  walk, todo = [], [treedef]
  while todo:
    node = todo.pop()
    data = node.node_data()
    children = node.children()
    walk.append(() if data is None else (
        Identity(data[0]), param_key(data[1], named, depth), len(children)))
    todo.extend(reversed(children))
  walk = tuple(walk)
  if _holds_identity(walk):
    return Identity(treedef)
  return ("treedef", walk, _JaxEqual(treedef))


def _holds_identity(key) -> bool:
  """Whether ``key`` holds a user's object (keyed by identity; a node's
  type is keyed so too, and is not one)."""
  todo = [key]
  while todo:
    k = todo.pop()
    t = type(k)
    if t is Identity:
      if type(k.obj) is not type:
        return True
    elif t is tuple or t is frozenset:
      todo.extend(k)
    elif t is Hashed:
      todo.append(k.key)
  return False


def _hi_prim_key(prim, named: bool, depth: int):
  """A hijax primitive object of jax's own class (made afresh by every
  trace) by its class and its whole state, each attribute by
  :func:`param_key`, never by its ``__eq__`` (which compares its
  parameters, which may be a user's objects, by theirs)."""
  return (type(prim), tuple((k, param_key(v, named, depth))
                            for k, v in vars(prim).items()))


def _hashable(p) -> bool:
  try:
    hash(p)
    return True
  except TypeError:
    return False


def _inner_values(p) -> frozenset:
  """The held values (:func:`held_value`) of the literals and one-element
  constants of a parameter's jaxprs (:func:`_jaxprs_of`) and of every
  jaxpr nested in them."""
  found = frozenset()
  for q in _jaxprs_of(p):
    found |= _open_values(getattr(q, "jaxpr", q))
    found |= {held_value(np.asarray(c)) for c in getattr(q, "consts", ())
              if getattr(c, "size", None) == 1}
  return found


def _jaxprs_of(p) -> tuple:
  """``p`` as the jaxprs it is: a jaxpr, closed or open, or those in a
  tuple or list (a ``cond``'s branches; ``custom_linear_solve``'s named
  tuple, with None for a missing one); else none."""
  if type(p) in _JAXPR_TYPES:
    return (p,)
  if isinstance(p, (tuple, list)):
    return tuple(q for q in p if type(q) in _JAXPR_TYPES)
  return ()


_JAXPR_TYPES = frozenset({_compat.Jaxpr, _compat.ClosedJaxpr})


def _params_values(eqns) -> frozenset:
  """:func:`_inner_values` of every parameter of ``eqns``."""
  found = frozenset()
  for e in eqns:
    for p in e.params.values():
      if type(p) in _JAXPR_TYPES or isinstance(p, tuple):
        found |= _inner_values(p)
  return found


@_compat.weakref_lru_cache
def _open_values(jaxpr) -> frozenset:
  """The held values of ``jaxpr``'s own literals and of its parameters'
  jaxprs' (:func:`_params_values`)."""
  found = {h for e in jaxpr.eqns for v in e.invars
           if type(v) is _Literal and (h := literal_facts(v).held) is not None}
  found.update(h for v in jaxpr.outvars if type(v) is _Literal
               and (h := literal_facts(v).held) is not None)
  return frozenset(found) | _params_values(jaxpr.eqns)


cache.STORE.own("structure.inner_values", _open_values, cache.Store.CALLS)


def _nested(jaxpr, named: bool = True) -> tuple:
  return _nested_cached(jaxpr) if named else _nested_unnamed(jaxpr)


class Hashed:
  """A nested jaxpr's structure, hashed once: a nested jaxpr JAX caches (a
  library function's, ``jax.random``'s) is part of the key of every jaxpr
  holding it, which the store would otherwise hash in full on each call."""
  __slots__ = ("key", "hash")

  def __init__(self, key: tuple):
    self.key, self.hash = key, hash(key)

  def __hash__(self):
    return self.hash

  def __eq__(self, other):
    return self is other or (type(other) is Hashed and self.hash == other.hash
                             and self.key == other.key)

  def __repr__(self):
    return f"Hashed({self.key!r})"


@_compat.weakref_lru_cache
def _nested_cached(jaxpr) -> Hashed:
  return Hashed(_open_structure(jaxpr, None, None))


@_compat.weakref_lru_cache
def _nested_unnamed(jaxpr) -> Hashed:
  return Hashed(_open_structure(jaxpr, None, None, named=False))


# a nested jaxpr's structure while the jaxpr lives (named and unnamed)
cache.STORE.own("structure.nested", _nested_cached, cache.Store.CALLS)
cache.STORE.own("structure.nested_unnamed", _nested_unnamed,
                cache.Store.CALLS)


def _nested_const(c) -> tuple:
  size = getattr(c, "size", 1)
  if size > NESTED_CONST_ELEMENTS:
    raise NotShared(f"a nested jaxpr's constant of {size} elements")
  return _atom(np.asarray(c))


def first_difference(a: tuple, b: tuple) -> str:
  """Where two structures' keys first differ, in words (explanations)."""
  names = ("the inputs", "the equations", "the outputs", "the effects",
           "the debug names")
  for part, (x, y) in enumerate(zip(a, b)):
    if x == y:
      continue
    if part == 1:
      for i, (e, f) in enumerate(zip(x, y)):
        if e != f:
          what = ("its primitive" if e[0] != f[0] else
                  "its context" if e[1] != f[1] else
                  "its parameters" if e[2] != f[2] else
                  "its operands" if e[3] != f[3] else "its outputs")
          prim = e[0].obj if type(e[0]) is Identity else e[0]
          return f"equation {i} ({prim}): {what}"
      return f"the number of equations ({len(x)} against {len(y)})"
    return names[part] if part < len(names) else "its options"
  return "its options (shardings, layouts, names)"
