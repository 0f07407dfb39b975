"""``python -m jax_closure_cache doctor``: whether this package can run on
the installed jax, check by check.

Invariants: reads JAX only through ``_compat`` (whose names it checks are
there and shaped as the package expects); changes nothing.
"""

from __future__ import annotations

import inspect

import jax
import jaxlib

import jax_closure_cache
from jax_closure_cache import _compat

#: Parameter names of every JAX callable the package wraps or calls, as read
#: in the pinned release.
EXPECTED_SIGNATURES = {
    "jax.jit": ("fun", "in_shardings", "out_shardings", "static_argnums",
                "static_argnames", "donate_argnums", "donate_argnames",
                "keep_unused", "device", "backend", "inline",
                "compiler_options"),
    "jax.lax.while_loop": ("cond_fun", "body_fun", "init_val"),
    "jax.lax.fori_loop": ("lower", "upper", "body_fun", "init_val", "unroll"),
    "jax.lax.scan": ("f", "init", "xs", "length", "reverse", "unroll",
                     "_split_transpose"),
    "jax.lax.map": ("f", "xs", "batch_size"),
    "jax.lax.cond": ("pred", "true_fun", "false_fun", "operands", "operand"),
    "jax.lax.switch": ("index", "branches", "operands", "operand"),
    "jax.lax.custom_linear_solve": ("matvec", "b", "solve", "transpose_solve",
                                    "symmetric", "has_aux"),
    "jax.lax.custom_root": ("f", "initial_guess", "solve", "tangent_solve",
                            "has_aux"),
    "jax.scipy.sparse.linalg.cg": ("A", "b", "x0", "tol", "atol", "maxiter",
                                   "M"),
    "jax.scipy.sparse.linalg.bicgstab": ("A", "b", "x0", "tol", "atol",
                                         "maxiter", "M"),
}


def _check_array_impl() -> bool:
  x = jax.numpy.zeros(())
  return (type(x) is _compat.ArrayImpl
          and isinstance(_compat.is_committed(x), bool))


def check_patch_points() -> list[tuple[str, bool, str]]:
  """(what, ok, detail) for every JAX internal this package relies on."""
  originals = {"jax.jit": _compat.STOCK_JIT, **{
      f"jax.lax.{n}": f for n, f in _compat.STOCK_CONTROL_FLOW.items()}, **{
      f"jax.scipy.sparse.linalg.{n}": f
      for n, f in _compat.STOCK_SOLVERS.items()}}
  results = []
  for name, expected in EXPECTED_SIGNATURES.items():
    try:
      params = tuple(inspect.signature(originals[name]).parameters)
    except (TypeError, ValueError) as e:
      results.append((name, False, f"no signature: {e}"))
      continue
    ok = params == expected
    results.append((name, ok, "signature as expected" if ok else
                    f"signature {params}, expected {expected}"))
  for owner in _compat.CONTROL_FLOW_OWNERS:
    present = [n for n in _compat.STOCK_CONTROL_FLOW if hasattr(owner, n)]
    results.append((f"{owner.__name__} control flow", bool(present),
                    "patchable: " + ", ".join(present)))
  checks = {
      "jax._src.config.disable_jit": lambda: isinstance(
          _compat.DISABLE_JIT.value, bool),
      "jax._src.config.explain_cache_misses": lambda: isinstance(
          _compat.explain_cache_misses(), bool),
      "jax._src.core.trace_state_clean": lambda: (
          _compat.trace_state_clean() is True),
      "jaxlib ArrayImpl._committed": _check_array_impl,
      "jax.stages.Traced.jaxpr / _consts": lambda: isinstance(
          _compat.captured_constants(_compat.STOCK_JIT(lambda x: x).trace(1.0)),
          list),
      "jax._src.monitoring._event_listeners": lambda: isinstance(
          _compat.monitoring_active(), bool),
      "trace lookup patch points": lambda: all(
          callable(getattr(owner, name))
          for owner, name in _compat.trace.TRACE_PATCH_POINTS),
  }
  for name, check in checks.items():
    try:
      ok = bool(check())
      detail = "found" if ok else "unexpected value"
    except Exception as e:  # anything missing or renamed
      ok, detail = False, f"{type(e).__name__}: {e}"
    results.append((name, ok, detail))
  return results


def main(hook: str | None) -> int:
  """Print every check (``hook``: the start-up hook's path, if installed);
  exit 1 on any mismatch."""
  what = _compat.SUPPORTED_RELEASES.get(jax.__version__)
  rows = [("jax version", what is not None,
           f"{jax.__version__} (supported: {_compat.supported_text()})"),
          ("jaxlib version", jaxlib.__version__ == jax.__version__,
           f"{jaxlib.__version__} (must equal jax's)")]
  rows += check_patch_points()
  rows.append(("start-up hook", hook is not None,
               hook or "not installed (pip install . installs it)"))
  print("jax_closure_cache doctor")
  for name, ok, detail in rows:
    print(f"  [{'ok' if ok else 'MISMATCH'}] {name}: {detail}")
  print(f"  [info] mode: {jax_closure_cache.mode()}")
  print("  [info] layers on this release: " + (
      "1-3 (closure key, JAX's trace lookup, fast front)"
      if _compat.trace.TRACE_LOOKUP else
      "1 and 3 (closure key, fast front); JAX's trace lookup is left stock: "
      + "; ".join(_compat.trace.TRACE_LOOKUP_MISSING)))
  from jax_closure_cache.front import entrance
  print("  [info] fast front's C entrance: " + (
      "built" if entrance.entrance_built() else "not built (pure Python: about 0.15 us more per "
      "re-created closure; install with a C compiler to build it)"))
  print(f"  [info] cache active: {jax_closure_cache.is_enabled()}")
  from jax_closure_cache import settings
  for line in settings.table().splitlines():
    print(f"  [info] setting {line}")
  from jax_closure_cache import patching
  early = patching.built_before_enable()
  print("  [info] stock jitted functions taking functions statically, built "
        "before enable() outside JAX: " + (
            ", ".join(early) + " (fresh functions passed to these compile on "
            "every call: enable() before importing their modules)"
            if early else "none"))
  bad = [name for name, ok, _ in rows if not ok]
  print("all checks passed" if not bad else f"{len(bad)} mismatch(es): "
        + ", ".join(bad))
  return 1 if bad else 0
