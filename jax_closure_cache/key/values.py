"""Values the walk looks at before it walks them: committed arrays kept by
identity, static values, callable wrappers (the closure key's registry),
and functions whose identity is fresh per call, in tuples and in pytree
node data.

Invariants: nothing here walks a value or calls user code; the wrapper
rules are the closure key module's own table (``WRAPPERS``), so its walk
and rebuild and the package's see the same registrations.
"""

from __future__ import annotations

import functools
import types

from jax_closure_cache import _compat
from jax_closure_cache.key.code_plan import is_stable
from jax_closure_cache.key.objects import as_method
from jax_closure_cache.key.parts import BUILTIN_NODES

_key = _compat.closure_key_module()
_FunctionType = types.FunctionType


# -- committed arrays ---------------------------------------------------------

def kept_by_identity(x) -> bool:
  """Whether a committed array is kept by identity rather than lifted.

  An array on one device stays by identity: stock bakes it and computes on
  the default device, where as an argument it would commit the result to
  its own device. An array sharded over several devices, or spanning
  devices of other processes (which stock cannot close over at all), is
  lifted: as an argument it keys the executable by its sharding exactly as
  jit keys any committed argument, and results follow that sharding as in
  the hand-hoisted function.
  """
  try:
    return x.is_fully_addressable and len(x.sharding.device_set) == 1
  except Exception:   # no sharding to read: keep it by identity
    return True


# -- static values ------------------------------------------------------------

class Static:
  """Values a caller holds static (a launcher's loop bounds, a jitted
  function's non-function static arguments), keyed by value and exact
  top-level types, never made auto-dynamic: they are how a stock function
  is called, not values a closure reads. ``value`` is the tuple given."""
  __slots__ = ("value",)

  def __init__(self, *value):
    self.value = value

  def _id(self):
    return tuple([type(v) for v in self.value]), self.value

  def __eq__(self, other):
    return type(other) is Static and self._id() == other._id()

  def __hash__(self):
    return hash(self._id())

  def __repr__(self):
    return f"Static{self.value!r}"


# -- callable wrappers that the walk sees through ---------------------------

#: The wrapper rules, by class: the closure key's registry.
wrapper_rules = _key.WRAPPERS


def register_wrapper(cls: type, split, join) -> None:
  """Key instances of ``cls`` by a static part plus the values they wrap:
  the closure key's ``register_wrapper``, whose walk and rebuild both use
  it. The package's own ``jit`` wrapper and jaxprs (``jaxpr_key``) register
  here."""
  global _wrapper_types
  _key.register_wrapper(cls, split, join)
  _wrapper_types = tuple(wrapper_rules)


_wrapper_types: tuple = ()   # the registered classes (their subclasses too)


def fresh_function(x, depth: int = 4):
  """``x``, or the first item of a tuple in it, that is a function whose
  identity is fresh per call (a closure or user function, a partial, a
  bound method, a registered wrapper, a callable object); else None."""
  t = type(x)
  if t is _FunctionType:
    return x if x.__closure__ is not None or not is_stable(x) else None
  if (t is functools.partial or t is types.MethodType
      or isinstance(x, _wrapper_types) or as_method(x) is not None):
    return x
  if depth > 0 and isinstance(x, tuple):
    for y in x:
      found = fresh_function(y, depth - 1)
      if found is not None:
        return found
  return None


def node_data_function(treedef):
  """The first such function a custom node of ``treedef`` carries in its
  node data (a pytree class keeping ``apply=model.apply`` as aux data), or
  None. Its hash is then the function's identity, new per call, so the
  tree is keyed node by node instead. A node whose children are all leaves
  is not descended into, so a dict of arrays costs one look."""
  pending = [treedef]
  while pending:
    t = pending.pop()
    data = t.node_data()
    if data is None:
      continue
    if data[0] not in BUILTIN_NODES:
      found = fresh_function(data[1])
      if found is not None:
        return found
    if t.num_nodes != t.num_leaves + 1:
      pending.extend(t.children())
  return None
