"""``jax.lax``'s control flow with the closure cache, without global patching.

``from jax_closure_cache import lax`` then ``lax.while_loop(...)``: same
signatures and results as ``jax.lax``; eager calls with fresh closures reuse
one executable per closure key (see :mod:`jax_closure_cache.control_flow`).
"""

from jax_closure_cache.control_flow import (  # noqa: F401
    cond, fori_loop, map, scan, switch, while_loop)

__all__ = ["cond", "fori_loop", "map", "scan", "switch", "while_loop"]
