"""Closure-aware caching for ``jax.jit`` and eager control flow.

Behind the ``jax_closure_cache`` option (default off; also read from the
``JAX_CLOSURE_CACHE`` environment variable): ``jax.jit`` keys its cache on a
function's code object plus the contents of its closure, verified free of
tracers, and passes closed-over arrays as arguments to one shared executable,
so re-created closures (nested ``def``, ``lambda`` in a loop,
``functools.partial``, a re-wrapped ``jax.grad``) stop retracing and
recompiling. Eager ``jax.lax`` control flow with fresh closures reuses one
executable the same way.

Every module in this package except ``hooks`` is generated from the
jax-closure-cache project; see its CONTRIBUTING.md.
"""
