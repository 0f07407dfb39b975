"""Eager control flow through the front: ``launchers`` routes
``while_loop``, ``fori_loop``, ``scan``, ``cond``, ``switch``, ``map``,
``custom_linear_solve`` and ``custom_root`` called outside any trace through
the jit wrapper, so fresh bodies share one executable per closure key. The
public namespace is ``jax_closure_cache.lax``.

Invariants: inside a trace, and for anything a launcher cannot key, JAX's
own function runs unchanged.
"""
