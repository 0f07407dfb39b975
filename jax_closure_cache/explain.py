"""Explanations of the front's misses, retraces and fallbacks, built from
the names ``key/names.py`` gives a key's parts: ``explain_miss``,
``retrace_changes``, ``describe_static_parts`` and ``name_uncacheable``
turn keys, or a function, into sentences.

Invariants: pure functions of keys and functions (nothing here logs, counts
or stores); a part this module cannot name is reported as such, never
guessed; an explanation never raises into the user's call (one that fails
says so, with the error's type).
"""

from __future__ import annotations

import functools
import types

import jax

from jax_closure_cache.key import closure
from jax_closure_cache.key import parts as key_parts
from jax_closure_cache.key.names import (
    differences, function_names, named_parts)


def _never_raises(sentences: bool = True):
  """An explanation that fails is reported as a sentence (or, where the
  caller has its own words, as None), not raised: the call it explains goes
  on as it would without explanations."""
  def decorate(explanation):
    @functools.wraps(explanation)
    def explained(*args, **kwargs):
      try:
        return explanation(*args, **kwargs)
      except Exception as e:   # a key shape this module does not know
        return ([f"(this explanation failed: {type(e).__name__}: {e})"]
                if sentences else None)
    return explained
  return decorate


@_never_raises()
def explain_miss(fun, full_key, previous: list) -> list[str]:
  """What differs from the nearest earlier key of the same code. A key is
  ``(options, closure key, *context)``: a canonical object's holds the
  captured-constants threshold and the PRNG options after them (compared
  where both keys have them)."""
  options, key, *context = full_key
  if not previous:
    return ["first call of this code"]
  best = None
  for old_options, old_key, *old_context in previous:
    diffs = differences(fun, old_key, key)
    if old_context and context and old_context != context:
      diffs = ["the captured-constants threshold or the PRNG options "
               "changed"] + diffs
    if old_options != options:
      diffs = ["jit options changed"] + diffs
    elif not diffs and old_key != key:
      diffs = ["the closure's contents changed in a part this explanation "
               "cannot name"]
    if best is None or len(diffs) < len(best):
      best = diffs
  if best:
    return best
  if len(previous) == 1:
    # by design: the first object of a code was stock's own
    return ["same closure contents as the first function object of this "
            "code, which stock jit traced; this second object compiles the "
            "shared lifted entry that later ones hit"]
  return ["same closure contents as an earlier miss, whose entry is gone "
          "(evicted past capacity, cleared, or not stored: see the "
          "'entry not stored' explanation)"]


def describe_static_parts(tree) -> list[tuple[str, str]]:
  """(path, description) of every node's static part (pytree aux data) in
  ``tree``, functions by their qualified name, in flattening order."""
  out = []
  pending = [("args", jax.tree_util.tree_structure(tree))]
  while pending:
    path, treedef = pending.pop()
    data = treedef.node_data()
    if data is None:
      continue
    kind, aux = data
    if aux is not None and kind not in (dict, list, tuple):
      out.append((f"{path}: {kind.__name__}", _describe_aux(aux)))
    for i, child in enumerate(treedef.children()):
      pending.append((f"{path}[{i}]", child))
  return out


def _describe_aux(aux) -> str:
  if isinstance(aux, (tuple, list)):
    return "(" + ", ".join(_describe_aux(a) for a in aux) + ")"
  if callable(aux) and hasattr(aux, "__qualname__"):
    code = getattr(aux, "__code__", None)
    where = f" at {code.co_filename}:{code.co_firstlineno}" if code else ""
    return f"function {aux.__qualname__}{where} (object {id(aux):#x})"
  return repr(aux)


@_never_raises()
def retrace_changes(fun, key, old_avals, new_avals, old_static=None,
                    new_static=None) -> list[str]:
  """What made a stored entry trace again: the lifted arrays whose types
  changed, or the static part of an argument (a function in pytree aux
  data) that did."""
  names = [n for n, p in named_parts(fun, key) if p is key_parts.LIFTED]
  changes = [f"{n} changed: {_aval(a)} -> {_aval(b)} (lifted array: same entry, "
             "new trace)"
             for n, a, b in zip(names, old_avals, new_avals) if a != b]
  if old_static is not None and new_static is not None:
    changes += [f"the static part of {p} changed: {a} -> {b}"
                for (p, a), (q, b) in zip(old_static, new_static)
                if p == q and a != b]
  return changes


def _aval(aval) -> str:
  if not hasattr(aval, "str_short"):
    return str(aval)
  weak = " (weakly typed)" if getattr(aval, "weak_type", False) else ""
  return aval.str_short() + weak


@_never_raises(sentences=False)
def name_uncacheable(fun) -> str | None:
  """Which top-level value made ``fun`` uncacheable, as ``cell 'x' holds ...``."""
  if not isinstance(fun, types.FunctionType):
    return None
  code = fun.__code__
  args, global_names = function_names(code)
  defaults = fun.__defaults__ or ()
  values = ([(f"cell {n!r}", c) for n, c in zip(code.co_freevars,
                                                 fun.__closure__ or ())]
            + [(f"default {n!r}", d) for n, d in
               zip(args[len(args) - len(defaults):], defaults)]
            + [(f"kwdefault {k!r}", v) for k, v in (fun.__kwdefaults__ or {}).items()]
            + [(f"global {n!r}", fun.__globals__[n]) for n in global_names
               if n in fun.__globals__])
  for name, value in values:
    if name.startswith("cell"):
      try:
        value = value.cell_contents
      except ValueError:
        continue
    try:
      closure.analyse(_holding(value))
    except closure.Uncacheable as e:
      if e.reason == "tracer":
        return f"{name} holds a tracer ({e.detail})"
      if e.reason == "unhashable":
        return (f"{name} holds an unhashable {type(value).__name__} "
                f"({e.detail})")
      return f"{name} holds a {type(value).__name__} ({e.reason}: {e.detail})"
  return None


def _holding(value):
  return lambda: value
