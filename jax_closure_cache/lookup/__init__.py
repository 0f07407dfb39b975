"""Layer two: the closure key inside JAX's memoized trace lookup.

* ``closure_key`` and ``closure_cache``: the modules the upstream series
  adds to JAX as ``jax/_src/closure_key.py`` and ``jax/_src/closure_cache.py``
  (byte for byte but for the line by which the second imports the first):
  the key (walk, rebuild), and the shared-trace store, the closure-keyed
  ``trace_to_jaxpr``, the weak-anchor holder and the explanations.
* ``trace_lookup``: how the package puts that module in front of JAX's
  ``pe.trace_to_jaxpr`` and pjit's constant handling in monkey-patch mode,
  and ``call_shared``, which the front's lifted functions evaluate.

Invariants: the first function object of a key is traced exactly as stock
traces it; a shared trace is stored only when the key covers every captured
constant; everything is reachable from ``jax.clear_caches()``.
"""
