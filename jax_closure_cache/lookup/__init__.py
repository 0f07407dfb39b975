"""Layer two: the closure key inside JAX's memoized trace lookup.

* ``closure_cache``: the shared-trace store over layer one's
  ``key/closure_key.py``, the closure-keyed ``trace_to_jaxpr``, the
  weak-anchor holder and the explanations.
* ``trace_lookup``: how the package puts that module in front of JAX's
  ``pe.trace_to_jaxpr`` and pjit's constant handling, and
  ``call_shared``, which the front's lifted functions evaluate.

Invariants: the first function object of a key is traced exactly as stock
traces it; a shared trace is stored only when the key covers every captured
constant; everything is reachable from ``jax.clear_caches()``.
"""
