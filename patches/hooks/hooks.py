"""Public entry points that dispatch on the ``jax_closure_cache`` option.

``jax.jit``, ``jax.closure_convert`` and ``jax.lax``'s ``while_loop``,
``fori_loop``, ``scan``, ``cond``, ``switch``, ``map``,
``custom_linear_solve`` and ``custom_root`` are these dispatchers: with the option off
(the default) each calls JAX's own function, unchanged; with it on, the
closure-cache version in this package. JAX's internal modules keep calling
the functions where they are defined, so they never dispatch.
"""

import functools
import importlib

from jax._src import config


def _dispatching(stock, module: str, name: str):
  target = None

  @functools.wraps(stock)
  def dispatch(*args, **kwargs):
    nonlocal target
    if config.closure_cache.value:
      if target is None:
        target = getattr(importlib.import_module(module), name)
      return target(*args, **kwargs)
    return stock(*args, **kwargs)
  return dispatch


def dispatching_jit(stock_jit):
  return _dispatching(stock_jit, "jax._src.closure_cache.closure_jit", "jit")


def _control_flow():
  from jax._src.lax.control_flow import conditionals, loops, solves
  out = {name: _dispatching(getattr(loops, name),
                            "jax._src.closure_cache.control_flow", name)
         for name in ("while_loop", "fori_loop", "scan", "map")}
  out.update({name: _dispatching(getattr(conditionals, name),
                                 "jax._src.closure_cache.control_flow", name)
              for name in ("cond", "switch")})
  out.update({name: _dispatching(getattr(solves, name),
                                 "jax._src.closure_cache.control_flow", name)
              for name in ("custom_linear_solve", "custom_root")})
  return out


# One dispatcher per function, shared by jax.lax and jax._src.lax.
_CONTROL_FLOW = _control_flow()
while_loop = _CONTROL_FLOW["while_loop"]
fori_loop = _CONTROL_FLOW["fori_loop"]
scan = _CONTROL_FLOW["scan"]
map = _CONTROL_FLOW["map"]  # noqa: A001 -- mirrors jax.lax.map
cond = _CONTROL_FLOW["cond"]
switch = _CONTROL_FLOW["switch"]
custom_linear_solve = _CONTROL_FLOW["custom_linear_solve"]
custom_root = _CONTROL_FLOW["custom_root"]


def closure_convert(fun, *example_args):
  # Resolved at call time: this module is imported before custom_derivatives.
  from jax._src import custom_derivatives
  if config.closure_cache.value:
    from jax._src.closure_cache import convert
    return convert.closure_convert(fun, *example_args)
  return custom_derivatives.closure_convert(fun, *example_args)
