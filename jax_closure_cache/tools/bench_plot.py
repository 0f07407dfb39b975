"""``bench --plot FILE.png``: the picture of what the cache changes.

Left: per-call wall time over the first 50 calls of seed 001's loop (a
closure over a new ``w`` each call), stock jit vs this cache vs the
hand-hoisted function, log scale. Right: cache over its baseline per row of
the run's ``jit`` table. Needs matplotlib (``pip install '.[plot]'``).
"""

from __future__ import annotations


def write(path: str, report: dict, calls: int = 50) -> None:
  """Draw the figure for ``report`` (the bench's JSON report) to ``path``."""
  try:
    import matplotlib
  except ImportError:
    raise SystemExit("--plot needs matplotlib: pip install "
                     "'jax-closure-cache[plot]'") from None
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  from jax_closure_cache.tools import bench

  loop = bench.loop_times(calls)
  rows = report.get("jit", [])
  fig, (left, right) = plt.subplots(
      1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
  for name, style in (("stock", "tab:red"), ("cache", "tab:blue"),
                      ("hoisted", "tab:green")):
    left.plot(range(1, calls + 1), loop[name], label=name, color=style,
              marker="o" if name == "cache" else None, markersize=3)
  left.set_yscale("log")
  left.set_xlabel("call (a new closure over a new w each call)")
  left.set_ylabel("wall time per call, µs (log)")
  left.set_title("seed 001: jax.jit(inner)(x), tanh(x @ w), 4x4")
  left.legend()
  names = [r["workload"] for r in rows]
  ratios = [r["cache_over_hoisted"] for r in rows]
  right.barh(range(len(rows)), ratios, color="tab:blue")
  right.set_yticks(range(len(rows)), [n[:38] for n in names], fontsize=7)
  right.axvline(1.0, color="black", linewidth=0.8)
  right.invert_yaxis()
  right.set_xlabel("cache / baseline (hoisted, or stock if long-lived)")
  right.set_title("per row of the jit table")
  fig.suptitle(f"jax-closure-cache, {report.get('machine', '')}",
               fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
