"""``bench --only memory``: what a never-repeating closure key keeps alive.

A training step whose update closes over a new Python float each step (a
learning-rate schedule), ``STEPS`` steps, in a fresh process per way (stock
``jax.jit``; the cache, monkey-patch mode): the growth of the process's
resident memory and of the executables the backend holds, from step 20 on.

Invariants: each way runs in its own process, so neither sees the other's
caches; the figures are read after a ``gc.collect()``.
"""

from __future__ import annotations

import json
import subprocess
import sys

STEPS = 300
WARM = 20


def _worker(way: str, steps: int) -> dict:
  import gc
  import jax
  import jax.numpy as jnp
  from jax_closure_cache import _compat
  if way == "cache":
    import jax_closure_cache
    jax_closure_cache.enable()

  def rss_mib() -> float:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * 4096 / 2**20

  x = jnp.ones((8, 64))

  def step(params, lr):
    def update(p):
      g = jax.grad(lambda q: jnp.mean(jnp.tanh(x @ q["w"] + q["b"]) ** 2))(p)
      return jax.tree.map(lambda a, b: a - lr * b, p, g)
    return jax.jit(update)(params)

  params = {"w": jnp.ones((64, 64)) * 0.01, "b": jnp.zeros(64)}
  for i in range(WARM):
    params = step(params, 0.1 / (1 + i))
  jax.block_until_ready(params)
  gc.collect()
  rss0, live0 = rss_mib(), _compat.live_executables()
  for i in range(steps):
    params = step(params, 0.1 / (WARM + 1 + i))
  jax.block_until_ready(params)
  gc.collect()
  return {"way": way, "steps": steps, "rss_growth_mib": rss_mib() - rss0,
          "live_executables": _compat.live_executables(),
          "live_executables_growth": _compat.live_executables() - live0,
          "checksum": float(params["w"].sum())}


def run(steps: int = STEPS) -> list[dict]:
  rows = []
  for way in ("stock", "cache"):
    print(f"bench: {steps} steps, a new Python float each, {way} ...",
          file=sys.stderr, flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "jax_closure_cache.tools.bench_memory", way,
         str(steps)], capture_output=True, text=True, timeout=1200,
        check=True)
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
  return rows


def format_table(rows: list[dict]) -> str:
  stock = rows[0]
  lines = ["| way | steps | RSS growth MiB | live executables (growth) | "
           "RSS vs stock | executables vs stock |", "|" + "---|" * 6]
  for r in rows:
    rss_ratio = (max(r["rss_growth_mib"], 1.0)
                 / max(stock["rss_growth_mib"], 1.0))
    exe_ratio = (max(r["live_executables"], 1)
                 / max(stock["live_executables"], 1))
    lines.append(
        f"| {r['way']} | {r['steps']} | {r['rss_growth_mib']:+.1f} | "
        f"{r['live_executables']} ({r['live_executables_growth']:+d}) | "
        f"{rss_ratio:.2f} | {exe_ratio:.2f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(json.dumps(_worker(sys.argv[1], int(sys.argv[2]))))
