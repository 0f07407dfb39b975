"""Benchmark rows for the upstream pull requests with PR 1's option off: a
copy of the installed jax carrying them against a pristine copy next to it, each
timed in its own processes (one jax per process), rounds alternating
between the two.

* a long-lived jitted closure (``tanh(x @ w)``, 4x4), called many times: the
  C++ fast path, which the pull requests do not touch;
* a long-lived closure-free jitted function;
* an eager ``while_loop`` with long-lived ``cond`` and ``body``: every call
  binds ``jit_p`` eagerly (``_pjit_call_impl_python``, where PR 1 reads its
  option) and dedups the loop's constants (PR 2).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET = 1.02   # patched (option off) over pristine
WORKLOADS = ("long-lived closure tanh(x@w) 4x4",
             "long-lived closure-free function",
             "eager while_loop, long-lived body")


def _worker(calls: int) -> dict:
  import jax
  import jax.numpy as jnp

  option = getattr(jax.config, "jax_share_lowering_by_structure", None)
  assert not option   # absent (pristine) or off (patched)
  w, x = jnp.full((4, 4), 0.1), jnp.ones((4, 4))
  closure = jax.jit(lambda v: jnp.tanh(v @ w))
  free = jax.jit(lambda v: v * 2 + 1)
  cond = lambda c: c[0] < 3
  body = lambda c: (c[0] + 1, jnp.tanh(c[1] @ w))
  runs = {WORKLOADS[0]: lambda: closure(x),
          WORKLOADS[1]: lambda: free(x),
          WORKLOADS[2]: lambda: jax.lax.while_loop(cond, body, (0, x))[1]}
  out = {}
  for name, run in runs.items():
    n = calls if name != WORKLOADS[2] else max(calls // 10, 50)
    for _ in range(20):
      jax.block_until_ready(run())
    times = []
    for _ in range(n):
      t = time.perf_counter()
      jax.block_until_ready(run())
      times.append(time.perf_counter() - t)
    out[name] = statistics.median(times) * 1e6
  out["carries_prs"] = option is not None
  return out


def _run(pythonpath: str | None, calls: int) -> dict:
  env = dict(os.environ)
  env.pop("JAX_CLOSURE_CACHE", None)
  if pythonpath:
    env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
  code = ("import json, sys; from jax_closure_cache.tools import bench_upstream as b; "
          f"print(json.dumps(b._worker({calls})))")
  out = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=600)
  if out.returncode:
    raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def run(calls: int = 4000, rounds: int = 7) -> list[dict]:
  """Rows: each side's median over rounds, and the median of the rounds'
  patched/pristine ratios (a round runs one process of each, back to back,
  so slow drifts of the machine cancel; processes differ by a few percent
  on their own)."""
  from jax_closure_cache.tools import patch_tool
  with tempfile.TemporaryDirectory() as folder:
    # Two copies side by side, one patched, so that nothing but the PRs
    # differs between the two sides (not where the files lie, nor caches).
    copies = [os.path.join(folder, side) for side in ("pristine", "patched")]
    for copy in copies:
      shutil.copytree(os.path.join(patch_tool.default_target(), "jax"),
                      os.path.join(copy, "jax"),
                      ignore=shutil.ignore_patterns("__pycache__"))
    code, message = patch_tool.apply(copies[1])
    if code != patch_tool.OK:
      raise RuntimeError(message)
    pristine, patched = [], []
    for _ in range(rounds):
      pristine.append(_run(copies[0], calls))
      patched.append(_run(copies[1], calls))
  assert not any(r["carries_prs"] for r in pristine)
  assert all(r["carries_prs"] for r in patched)
  rows = []
  for name in WORKLOADS:
    a = statistics.median(r[name] for r in pristine)
    b = statistics.median(r[name] for r in patched)
    ratio = statistics.median(q[name] / p[name]
                              for p, q in zip(pristine, patched))
    rows.append({"workload": name, "pristine_us": a, "patched_us": b,
                 "ratio": ratio, "target": TARGET})
  return rows


def table(rows: list[dict]) -> str:
  lines = ["| workload | pristine jax µs | patched jax, option off µs | "
           "patched/pristine (target) |", "|---|---|---|---|"]
  for r in rows:
    met = "met" if r["ratio"] <= r["target"] else "MISSED"
    lines.append(f"| {r['workload']} | {r['pristine_us']:.1f} | "
                 f"{r['patched_us']:.1f} | {r['ratio']:.2f} "
                 f"(≤ {r['target']}: {met}) |")
  return "\n".join(lines)
