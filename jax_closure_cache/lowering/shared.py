"""Tier A: one lowering and executable for every jaxpr of one structure.

pjit lowers and compiles a closed jaxpr in ``_pjit_lower``, a cache keyed
on the jaxpr object, so a re-created function (a fresh ``jax.jit`` of a
nested ``def``, a fresh loop body) compiles on every call although stock
traced the same computation. Here ``_pjit_lower``, for a call, is looked
up by the jaxpr's structure (``structure.of``) first: the jaxpr is stock's
own trace, with every Python side effect of it, and only its lowering and
compilation are shared. The shared lowering takes the jaxpr's constants,
and those of its top-level floating-point literals whose value changed
between two traces of the structure, as its leading arguments, which pjit
passes as it passes hoisted constants (``const_args``, also to the C++
fast path of the jitted object).

Invariants:
* Identity first: a jaxpr object lowered before gets the answer it got
  (a ``weakref_lru_cache`` on it, as stock's); a structure met once is
  lowered as stock lowers it and keeps nothing alive but its hash, its
  literals' bits and a weak reference to that lowering (used as it is by
  a second jaxpr of the structure with no constants, while it lives); the
  second meeting stores a shared lowering.
* Nothing of the user's is kept by a stored lowering: its constants are
  arguments, not parts of it (a callable a parameter holds is kept, by
  identity, as the executable calling it must). The store is bounded by
  count and by the bytes of its compiled executables
  (``_compat.executable_nbytes``, counted at their first compile).
* Never shared: donating calls (XLA warns at every compile), profile-guided
  compiles, constants committed to a device or of other types than arrays,
  effects tied to input positions.
* In verify mode every hit also lowers this jaxpr afresh and compares the
  module text with the shared one; a mismatch answers with stock's own
  lowering, is counted and logged.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import sys
import threading
import types
import weakref
from typing import NamedTuple

import numpy as np

from jax.sharding import NamedSharding

from jax_closure_cache import cache
from jax_closure_cache import settings
from jax_closure_cache._compat import lowering as _compat
from jax_closure_cache._compat import own_constants as _own_constants
from jax_closure_cache.lowering import folding
from jax_closure_cache.lowering import structure

logger = logging.getLogger("jax_closure_cache")

STOCK = _compat.STOCK_PJIT_LOWER
#: Structures met once, remembered by hash with their literals' bits.
MET_CAPACITY = 4096
#: The most bytes of NumPy constants a shared lowering's call copies. It
#: takes each as an argument, a copy (the user's array may change in place,
#: where stock's executable baked its values), which pjit's fast path
#: keeps for as long as stock's object lives: over about what stock's own
#: executable of an object costs, the lowering is stock's (baked).
COPIED_NUMPY_BYTES = 1 << 20
#: The most bytes of a constant a shared lowering bakes, as stock's module
#: does, where stock's module computes with its value (XLA folds it,
#: removes an operation by it or reassociates it: ``structure.
#: constant_reads``, ``folding``; it holds a zero, a NaN or a boolean):
#: the lowering is then keyed by a copy of its bytes, and shared by the
#: calls whose constant holds the same value (a hyperparameter closed
#: over as a jax scalar, step after step).
BAKED_BYTES = 256


class SharedLowering(cache.Entry):
  """A stored lowering: ``lifted`` says, per top-level floating-point
  literal, whether it is an argument; ``bits`` are the literals it was
  lowered with (compared where not lifted); ``baked``, the constants it
  holds by value (:class:`Baked`, part of its key); ``sized``: its
  executable's bytes are counted (once, at the first compile)."""
  __slots__ = ("lifted", "bits", "computation", "baked", "sized")

  def __init__(self, lifted: tuple, bits: tuple, computation,
               baked: "Baked"):
    super().__init__()
    self.lifted, self.bits, self.computation = lifted, bits, computation
    self.baked = baked
    self.sized = False

  def serves(self, s: structure.Structure) -> bool:
    return (all(lift or b == e
                for lift, b, e in zip(self.lifted, s.bits, self.bits))
            and _apart_from_constants(s, self.lifted, self.baked.held)
            == self.lifted)

  def widened(self, bits: tuple) -> tuple:
    return tuple(lift or b != e
                 for lift, b, e in zip(self.lifted, bits, self.bits))


class Baked(NamedTuple):
  """The top-level constants a shared lowering holds by value, as stock's
  module does: their positions (``at``), and ``values``, each one's dtype,
  shape and bytes (:func:`structure.held_value`), which key the lowering;
  ``held``, those of one element (constants XLA merges with an equal
  literal, :func:`_apart_from_constants`)."""
  at: frozenset = frozenset()
  values: tuple = ()
  held: frozenset = frozenset()

  @classmethod
  def of(cls, consts, at: frozenset) -> "Baked":
    values = tuple(structure.held_value(np.asarray(consts[i]))
                   for i in sorted(at))
    return cls(frozenset(at), values,
               frozenset(v for v in values if np.prod(v[1]) == 1))


_NONE_BAKED = Baked()


class Bound:
  """A shared lowering seen with one jaxpr's constants and lifted literals
  as its leading arguments (``const_args``, which pjit passes first); its
  first compile counts the executable's bytes against the store's bound."""
  __slots__ = ("computation", "const_args", "key", "entry")

  def __init__(self, computation, args: list, key, entry: SharedLowering):
    self.computation = computation
    self.const_args = [*computation.const_args, *args]
    self.key, self.entry = key, entry

  def compile(self, *args, **kwargs):
    executable = self.computation.compile(*args, **kwargs)
    if not self.entry.sized:   # (a size the backend cannot report is 0)
      self.entry.sized = True
      LOWERINGS.store.resize(self.key, self.entry,
                             _compat.executable_nbytes(executable))
    return executable

  def __getattr__(self, name):
    return getattr(self.computation, name)


class Lowerings:
  """The shared lowerings (a bounded store), the structures met once, and
  their counts; cleared with the package's caches and ``jax.clear_caches()``."""

  def __init__(self):
    self.store = cache.STORE.bounded("shared.lowerings", counted="lowerings",
                                     kind=cache.Store.CALLS)
    self.lock = threading.Lock()
    self.met: collections.OrderedDict = collections.OrderedDict()
    self.counts: collections.Counter = collections.Counter()
    self.refusals: collections.Counter = collections.Counter()
    # each name's last structure (explanations only)
    self.last_by_name: dict = {}

  def clear(self) -> None:
    with self.lock:
      self.met.clear()
      self.last_by_name.clear()

  def reset_counts(self) -> None:
    with self.lock:
      self.counts.clear()
      self.refusals.clear()

  def count(self, what: str) -> None:
    with self.lock:
      self.counts[what] += 1

  def refuse(self, reason: str) -> None:
    with self.lock:
      self.refusals[reason] += 1

  def first_meeting(self, key_hash: int):
    """``(bits, weak lowering or None)`` of the structure's first meeting,
    or None if this is it (then :meth:`met_first` records it)."""
    with self.lock:
      return self.met.pop(key_hash, None)

  def met_first(self, key_hash: int, bits: tuple, computation) -> None:
    """Remember a structure met once: its literals' bits and, where the
    lowering takes nothing but the call's arguments (no constants), a weak
    reference to stock's lowering, which a second jaxpr of the same
    structure and bits can use as it is while the first keeps it alive."""
    weak = None
    if computation is not None:
      try:
        weak = weakref.ref(computation)
      except TypeError:
        pass
    with self.lock:
      self.met[key_hash] = (bits, weak)
      if len(self.met) > MET_CAPACITY:
        self.met.popitem(last=False)

  def report(self) -> dict:
    with self.lock:
      return {"entries": len(self.store), "bytes": self.store.nbytes(),
              "hits": self.counts["hits"],
              "compiles": self.counts["compiles"],
              "met_once": self.counts["met_once"],
              "baked": self.counts["baked"],
              "refused": dict(self.refusals)}


LOWERINGS = cache.STORE.own("shared.LOWERINGS", Lowerings(), cache.Store.CALLS)
cache.STORE.report("tier_a", LOWERINGS.report, reset=LOWERINGS.reset_counts)

#: How a refusal for a ``folding.Finding`` is counted, by its reason.
_REFUSED_FOLDING = types.MappingProxyType({
    "folds_zero": "a zero XLA folds in stock's module",
    "folds_constants": "constants XLA folds or rewrites in stock's module "
                       "(reassociated, evaluated, fused)",
    "folding_unread": "a jaxpr the folding check cannot read"})


class CallLowering(NamedTuple):
  """What ``_pjit_lower`` takes besides the jaxpr, for one call."""
  in_shardings: tuple
  out_shardings: tuple
  in_layouts: tuple
  out_layouts: tuple
  donated_invars: tuple
  ctx_mesh: object
  name: str
  keep_unused: bool
  inline: bool
  compiler_options_kvs: tuple
  lowering_platforms: object
  lowering_parameters: object
  pgle_profiler: object

  def stock(self, jaxpr):
    *args, platforms, parameters, profiler = self
    return STOCK(jaxpr, *args, lowering_platforms=platforms,
                 lowering_parameters=parameters, pgle_profiler=profiler)

  def with_leading(self, n: int) -> "CallLowering":
    """The same for a jaxpr taking ``n`` more arguments first: unspecified
    shardings and layouts, never donated (as pjit's hoisted constants)."""
    return self._replace(
        in_shardings=(_compat.UNSPECIFIED,) * n + tuple(self.in_shardings),
        in_layouts=(None,) * n + tuple(self.in_layouts),
        donated_invars=(False,) * n + tuple(self.donated_invars))


def pjit_lower(jaxpr, in_shardings, out_shardings, in_layouts, out_layouts,
               donated_invars, ctx_mesh, name, keep_unused, inline,
               compiler_options_kvs, *, lowering_platforms,
               lowering_parameters, pgle_profiler):
  """pjit's ``_pjit_lower``: for a call, the lowering shared by the jaxpr's
  structure (identity first); for ``.lower()`` and the rest, stock's."""
  call = CallLowering(in_shardings, out_shardings, in_layouts, out_layouts,
                      tuple(donated_invars), ctx_mesh, name, keep_unused,
                      inline, compiler_options_kvs, lowering_platforms,
                      lowering_parameters, pgle_profiler)
  if not _compat.called_for_a_call(sys._getframe(1)):
    return call.stock(jaxpr)
  return _for_call(jaxpr, call)


@_compat.weakref_lru_cache
def _for_call(jaxpr, call: CallLowering):
  """The lowering of ``jaxpr`` for a call: identity first (this cache)."""
  try:
    reason = _refusal(jaxpr, call)
  except Exception as e:   # never an error where stock has none
    reason = f"its constants could not be read ({type(e).__name__}: {e})"
  if reason is None:
    try:
      s = structure.of(jaxpr)
      reason = (_warned_constants(jaxpr, s) or _copied_numpy(jaxpr, s)
                or _leading_arguments_name_outputs(jaxpr, s, call))
      if reason is None:
        baked = _baked_constants(jaxpr, s)
    except structure.NotShared as e:
      reason = str(e)
    except Exception as e:   # never an error where stock has none
      reason = f"its structure could not be read ({type(e).__name__}: {e})"
  if reason is not None:
    LOWERINGS.refuse(reason)
    if _explaining():
      logger.warning("jax_closure_cache: tier A does not share %s's "
                     "lowering: %s", call.name, reason)
    return call.stock(jaxpr)
  return _shared(jaxpr, s, call, baked)


def _refusal(jaxpr, call: CallLowering) -> str | None:
  if call.pgle_profiler is not None or _compat.enable_pgle.value:
    return "profile-guided compilation"
  if any(call.donated_invars):
    return "donated arguments"
  if call.lowering_platforms is not None:
    return "lowering for other platforms"
  if _compat.transfers_guarded():
    # its constants and literals as arguments: transfers stock never makes
    return "a transfer guard in force"
  return None


def _warned_constants(jaxpr, s: structure.Structure) -> str | None:
  """Why JAX's lowering of ``jaxpr`` warns of its captured constants: they
  reach ``jax_captured_constants_warn_bytes`` (counting a nested jaxpr's
  constants, keyed by value, as the most they may hold), or None."""
  return _compat.captured_constants_warning(
      (*_compat.closed_parts(jaxpr)[1], *s.hoisted),
      nbytes=structure.NESTED_CONST_ELEMENTS * 16)


def _copied_numpy(jaxpr, s: structure.Structure) -> str | None:
  """Why a shared call's copies of ``jaxpr``'s NumPy constants would keep
  more alive than stock's baked ones (over :data:`COPIED_NUMPY_BYTES`), or
  None."""
  total = sum(c.nbytes for c in (*_compat.closed_parts(jaxpr)[1], *s.hoisted)
              if isinstance(c, np.ndarray))
  if total > COPIED_NUMPY_BYTES:
    return (f"NumPy constants over {COPIED_NUMPY_BYTES >> 10} KiB: a shared "
            "executable takes a copy of each as an argument, kept while "
            "stock's object lives, where stock's executable bakes them")
  return None


_READ_BY_VALUE = (
    "a constant XLA computes with by its value in stock's module (a "
    "remainder's operand; one all 1, -1 or an infinity that x * 1 or "
    "max(x, -inf) reads, or a value computed from it that x * v or x + v "
    "reads, an operation XLA removes by 1 or 0, where the runtime's "
    "flushes a subnormal x and keeps a NaN's sign)")


def _baked_constants(jaxpr, s: structure.Structure) -> Baked:
  """The top-level constants of ``jaxpr`` a shared lowering holds by
  value, as stock's module does (:class:`Baked`): those refused as
  arguments for their values (``structure.constant_answer``) and those
  stock's module computes with by their value (``structure.
  constant_reads``: a remainder's operand; one all 1, -1 or an infinity
  where an operation XLA removes by it reads it), each of at most
  :data:`BAKED_BYTES`; with more where the structure needs them
  (:data:`_BAKES_SMALL`: XLA reassociates a passed one with another).
  Raises :class:`structure.NotShared` where such a constant is
  larger, or is a nested jit's (passed as an argument)."""
  consts = _compat.closed_parts(jaxpr)[1]
  at = set()
  for i, c in enumerate(consts):
    reason, by_value = structure.constant_answer(c)
    if reason is None:
      continue
    if not (by_value and _bakeable(c)):
      raise structure.NotShared(reason)
    at.add(i)
  if s.hoisted and any(_read_by_value(e.params["jaxpr"])
                       for e in _compat.closed_parts(jaxpr)[0].eqns
                       if structure.hoists(e)):
    raise structure.NotShared(_READ_BY_VALUE)
  for i in _constants_read_by_value(jaxpr, s.key):
    if not _bakeable(consts[i]):
      raise structure.NotShared(_READ_BY_VALUE)
    at.add(i)
  level = _BAKES_SMALL.get(s.key)
  if level is not None:
    at.update(_small_constants(consts, level))
  return Baked.of(consts, frozenset(at)) if at else _NONE_BAKED


def _small_constants(consts, level: int) -> frozenset:
  """The constants a shared lowering bakes at ``level`` besides those read
  by value (:data:`_BAKES_SMALL`): 1, those of one element; 2, every one
  :func:`_bakeable`."""
  return frozenset(i for i, c in enumerate(consts) if _bakeable(c) and (
      level > 1 or getattr(c, "size", 1) == 1))


def _bakeable(c) -> bool:
  """Whether a constant is small enough to bake and key by its bytes
  (:data:`BAKED_BYTES`), and has values to bake (not a typed PRNG key)."""
  nbytes = getattr(c, "nbytes", None)
  if nbytes is None:   # a Python number
    return type(c) in (int, float, bool, complex)
  return (nbytes <= BAKED_BYTES
          and not _compat.extended_dtype(getattr(c, "dtype", None)))


#: structure key -> the level of :func:`_small_constants` a shared lowering
#: of it bakes: with only those :func:`_baked_constants` reads by value
#: baked, XLA would compute otherwise with one passed (``folding``: a
#: scalar reassociated with a baked one); the scalars first, then every
#: small constant
_BAKES_SMALL = cache.STORE.table("shared.bakes_small", cache.Store.FACTS)


# structure key -> ``structure.constant_reads`` of its jaxprs: the same for
# every jaxpr of one structure, since the key holds the constants'
# positions, every equation and its parameters (nested jaxprs by
# structure) and which operands are literals; a walk per structure, not
# per call
_READS = cache.STORE.table("shared.constant_reads", cache.Store.FACTS)


def _read_by_value(closed, key=None) -> bool:
  return bool(_constants_read_by_value(closed, key))


def _constants_read_by_value(closed, key=None) -> set:
  """The constants of ``closed`` stock's module computes with by their
  value (``structure.constant_reads``, kept by structure ``key``): a
  remainder's operand, one all 1, -1 or an infinity where an operation
  XLA removes by it reads it, one of zeros a part is taken of, one all
  one value a chain reads."""
  consts = _compat.closed_parts(closed)[1]
  if not consts:
    return set()
  reads = None if key is None else _READS.get(key)
  if reads is None:
    reads = structure.constant_reads(closed)
    if key is not None:
      if len(_READS) >= MET_CAPACITY:
        _READS.clear()
      _READS[key] = reads
  found = set(reads.by_value)
  found.update(i for i in reads.by_identity
               if structure.identity_constant(consts[i], i in reads.partly))
  found.update(i for i in reads.by_zero & reads.partly
               if _compat.all_zero(consts[i], partly=True))
  found.update(i for i in reads.by_uniform
               if structure.uniform_constant(consts[i]))
  return found


def _leading_arguments_name_outputs(jaxpr, s: structure.Structure,
                                    call: CallLowering) -> str | None:
  """Why a shared lowering's leading arguments (constants and literals
  passed first) would change how pjit names its outputs' shardings, or
  None. pjit names an output's sharding after the first argument's mesh
  sharding it finds: the argument's own sharding where equivalent, else
  one read from the compiled placement. A leading argument would be that
  first one, and on a mesh with an axis of size one (where ``P('x')`` and
  a replicated placement are the same) the read spec differs from the
  argument's: not shared where an argument or output has such a mesh
  sharding."""
  if not (s.literals or s.hoisted or _compat.closed_parts(jaxpr)[1]):
    return None
  if any(isinstance(x, NamedSharding) and 1 in x.mesh.axis_sizes
         for x in (*call.in_shardings, *call.out_shardings)):
    return ("a mesh sharding over an axis of size one among its arguments or "
            "outputs: pjit names the outputs' shardings after the first "
            "argument's, which a constant passed first would be")
  return None


def _key(s: structure.Structure, call: CallLowering, baked: Baked) -> tuple:
  return (s.key, call._replace(pgle_profiler=None), _compat.trace_context(),
          baked.at, baked.values)


def _shared(jaxpr, s: structure.Structure, call: CallLowering,
            baked: Baked = _NONE_BAKED):
  key = _key(s, call, baked)
  entry = LOWERINGS.store.get(key)
  if entry is not None and entry.serves(s):
    LOWERINGS.count("hits")
    if cache.verifying() and not _verified(jaxpr, s, call, entry):
      return call.stock(jaxpr)
    return Bound(entry.computation,
                 _arguments(jaxpr, s, entry.lifted, baked), key, entry)
  consts = _compat.closed_parts(jaxpr)[1]
  if entry is not None:
    lifted = entry.widened(s.bits)
  else:
    first = LOWERINGS.first_meeting(hash(key))
    if first is None:   # met once: stock's own lowering
      LOWERINGS.count("met_once")
      computation = call.stock(jaxpr)
      # (a nested jit's constants are baked into stock's lowering too)
      LOWERINGS.met_first(hash(key), s.bits,
                          None if consts or s.hoisted else computation)
      _explain_first_meeting(call, s)
      return computation
    bits, weak = first
    alive = None if weak is None else weak()
    if (alive is not None and not consts and not s.hoisted
        and bits == s.bits):
      # the first meeting's own lowering takes exactly these arguments
      entry = SharedLowering((False,) * len(bits), bits, alive, baked)
      LOWERINGS.store.put(key, entry)
      LOWERINGS.count("hits")
      if cache.verifying() and not _verified(jaxpr, s, call, entry):
        return call.stock(jaxpr)
      return Bound(alive, [], key, entry)
    lifted = (tuple(b != f for b, f in zip(s.bits, bits))
              if len(bits) == len(s.bits) else (True,) * len(s.bits))
  changed = lifted
  for level, baking in _bakings(jaxpr, s, baked):
    lifted = _apart_from_constants(s, changed, baking.held)
    try:
      slots = _lifted_slots(_compat.closed_parts(jaxpr)[0], lifted)
    except Exception as e:   # stock's own lowering answers
      LOWERINGS.refuse(
          f"the lowering with arguments failed ({type(e).__name__})")
      return call.stock(jaxpr)   # (lowered after the block: not ours)
    folds = _folds(jaxpr, slots, baking)
    if folds is None:
      break
  if folds is not None:
    LOWERINGS.refuse(_REFUSED_FOLDING[folds.reason])
    if _explaining():
      logger.warning("jax_closure_cache: tier A does not share %s's "
                     "lowering: %s", call.name, folds.detail)
    return call.stock(jaxpr)
  if baking is not baked:   # (small constants too: the structure's rule)
    if len(_BAKES_SMALL) >= MET_CAPACITY:
      _BAKES_SMALL.clear()
    _BAKES_SMALL[s.key] = level
    baked, key = baking, _key(s, call, baking)
  try:
    computation = _lower_lifted(jaxpr, slots, call, baked)
  except DeadConstant as e:
    LOWERINGS.refuse(str(e))
    computation = None
  except Exception as e:   # stock's own lowering answers (and its errors)
    LOWERINGS.refuse(f"the lowering with arguments failed ({type(e).__name__})")
    computation = None
  if computation is None:   # (lowered after the block: no context of ours)
    return call.stock(jaxpr)
  entry = SharedLowering(lifted, s.bits, computation, baked)
  LOWERINGS.store.put(key, entry)
  LOWERINGS.count("compiles")
  if baked.at:
    LOWERINGS.count("baked")
  return Bound(computation, _arguments(jaxpr, s, lifted, baked), key, entry)


def _bakings(jaxpr, s: structure.Structure, baked: Baked):
  """``(level, constants baked)`` a new shared lowering may take, in the
  order tried: ``baked`` (:func:`_baked_constants`), then, where they add
  to it, the small constants of each level (:data:`_BAKES_SMALL`)."""
  yield _BAKES_SMALL.get(s.key), baked
  consts = _compat.closed_parts(jaxpr)[1]
  at = baked.at
  for level in (1, 2):
    if level <= (_BAKES_SMALL.get(s.key) or 0):
      continue
    more = _small_constants(consts, level)
    if not more <= at:
      at = at | more
      yield level, Baked.of(consts, at)


def _folds(jaxpr, slots: frozenset, baked: Baked):
  """``folding.difference`` of ``jaxpr`` with its constants but ``baked``'s
  and the literals at ``slots`` passed as arguments (its nested jits'
  constants too)."""
  consts = _compat.closed_parts(jaxpr)[1]
  if not baked.at:
    return folding.difference(jaxpr, constants_lifted=True,
                              lifted_literals=slots)
  passed = {id(c) for i, c in enumerate(consts) if i not in baked.at}
  if any(id(consts[i]) in passed for i in baked.at):   # (one object twice)
    return folding.Finding("folds_constants", "a constant both baked and "
                           "passed")
  return folding.difference(jaxpr, lifted_literals=slots,
                            lifted_constants=passed, nested_lifted=True)


def _explain_first_meeting(call: CallLowering, s: structure.Structure):
  """With explanations on: where this structure first differs from the last
  one lowered under the same name (why tier A found nothing to share)."""
  if not _explaining():
    return
  with LOWERINGS.lock:
    last = LOWERINGS.last_by_name.get(call.name)
    LOWERINGS.last_by_name[call.name] = s.key
    if len(LOWERINGS.last_by_name) > MET_CAPACITY:
      LOWERINGS.last_by_name.pop(next(iter(LOWERINGS.last_by_name)))
  logger.warning("jax_closure_cache: tier A met %s's structure for the "
                 "first time (stock's own lowering)%s", call.name,
                 "" if last is None else
                 "; it differs from the last one at "
                 + structure.first_difference(last, s.key))


def _arguments(jaxpr, s: structure.Structure, lifted: tuple,
               baked: Baked) -> list:
  # NumPy constants as they are now (stock bakes them when it compiles): a
  # trace holds a view of the user's array, which pjit's fast path would
  # otherwise read on every later call
  consts = _compat.closed_parts(jaxpr)[1]
  if baked.at:
    consts = [c for i, c in enumerate(consts) if i not in baked.at]
  consts = _own_constants(consts)
  return [*consts, *(v for v, lift in zip(s.literals, lifted) if lift),
          *_own_constants(s.hoisted)]


def _apart_from_constants(s: structure.Structure, lifted: tuple,
                          held: frozenset = frozenset()) -> tuple:
  """``lifted`` without the literals whose value (dtype and bits) the
  module also holds as a constant (another top-level literal, lifted by
  no flag, or one of a jaxpr it holds, which XLA inlines): stock's module
  holds the two as one constant (XLA's CSE), so a rewrite that needs one
  value used twice (``jnp.where(x > 2.0, x, s)`` into ``max(x, 2.0)``
  where ``s`` is 2.0) applies there; such a literal is keyed by value.
  ``held``: the values of the baked constants of one element, constants
  of both modules too (:class:`Baked`)."""
  if not any(lifted):
    return lifted
  if all(lifted) and not held:   # (the constants: the fixed literals alone)
    return tuple(h not in s.fixed for h in s.held)
  constants = set(s.fixed)
  constants.update(held)
  constants.update(h for h, lift in zip(s.held, lifted) if not lift)
  return tuple(lift and h not in constants for h, lift in zip(s.held, lifted))


def _lifted_slots(open_jaxpr, lifted: tuple) -> frozenset:
  """Where the literals the ``lifted`` flags pass as arguments are:
  ``(equation index, operand index)``, ``(None, output index)`` for an
  output. The flags follow the literals a shared lowering may take as
  arguments (``structure.lifted_operands``, ``structure.lifted_literal``)
  in the jaxpr's order."""
  flags = iter(lifted)
  slots = []
  runtime = set(open_jaxpr.invars)
  for n, e in enumerate(open_jaxpr.eqns):
    live = structure.reads_runtime(runtime, e)
    if live and any(type(v) is _compat.Literal for v in e.invars):
      slots += [(n, i) for i, lift in enumerate(
          structure.lifted_operands(e, live)) if lift and next(flags)]
  slots += [(None, i) for i, v in enumerate(open_jaxpr.outvars)
            if structure.lifted_literal(v) and next(flags)]
  return frozenset(slots)


def _lower_lifted(jaxpr, slots: frozenset, call: CallLowering,
                  baked: Baked = _NONE_BAKED):
  """Stock's lowering of ``jaxpr`` with its constants but ``baked``'s and
  the literals at ``slots`` (``_lifted_slots``) as leading arguments, one
  for each; ``baked``'s constants held by value, as stock holds them."""
  open_jaxpr, consts = _compat.closed_parts(jaxpr)
  new_vars: list = []

  def operand(v, slot):
    if slot in slots:
      new = _compat.Var(v.aval)
      new_vars.append(new)
      return new
    return v

  hoisted_vars: list = []

  def equation(n, e):
    e = e.replace(invars=[operand(v, (n, i)) for i, v in enumerate(e.invars)])
    if structure.hoists(e):   # a nested jit's constants: its first operands
      inner, _ = _compat.closed_parts(e.params["jaxpr"])
      _, params = structure.constants_as_inputs(e)
      outer = [_compat.Var(v.aval) for v in inner.constvars]
      hoisted_vars.extend(outer)
      e = e.replace(invars=[*outer, *e.invars], params=params)
    return e

  eqns = list(map(equation, range(len(open_jaxpr.eqns)), open_jaxpr.eqns))
  outvars = [operand(v, (None, i)) for i, v in enumerate(open_jaxpr.outvars)]
  kept = [i for i in range(len(consts)) if i in baked.at]
  passed = [v for i, v in enumerate(open_jaxpr.constvars)
            if i not in baked.at]
  leading = [*passed, *new_vars, *hoisted_vars]
  n = len(leading)
  closed = _compat.with_leading_inputs(
      open_jaxpr, [*leading, *open_jaxpr.invars], eqns, outvars, n,
      constvars=[open_jaxpr.constvars[i] for i in kept],
      consts=[_baked_value(consts[i]) for i in kept])
  if not call.keep_unused and not all(_compat.used_inputs(closed)[:n]):
    # pjit would prune such an argument, and pair the constants it is
    # passed with the wrong shardings
    raise DeadConstant("a constant or literal only dead code reads")
  return call.with_leading(n).stock(closed)


def _baked_value(c):
  """A baked constant as the lowering holds it: a NumPy array's copy (the
  user's may change in place; the key holds the bytes it had)."""
  return np.array(c) if isinstance(c, np.ndarray) else c


class DeadConstant(Exception):
  """A leading argument the lowering would prune."""


def _verified(jaxpr, s, call, entry) -> bool:
  """Verify mode: this jaxpr lowered afresh the same way is the module the
  hit runs (counted; a mismatch logged)."""
  with _compat.oracle_muted():
    fresh = _lower_lifted(jaxpr, _lifted_slots(
        _compat.closed_parts(jaxpr)[0], entry.lifted), call, entry.baked)
  same = module_form(fresh.as_text()) == module_form(
      entry.computation.as_text())
  cache.count_verified(same)
  if not same:
    logger.warning(
        "jax_closure_cache: verify mismatch in tier A for %s: the shared "
        "lowering differs from this jaxpr's own; stock's lowering answers",
        call.name)
  return same


# a symbol: a bare name or a quoted one (``@"<lambda>_0"``)
_SYMBOL = r'@("(?:[^"\\]|\\.)*"|[\w.$-]+)'
_FUNC = re.compile(r"^  func\.func (?:public |private )?" + _SYMBOL + r"\(",
                   re.M)
_CALLEE = re.compile(_SYMBOL)


def module_form(text: str) -> tuple:
  """A lowered module's text as a value equal for modules computing alike:
  its header, and its ``main`` named by what it computes (its own text,
  each function it calls named the same way, recursively, by a SHA-256),
  so two private copies of one nested jaxpr's function (the lowering
  makes one per jaxpr object: two for two objects of equal structure, one
  for one object) read as one."""
  starts = [(m.start(), m.group(1)) for m in _FUNC.finditer(text)]
  bodies = {}
  for (start, name), end in zip(starts, [s for s, _ in starts[1:]] + [None]):
    body = text[start:end]
    close = body.rfind("\n  }")
    bodies[name] = body[:close + 4] if close >= 0 else body
  forms: dict = {}

  def form(name: str, seen: frozenset) -> str:
    if name in forms:
      return forms[name]
    if name not in bodies or name in seen:
      return name   # not a function of this module (an attribute, a cycle)
    body = bodies[name]
    seen = seen | {name}
    at = _FUNC.match(body).end() - 1   # after the function's own name
    calls = _CALLEE.sub(lambda m: "@" + form(m.group(1), seen), body[at:])
    forms[name] = hashlib.sha256(
        (body[:body.index("@")] + calls).encode()).hexdigest()
    return forms[name]

  head = text[:starts[0][0]] if starts else text
  return head, form("main", frozenset())


def _explaining() -> bool:
  return settings.read(settings.EXPLAIN)


def _cache_clear() -> None:
  _for_call.cache_clear()
  STOCK.cache_clear()


cache.STORE.own("shared.for_call", _for_call, cache.Store.CALLS)
pjit_lower.cache_clear = _cache_clear
pjit_lower.cache_info = STOCK.cache_info
if hasattr(STOCK, "cache_keys"):
  pjit_lower.cache_keys = STOCK.cache_keys
if hasattr(STOCK, "evict_weakref"):
  pjit_lower.evict_weakref = STOCK.evict_weakref

#: The replacement of each of ``_compat.lowering.LOWERING_PATCH_POINTS``.
REPLACEMENTS = types.MappingProxyType({"_pjit_lower": pjit_lower})
