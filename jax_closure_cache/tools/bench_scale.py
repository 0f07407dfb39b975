"""The benchmark row for scaling out, in its own process so that the
device count can be set before jax initialises: seed 001's closure
``jnp.tanh(x @ w)`` over a weight sharded on a (data, model) mesh of 8 host
devices, re-created every call: stock jit, the cache, and the hand-hoisted
function taking ``w`` (the cache and the hoisted function are called
alternately). The cache keeps a closed-over committed array by identity, as
stock bakes it, so each new weight is stock's trace (tier A may share the
executable); a weight met again hits.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from jax_closure_cache.tools import multiprocess

TARGETS = {"sharded": "none: stock's own path"}


def _sharded_worker(calls: int) -> dict:
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jax_closure_cache import _compat
  from jax_closure_cache.front import entrance

  mesh = jax.make_mesh((4, 2), ("data", "model"))
  x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P("data", None)))
  ws = [jax.device_put(jnp.eye(64) * (i + 1.0),
                       NamedSharding(mesh, P(None, "model"))) for i in range(4)]
  make = lambda w: (lambda v: jnp.tanh(v @ w))
  hoisted = jax.jit(lambda v, w: jnp.tanh(v @ w))

  def timed(call):
    t = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - t

  stock = [timed(lambda i=i: jax.jit(make(ws[i % 4]))(x)) for i in range(8)]
  for i in range(3):
    entrance.jit(make(ws[i % 4]))(x)
    hoisted(x, ws[i % 4])
  cache_t, hoisted_t = [], []
  with _compat.count_compiles() as compiles:
    for i in range(calls):
      w = ws[i % 4]
      cache_t.append(timed(lambda: entrance.jit(make(w))(x)))
      hoisted_t.append(timed(lambda: hoisted(x, w)))
  return {"stock_us": statistics.median(stock[1:]) * 1e6,
          "cache_us": statistics.median(cache_t) * 1e6,
          "hoisted_us": statistics.median(hoisted_t) * 1e6,
          "cache_compiles": compiles(), "cache_calls": calls}


def _run_sharded(calls: int) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  env.pop("JAX_CLOSURE_CACHE", None)
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache.tools.bench_scale",
                        "sharded", str(calls)], capture_output=True, text=True,
                       env=env, cwd=multiprocess.package_parent(),
                       timeout=900)
  if out.returncode != 0:
    raise RuntimeError(out.stdout + out.stderr)
  return json.loads(out.stdout.strip().splitlines()[-1])


def run(calls: int = 500) -> list[dict]:
  r = _run_sharded(calls)
  row = {"workload": "seed001 tanh(x@w) 64x64, w sharded (data, model) "
         "on 8 devices", "key": "sharded", **r, "stock_error": None}
  row["stock_over_cache"] = row["stock_us"] / row["cache_us"]
  row["cache_over_hoisted"] = row["cache_us"] / row["hoisted_us"]
  row["target"] = TARGETS[row["key"]]
  return [row]


def format_table(rows: list[dict]) -> str:
  lines = ["| workload | stock µs | cache µs | hoisted µs | stock/cache | "
           "cache/hoisted | cache compiles in timed calls | target |",
           "|" + "---|" * 8]
  for r in rows:
    stock = (f"{r['stock_us']:.1f}" if r["stock_us"] is not None
             else f"fails: {r['stock_error']}")
    ratio = ("—" if r["stock_over_cache"] is None
             else f"{r['stock_over_cache']:.2f}x")
    compiles = ("—" if r["cache_compiles"] is None
                else f"{r['cache_compiles']} of {r['cache_calls']}")
    lines.append(f"| {r['workload']} | {stock} | {r['cache_us']:.1f} | "
                 f"{r['hoisted_us']:.1f} | {ratio} | "
                 f"{r['cache_over_hoisted']:.2f} | {compiles} | {r['target']} |")
  return "\n".join(lines)


if __name__ == "__main__":
  if sys.argv[1] == "sharded":
    print(json.dumps(_sharded_worker(int(sys.argv[2]))), flush=True)
