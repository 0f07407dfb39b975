"""The rebuild: ``fun`` with the lifted positions of its key filled.

``rebuild(fun, key, leaves)`` returns a callable that computes what ``fun``
computes, with the lifted positions holding ``leaves`` (tracers, at trace
time). It is guided by ``key``, so walk and rebuild cannot disagree on
order. Unchanged parts are the caller's own objects (cells included), so a
trace that mutates closure state mutates the user's state, as a stock trace
does; plain objects holding lifted arrays are shallow copies.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any, Callable

from jax_closure_cache import _compat
from jax_closure_cache.key import closure
from jax_closure_cache.key.closure import Uncacheable, as_method
from jax_closure_cache.key.code_plan import code_plan
from jax_closure_cache.key.parts import (
    BUILTIN_NODES, CLASS, COPY, CYCLE, DYN, FN, LIFTED, METHOD, MISSING, OBJ,
    PARTIAL, TREE, TREEAUX, TREEDEF, WEAKREF, WRAPPER, FnPart, Tag)

_tree_flatten = _compat.jax.tree_util.tree_flatten
_tree_unflatten = _compat.jax.tree_util.tree_unflatten


def _has_lifted(k) -> bool:
  """Whether the part holds a lifted leaf or a back-reference. A function
  reached a second time (through another cell, a partial, a container) is a
  back-reference; if its first occurrence is rebuilt, every holder of the
  second must be rebuilt too, or it keeps calling the original, whose
  arrays the trace would then capture as constants."""
  if k is LIFTED:
    return True
  if type(k) is tuple and k:
    if (k[0] is CYCLE or k[0] is DYN) and len(k) == 2:
      return True
    if k[0] is OBJ:   # kept whole: their arrays are kept by identity
      return False
    return any(_has_lifted(x) for x in k)
  return False


def _is_cycle(k) -> bool:
  return type(k) is tuple and len(k) == 2 and k[0] is CYCLE


class _Rebuild:
  __slots__ = ("leaves", "memo", "keep")

  def __init__(self, leaves):
    self.leaves = iter(leaves)
    self.memo: dict[int, Any] = {}   # memo index -> rebuilt function
    self.keep: list = []   # rebuilt objects only weak references reach

  def value(self, v, k):
    if k is LIFTED:
      return next(self.leaves)
    if type(k) is not tuple or not k or type(k[0]) is not Tag:
      return v
    tag = k[0]
    if tag is CYCLE:
      return self.memo.get(k[1], v)
    if tag is DYN:
      return next(self.leaves)
    if not _has_lifted(k):
      return v
    if tag is FN:
      return self.function(v, k)
    if tag is TREE:
      leaves, treedef = _tree_flatten(v)
      return _tree_unflatten(
          treedef, [self.value(x, kx) for x, kx in zip(leaves, k[2])])
    if tag is TREEAUX:
      leaves, treedef = _tree_flatten(v)
      treedef = self.treedef(treedef, k[1])   # first: the walk's order
      return _tree_unflatten(
          treedef, [self.value(x, kx) for x, kx in zip(leaves, k[2])])
    if tag is PARTIAL:
      func = self.value(v.func, k[1])
      args = [self.value(a, ka) for a, ka in zip(v.args, k[2])]
      kws = {name: self.value(v.keywords[name], ka) for name, ka in k[3]}
      return functools.partial(func, *args, **kws)
    if tag is METHOD:
      return types.MethodType(self.value(v.__func__, k[1]),
                              self.value(v.__self__, k[2]))
    if tag is WRAPPER:
      static, inner = closure.wrapper_rules[k[1]].split(v)
      return closure.wrapper_rules[k[1]].join(static, self.value(inner, k[3]))
    if tag is COPY:
      return self.copy(v, k)
    if tag is TREEDEF:
      return self.treedef(v, k[1])
    if tag is CLASS:   # only back-references inside: classes stay as they are
      return v
    if tag is WEAKREF:
      target = self.value(v(), k[1])
      self.keep.append(target)   # alive as long as the rebuilt function
      return weakref.ref(target)
    raise AssertionError(f"lifted leaf under {tag}")

  def treedef(self, treedef, parts):
    """``treedef`` with each custom node's data rebuilt (``Analysis.
    node_parts`` made ``parts``)."""
    if parts is None or not _has_lifted(parts):
      return treedef
    t, aux_key, children_parts = parts
    aux = treedef.node_data()[1]
    if t not in BUILTIN_NODES:
      aux = self.value(aux, aux_key)
    children = [self.treedef(c, p)
                for c, p in zip(treedef.children(), children_parts)]
    return _compat.make_treedef(treedef, (t, aux), children)

  def copy(self, obj, k):
    """A shallow copy of a plain object with its lifted attributes replaced;
    the user's object is never modified (a trace that sets an attribute sets
    it on the copy)."""
    _, index, t, items, _ = k   # the class itself is never rebuilt
    new = object.__new__(t)
    self.memo[index] = new
    attrs = dict(vars(obj))
    for name, kx in items:
      if _has_lifted(kx):
        attrs[name] = self.value(attrs[name], kx)
    vars(new).update(attrs)
    return new

  def function(self, f, k):
    part = FnPart._make(k)
    index, code, cells_k, defaults_k, kwdefaults_k, globals_k = (
        part.index, part.code, part.cells, part.defaults, part.kwdefaults,
        part.globals)
    closure = f.__closure__
    g = f.__globals__
    plan = code_plan(code)
    lifted_globals = any(_has_lifted(x) for x in globals_k)
    if lifted_globals:
      if plan.writes_globals:
        raise Uncacheable("writes_globals", f"{f.__qualname__} assigns to a "
                          "global and reads a global array")
      g = dict(g)   # the rebuilt function reads its own copy
    new_cells = None
    if closure is not None:
      new_cells = tuple(
          types.CellType() if _has_lifted(ck) or _is_cycle(ck) else c
          for c, ck in zip(closure, cells_k))
    new = types.FunctionType(code, g, f.__name__, None, new_cells)
    self.memo[index] = new
    if closure is not None:
      for c, nc, ck in zip(closure, new_cells, cells_k):
        if nc is not c:
          nc.cell_contents = self.value(c.cell_contents, ck)
    if f.__defaults__ is not None:
      new.__defaults__ = tuple(
          self.value(x, kx) for x, kx in zip(f.__defaults__, defaults_k))
    if f.__kwdefaults__ is not None:
      new.__kwdefaults__ = {
          name: self.value(f.__kwdefaults__[name], kx)
          for name, kx in kwdefaults_k}
    if lifted_globals:
      for name, kx in zip(plan.global_names, globals_k):
        if kx is not MISSING:
          g[name] = self.value(g[name], kx)
    copy_function_metadata(f, new)
    return new


def copy_function_metadata(src: types.FunctionType,
                           dst: types.FunctionType) -> None:
  """What ``FunctionType(code, ...)`` does not copy from ``src``."""
  dst.__qualname__ = src.__qualname__
  dst.__module__ = src.__module__
  dst.__doc__ = src.__doc__
  dst.__annotations__ = src.__annotations__
  dst.__dict__.update(src.__dict__)


def rebuild(fun: Callable, key, leaves) -> Callable:
  """``fun`` with the lifted positions of ``key`` filled from ``leaves``.

  ``key`` must be ``analyse(fun).key`` and ``leaves`` as long as its leaves.
  """
  r = _Rebuild(leaves)
  out = r.value(as_method(fun) or fun, key)
  if next(r.leaves, MISSING) is not MISSING:
    raise AssertionError("more leaves than lifted positions")
  if r.keep:
    try:   # the rebuilt function holds what its weak references reach
      out.__closure_cache_keep__ = r.keep
    except AttributeError:
      raise Uncacheable("weakref", "a weak reference under an object "
                        "without attributes") from None
  return out


