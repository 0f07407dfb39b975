"""The rebuild: ``fun`` with the lifted positions of its key filled.

``rebuild(fun, key, leaves)`` returns a callable that computes what ``fun``
computes, with the lifted positions holding ``leaves`` (tracers, at trace
time). It is the closure key's ``Rebuild`` with steps for the parts the
package's walk adds (``closure.Analysis``), guided by ``key``, so walk and
rebuild cannot disagree on order. Unchanged parts are the caller's own
objects (cells included), so a trace that mutates closure state mutates the
user's state, as a stock trace does; plain objects holding lifted arrays
are shallow copies.
"""

from __future__ import annotations

import types
from typing import Callable

from jax_closure_cache import _compat
from jax_closure_cache.key import closure_key
from jax_closure_cache.key import closure
from jax_closure_cache.key import trees
from jax_closure_cache.key.closure import Uncacheable, as_method
from jax_closure_cache.key.code_plan import code_plan
from jax_closure_cache.key.state_watch import StateWatch
from jax_closure_cache.key.parts import (
    BUILTIN_NODES, CLASS, COPY, METHOD, TREEAUX, TREEDEF, MethodPart,
    NodePart, ObjPart, TreeAuxPart, TreeDefPart, tree_part)

_key = closure_key
_tree_flatten = _compat.jax.tree_util.tree_flatten
_tree_unflatten = _compat.jax.tree_util.tree_unflatten


class Rebuild(_key.Rebuild):
  """The closure key's rebuild with the package's parts: objects kept
  whole (``OBJ``: their arrays are kept by identity), shallow copies of
  plain objects (``COPY``), bound methods, treedefs and pytrees whose node
  data holds functions, and classes (only back-references inside: kept as
  they are)."""
  KEPT_PARTS = closure.REBUILD_KEPT
  INDEXED_PARTS = _key.Rebuild.INDEXED_PARTS | closure.REBUILD_INDEXED
  STEPS = types.MappingProxyType({
      **_key.Rebuild.STEPS, TREEAUX: "tree_aux", TREEDEF: "treedef",
      METHOD: "method", COPY: "copy", CLASS: "klass"})
  walk = closure.Analysis

  def klass(self, v, k):
    return v

  def method(self, v, k):
    m = MethodPart._make(k)
    return types.MethodType(self.value(v.__func__, m.func),
                            self.value(v.__self__, m.instance))

  def tree(self, v, k):
    """A pytree with its lifted leaves replaced, each dict in the user's
    insertion order (an unflatten sorts them)."""
    leaves, treedef = _tree_flatten(v)
    return self._unflatten(v, treedef, leaves, tree_part(k).leaves)

  def tree_aux(self, v, k):
    t = TreeAuxPart._make(k)
    leaves, treedef = _tree_flatten(v)
    treedef = self.treedef(treedef, (TREEDEF, t.nodes))   # first: the walk's order
    return self._unflatten(v, treedef, leaves, t.leaves)

  def _unflatten(self, v, treedef, leaves, parts):
    given = [self.value(x, kx) for x, kx in zip(leaves, parts)]
    out = _tree_unflatten(treedef, given)
    if trees.has_dict(treedef):   # (an unflatten sorts a dict's keys)
      out = trees.restore_order(v, out)
    if not trees.rebuilt_as_given(v, out, leaves, given):
      raise Uncacheable(
          "pytree_state", f"the unflatten of a {type(v).__name__} gave other "
          "state than the object's own (a constructor that converts, node "
          "data dropped, attributes in another order, one object rebuilt "
          "as two), where stock's trace reads the object as it is")
    return out

  def treedef(self, treedef, k):
    """``treedef`` with each custom node's data rebuilt (``Analysis.
    node_parts`` made the part's ``nodes``)."""
    parts = TreeDefPart._make(k).nodes
    if parts is None or not self.has_leaf(parts):
      return treedef
    node = NodePart._make(parts)   # its class's part (node.klass): kept
    aux = treedef.node_data()[1]
    if node.type not in BUILTIN_NODES:
      aux = self.value(aux, node.aux)
    children = [self.treedef(c, (TREEDEF, p))
                for c, p in zip(treedef.children(), node.children)]
    return _compat.make_treedef(treedef, (node.type, aux), children)

  def copy(self, obj, k):
    """A shallow copy of a plain object with its lifted attributes replaced;
    the user's object is never modified (a trace that sets an attribute sets
    it on the copy)."""
    o = ObjPart._make(k)   # its class (o.klass) is never rebuilt
    new = object.__new__(type(obj))   # (the key holds the class's id)
    self.memo[o.index] = new
    attrs = dict(vars(obj))
    for name, kx in o.items:
      if self.has_leaf(kx):
        attrs[name] = self.value(attrs[name], kx)
    vars(new).update(attrs)
    return new

  def own_globals(self, f) -> dict:
    if code_plan(f.__code__).writes_globals:
      raise Uncacheable("writes_globals", f"{f.__qualname__} assigns to a "
                        "global and reads a global array")
    return super().own_globals(f)


def rebuild(fun: Callable, key, leaves) -> Callable:
  """``fun`` with the lifted positions of ``key`` filled from ``leaves``.

  ``key`` must be ``analyse(fun).key`` and ``leaves`` as long as its leaves.
  """
  return _key.rebuild(as_method(fun) or fun, key, leaves, Rebuild)


def call_lifted(fun: Callable, key, leaves, args, kwargs):
  """The body of a lifted trace whose function is the user's own: ``fun``
  rebuilt with ``leaves`` (tracers) in the lifted positions of ``key``,
  called with ``args`` and ``kwargs`` under the state watch
  (``StateWatch.run_lifted``): a write to the rebuild's copy of an object,
  or a traced value left in the user's, raises ``TracerLeak``, as does a
  question of a lifted array's value ``LiftedValueAsked``. The front's
  entries and ``closure_convert`` trace through it; the trace lookup's
  shared traces, which later functions take without tracing, watch more
  (``StateWatch.run_unwritten``)."""
  new = rebuild(fun, key, leaves)
  return StateWatch.run_lifted(fun, new, lambda: new(*args, **kwargs),
                               leaves)
