"""Layer two: the closure key inside JAX's memoized trace lookup.

* ``closure_key``: the module the upstream series adds to JAX as
  ``jax/_src/closure_key.py`` (byte for byte): the compact key, the shared
  trace store, the closure-keyed ``trace_to_jaxpr`` and its explanations.
* ``trace_lookup``: how the package puts that module in front of JAX's
  ``pe.trace_to_jaxpr`` and pjit's constant handling in monkey-patch mode,
  and ``call_shared``, which the front's lifted functions evaluate.

Invariants: the first function object of a key is traced exactly as stock
traces it; a shared trace is stored only when the key covers every captured
constant; everything is reachable from ``jax.clear_caches()``.
"""
