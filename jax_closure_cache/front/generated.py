"""The fast front: what a re-created closure's call costs on a hit.

Layer three of the design (the closure key is ``closure``, the shared
lookup ``front/wrapper.py``). A hit is the inline cache's match of the function
followed by a call of the stored entry's jitted function; this module
generates both as one Python frame.

For a code object whose stored keys have matchers (``key/matchers.py``),
:func:`front_class` makes a subclass of ``ClosureJitted`` whose
``__call__`` is generated: each stored key's checks inline, then the hit
(:data:`HIT`), else the generic ``__call__``. ``jit(fun)`` picks that
class for ``fun.__code__`` when it makes a wrapper, so a hit runs no frame
of ours but this one and the entry's C++ dispatch. Where the extension
``_entrance`` is built, :func:`entrance` makes that wrapper in C, so ``jit``'s
own frame is skipped too.

Invariants:

* The generated ``__call__`` answers exactly as the generic one: it takes
  the hit only for a wrapper not called before (``_row is None``; its
  class fixes the code and the hot spec), whose function nothing refers
  to weakly (so it has no identity row), and for a key whose entry is
  alive and has no guards; everything else goes to the generic
  ``__call__`` unchanged.
* The generic path's hit is :func:`hit_function` of the same source, so
  the two cannot drift apart.
* Entries are read through weak references; a class holds no user object
  but what the matchers compare with by identity, as the quick matchers do.
"""

from __future__ import annotations

import functools
import os
import textwrap
import types

from jax_closure_cache import _compat
from jax_closure_cache.front import entries
from jax_closure_cache.lowering import structure as _structure

#: Filename of every generated front (in tracebacks and profiles): below
#: the package's folder, so that JAX's traceback filter hides it as it
#: hides the package's other frames.
FILENAME = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "<closure-cache front>")

#: The call of a stored entry, run with ``self``, ``f`` (its function),
#: ``key``, ``entry`` (its stored entry, alive and guard-free), ``out`` (the
#: lifted leaves), ``args`` and ``kwargs`` bound: the one text of it, in the
#: hit (:data:`HIT`) and in the wrapper's ``_call_entry``
#: (:func:`call_entry_function`).
CALL = """\
# Spelled out for one to three arguments (an eager loop's launcher takes
# one to three): a call through ``*args`` costs the C++ dispatch about
# 0.2 us more. If it traces, the lifted function
# rebuilds ``f``, passed with the call (Entry.caller).
# A failed call's stock retry is made after the ``try`` statement: stock's
# own error then carries no exception of the entry's as its context.
entry.caller = f
failed = None
try:
  values = entry.values
  if values is not None:   # (raises where stock folds a leaf)
    # each leaf's kept answer (``structure.leaves_known``): a leaf not
    # kept, or one the entry's reads refuse, is checked in full
    masks = entry.value_masks
    if (masks is None or masks[0] is not values
        or not LEAVES_KNOWN(out, masks[1], LEAF_ANSWERS)):
      CHECK_VALUES(entry, out)
  if kwargs:
    res = entry.jitted(out, *args, **kwargs)
  elif len(args) == 1:
    res = entry.jitted(out, args[0])
  elif len(args) == 2:
    res = entry.jitted(out, args[0], args[1])
  elif len(args) == 3:
    res = entry.jitted(out, args[0], args[1], args[2])
  else:
    res = entry.jitted(out, *args)
except Exception as e:
  failed = e
finally:
  entry.caller = None
if failed is not None:
  return RETRY_STOCK(self, key, args, kwargs, failed)
if entry.traces != entry.checked:   # traced a new signature
  res = NEW_SIGNATURE(self, key, entry, out, args, kwargs, res)
return res
"""

#: The hit: counts it, pins the entry to this wrapper (the row), publishes
#: the row when the function may be wrapped again, and calls (:data:`CALL`).
HIT = f"""\
entry.record.front += 1   # counts in stats() and as the entry's use
if MONITORING.{_compat.MONITORING_LISTENERS}:
  RECORD_EVENT("/jax_closure_cache/hit")
row = self._row = PINNED(entry, key, out)
if getrefcount(f) > LONE:
  # Someone else holds the object and may wrap it again: its row must be
  # found. (Held by this wrapper alone, it can only be reached through it:
  # __wrapped__ publishes it.)
  table = self._spec.table
  table[REF(f, table.pop)] = row
""" + CALL

#: The generic hit's and ``_call_entry``'s first line: their leaves may be
#: host arrays (a lifted NumPy array), put on the device under a transfer
#: guard (``entries.guarded_leaves``). A generated front's are jax arrays.
GUARDED = "out = GUARDED_LEAVES(out)\n"

#: Verify mode's line, put before HIT's ``return`` while it is on.
VERIFY = "res = VERIFIED(self, f, key, entry, out, args, kwargs, res)\n"


#: A jit hit's first lines: staged into a jaxpr being built (an outer
#: ``jit``, ``make_jaxpr``: ``_compat.staging``), the call is stock's, so
#: the staged jaxpr holds the closed-over arrays inside the inner
#: computation as stock's does (a hit would pass them as its operands).
#: Read as one comparison at the top level.
STAGED = """\
if TRACE_STATE.value is not EVAL_TRACE and STAGING():
  return STAGED_CALL(self, args, kwargs)
"""


def hit_source(verify: bool, staged: bool = True) -> str:
  """:data:`HIT`, checked against stock's trace where ``verify``; with
  ``staged``, stock's under a staging trace first (:data:`STAGED`; a
  launcher's is checked before its match)."""
  head = STAGED if staged else ""
  if not verify:
    return head + HIT
  body, _, tail = HIT.rpartition("return res\n")
  return head + body + VERIFY + "return res\n" + tail


def hit_function(env: dict, verify: bool = False):
  """``hit(self, f, key, entry, out, args, kwargs)``: :data:`HIT` as a
  function, for the generic ``__call__``. ``env`` binds the names HIT uses
  (MONITORING, RECORD_EVENT, PINNED, getrefcount, getweakrefcount, REF,
  RETRY_STOCK, VERIFIED, GUARDED_LEAVES, CHECK_VALUES, LEAF_ANSWERS,
  LEAVES_KNOWN, TRACE_STATE, EVAL_TRACE, STAGING, STAGED_CALL and
  LONE_REFS: the
  references to a function held by a wrapper alone, as a front counts
  them)."""
  text = ("def hit(self, f, key, entry, out, args, kwargs):\n"
          + textwrap.indent(GUARDED + hit_source(verify), "  "))
  namespace = dict(env)
  # the caller's own name for the function is one more reference
  namespace["LONE"] = env["LONE_REFS"] + 1
  exec(compile(text, FILENAME, "exec"), namespace)
  return namespace["hit"]


def call_entry_function(env):
  """``_call_entry(self, entry, key, out, args, kwargs)``: :data:`CALL` as
  a wrapper's method, for its slow path and the later calls of a pinned
  function object, whose callers count and pin. ``env`` binds RETRY_STOCK,
  CHECK_VALUES, LEAF_ANSWERS, LEAVES_KNOWN, NEW_SIGNATURE and
  GUARDED_LEAVES."""
  text = ("def _call_entry(self, entry, key, out, args, kwargs):\n"
          "  f = self._fun   # what a trace rebuilds\n"
          + textwrap.indent(GUARDED + CALL, "  "))
  namespace = dict(env)
  exec(compile(text, FILENAME, "exec"), namespace)
  return namespace["_call_entry"]


#: A launcher's return after its hit (``launch_source``), in place of
#: HIT's ``return``s: the user function's row recorded where something
#: other than the launch held it (``held``, counted before the match), the
#: operands an entry forwards given back as the caller's own, as the
#: generic launch (``_Launcher.launch``) does after its wrapper's call.
LAUNCHED = """\
if held:
  self.remember()
row = self._row
if type(row) is PINNED and row.entry.forwarded is not None:
  return self._as_forwarded(args, res)
return res
"""

#: The hit's call of a stock retry, which a launcher follows by LAUNCHED.
_RETRY = "return RETRY_STOCK(self, key, args, kwargs, failed)\n"


def launch_source(verify: bool) -> str:
  """:func:`hit_source` for a launcher's ``launch(self, args, lone)``: each
  of its two ``return`` statements followed by :data:`LAUNCHED` instead
  (the retry's inside its ``if``)."""
  head, sep, tail = hit_source(verify, staged=False).rpartition(
      "return res\n")
  retry_at = head.find(_RETRY)
  if not sep or tail.strip() or retry_at < 0 or head.count(_RETRY) != 1:
    raise AssertionError("HIT's returns are not where launch_source "
                         "expects them")
  indent = head[head.rfind("\n", 0, retry_at) + 1:retry_at]
  retried = ("res = " + _RETRY[len("return "):]
             + textwrap.indent(LAUNCHED, indent))
  return head.replace(_RETRY, retried) + LAUNCHED


def _keyed_blocks(quicks, names: dict, hit: str, indent: str) -> list:
  """Each stored key's checks and ``hit``, as lines at ``indent``: a
  ``while True`` block per key whose ``break`` says "not this one"."""
  body = []
  for i, (key, src, entry_ref) in enumerate(quicks):
    lines = src.block(miss="break")
    names.update(src.env)   # bound names are unique: ``Q{i}_K{n}``
    names[f"KEY{i}"] = key
    names[f"ENTRY{i}"] = entry_ref
    body += [indent + "while True:   # stored key %d; break: not this one" % i,
             indent + "  try:",
             *(indent + line for line in lines),
             indent + "  except Exception:   # an unfilled cell, a failing "
             "flatten",
             indent + "    break",
             indent + f"  entry = ENTRY{i}()",
             indent + f"  if {entries.REFUSES_NEW_OBJECT}:",
             indent + "    break",
             indent + f"  key = KEY{i}",
             textwrap.indent(hit, indent + "  ").rstrip("\n")]
  return body


def front_class(base: type, spec, code, quicks, env: dict,
                verify: bool = False) -> type:
  """A subclass of ``base`` whose ``__call__`` takes the hit inline for
  ``quicks`` (``(key, source, entry_ref)`` triples, newest first, all of
  ``code`` and of ``spec``; each ``source`` from
  ``matchers.match_source(fun, key, f"Q{i}_K")``, whose checks say "not
  this key" with ``break`` here).

  Its instances are wrappers of functions of ``code`` with ``spec``: both
  are class attributes (shadowing ``base``'s slots, never assigned), so
  ``jit`` sets two fewer attributes per wrapper.

  Where ``base`` is a launcher's class (``base.front_launches``: eager
  control flow's), the class also gets a generated ``launch(self, args,
  lone)``: the generic ``base.launch`` (a wrapper's call followed by its
  launch's own steps) with the hit inline, for a user function
  (``self._user_fun``) that is a plain function nothing refers to weakly,
  followed by :data:`LAUNCHED`; ``lone``: the references to the user
  function a launch holds alone, counted from its frame."""
  names = dict(env)
  names.update(GENERIC=base.__call__, LONE=env["LONE_REFS"])
  body = ["def __call__(self, *args, **kwargs):",
          "  f = self._fun",
          "  if self._row is None and not getweakrefcount(f):",
          *_keyed_blocks(quicks, names, hit_source(verify), "    "),
          "  return GENERIC(self, *args, **kwargs)"]
  methods = {}
  if getattr(base, "front_launches", False):
    names.update(GENERIC_LAUNCH=base.launch,
                 FunctionType=types.FunctionType)
    launch = [
        "def launch(self, args, lone):",
        "  user = self._user_fun",
        "  f = self._fun",
        "  if (type(user) is FunctionType and self._row is None",
        "      and not getweakrefcount(user) and not getweakrefcount(f)):",
        "    # (counted before the match, whose locals may name it too)",
        "    held = getrefcount(user) > lone",
        "    kwargs = {}",
        *_keyed_blocks(quicks, names, launch_source(verify), "    "),
        "  return GENERIC_LAUNCH(self, args, lone)"]
    # The generic launch counts references to the user function from its
    # own frame: this one's locals (the match's among them) name nothing
    # when it is called.
    scratch = dict(names)
    exec(compile("\n".join(launch), FILENAME, "exec"), scratch)
    code_ = scratch["launch"].__code__
    if code_.co_cellvars or code_.co_freevars:   # (a local no line clears)
      raise AssertionError("a generated launch has cell variables")
    held = [v for v in code_.co_varnames if v not in ("self", "args", "lone")]
    launch.insert(-1, "  " + " = ".join(held) + " = None")
    body += launch
  exec(compile("\n".join(body), FILENAME, "exec"), names)
  if "launch" in names:
    methods["launch"] = names["launch"]
  cls = type(base.__name__, (base,), {
      "__slots__": (), "__call__": names["__call__"], **methods,
      "__module__": base.__module__, "__qualname__": base.__qualname__,
      "__doc__": base.__doc__, "_code": code, "_spec": spec,
      # keyed, split and joined as ``base`` (values.register_wrapper)
      "__keyed_as__": base})
  return cls


def _extension():
  """The C extension ``_entrance``, or None where it is not built (it is
  optional)."""
  try:
    from jax_closure_cache.front import _entrance
  except ImportError:
    return None
  return _entrance


def leaves_known_check():
  """The hit's value check, ``structure.leaves_known``: in C where the
  extension is built (one call per hit). An extension built from an older
  source has no such function: the Python one, then."""
  return getattr(_extension(), "leaves_known", _structure.leaves_known)


def entrance(jit, fronts: dict, base: type, slots: tuple,
             partials: bool = False):
  """``jit`` with its front path in C where the extension ``_entrance`` is
  built: a callable that answers ``jit(fun)`` for a function whose code has
  a class in ``fronts`` (a subclass of ``base``) by making that class's
  wrapper itself, as ``jit`` would, and passes every other call to ``jit``.
  It carries ``jit``'s name, docstring and signature (``__wrapped__``).
  Without the extension, ``jit`` itself.

  ``fronts`` must be the dict ``jit`` reads, cleared in place, never
  rebound: the entrance holds that very object. ``slots``: the slot
  descriptors of ``base`` that ``fill`` sets (function, stock object,
  row), which the entrance sets as ``fill`` does. ``partials``: a
  ``functools.partial`` of a plain function (any closure) is answered
  too, by its function's code's class, as ``jit``'s Python hot case
  answers it."""
  ext = _extension()
  if ext is None:
    return jit
  made = ext.Entrance(jit, fronts, base, *slots,
                            functools.partial if partials else None)
  functools.update_wrapper(made, jit)
  return made
