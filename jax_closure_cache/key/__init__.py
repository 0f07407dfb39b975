"""Layer one: the closure key.

What a function reads (cells, defaults, globals its code loads, attribute
chains, helpers), as a hashable key plus the lifted leaves, and everything
built on that key:

* ``closure_key``: the key's base: its markers, the budget, the generic
  walk (``Walk``) and rebuild (``Rebuild``) the rules of ``closure`` extend,
  and which globals a code reads (``code_names``).
* ``state_watch``: what a trace may write in the user's state, undone if a
  lifted trace stored a tracer there.
* ``parts``: the key's markers and the named views of its compound parts.
* ``code_plan``: what a code reads (globals, attribute chains, written
  cells), and which modules are the library's.
* ``values``, ``objects``, ``trees``: checks the walk makes of a value, of
  a plain object and its class, and of a pytree; the rule registry for
  wrappers (``values.register_wrapper``).
* ``closure``: the walk (``analyse``), the key, the lifted leaves, anchors
  and guard roots.
* ``rebuild``: the key-guided rebuild that puts tracers in the lifted
  positions.
* ``match_plan`` and ``matchers``: which keys get the hot path's per-key
  checks, and those checks, generated as code.
* ``names``: the key's parts named for explanations.
* ``guards``: captured arrays the key does not cover, held weakly.
* ``jaxpr``: jaxprs keyed by structure (a wrapper rule).

Invariants: nothing here knows of jit, the trace lookup or the front; a key
holds no array and no object stock would free (arrays are leaves, objects
are held weakly as anchors); two functions with equal keys compute the same
thing when their leaves are swapped in.
"""
