"""``jax.lax``'s control flow with the closure cache, without global patching.

``from jax_closure_cache import lax`` then ``lax.while_loop(...)``: same
signatures and results as ``jax.lax``; eager calls with fresh closures reuse
one executable per closure key (see :mod:`jax_closure_cache.control_flow.launchers`).
"""

from jax_closure_cache.control_flow import launchers as _control_flow

cond = _control_flow.cond
custom_linear_solve = _control_flow.custom_linear_solve
custom_root = _control_flow.custom_root
fori_loop = _control_flow.fori_loop
map = _control_flow.map  # noqa: A001 -- mirrors jax.lax.map
scan = _control_flow.scan
switch = _control_flow.switch
while_loop = _control_flow.while_loop

__all__ = ["cond", "custom_linear_solve", "custom_root", "fori_loop", "map", "scan", "switch", "while_loop"]
