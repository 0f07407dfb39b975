"""``bench --only jit``: times the workloads of ``bench_workloads`` (stock
``jax.jit`` on a re-created closure, this cache, and the hand-hoisted jitted
function, the limit; or stock and the cache on a long-lived object), all in
one process, and formats the table.

Invariants: times are medians of per-call wall time after a warm-up, the
cache and its baseline called alternately; trace and compile counts come
from JAX's own counters, over the timed calls.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
from jax_closure_cache import _compat, cache
from jax_closure_cache.front import entrance
from jax_closure_cache.tools.bench_workloads import WORKLOADS

STOCK_JIT = jax.jit


def loop_times(calls: int = 50) -> dict[str, list[float]]:
  """Per-call wall time (µs) of seed 001's loop over its first ``calls``
  calls, each with a new ``w``: stock jit of the re-created closure, this
  cache, and the hand-hoisted function (``--plot``)."""
  ws = [jnp.full((4, 4), 0.1 * (i % 5 + 1)) for i in range(calls)]
  x = jnp.ones((4, 4))

  def make(w):
    return lambda v: jnp.tanh(v @ w)
  hoisted = STOCK_JIT(lambda v, w: jnp.tanh(v @ w))
  ways = {"stock": lambda w: STOCK_JIT(make(w))(x),
          "cache": lambda w: entrance.jit(make(w))(x),
          "hoisted": lambda w: hoisted(x, w)}
  out = {}
  for name, call in ways.items():
    cache.clear()
    times = []
    for w in ws:
      t0 = time.perf_counter()
      call(w).block_until_ready()
      times.append((time.perf_counter() - t0) * 1e6)
    out[name] = times
  return out


def _median_us(call: Callable[[], object], n: int) -> tuple[float, int, int]:
  for _ in range(2):
    call()   # warm-up: the first call of a path compiles
  times = []
  with _compat.count_traces() as traces, _compat.count_compiles() as compiles:
    for _ in range(n):
      t0 = time.perf_counter()
      call()
      times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e6, traces(), compiles()


def _compiles_every_call(call: Callable[[], object], n: int) -> bool:
  """Whether each of ``n`` calls (after the warm-up) compiled: the cache
  sent every one to stock."""
  for _ in range(2):
    call()
  with _compat.count_compiles() as compiles:
    for _ in range(n):
      call()
  return compiles() >= n


def _interleaved_us(a: Callable[[], object], b: Callable[[], object],
                    n: int) -> tuple[float, float]:
  """Median per-call µs of ``a`` and of ``b``, called alternately, one call
  each in turn, so both see the same machine state (XLA's CPU threads wake
  up more or less promptly from one moment to the next, which moved whole
  rounds of one path by 20%)."""
  for _ in range(2):
    a()
    b()
  ta, tb = [], []
  for _ in range(n):
    t0 = time.perf_counter()
    a()
    t1 = time.perf_counter()
    b()
    t2 = time.perf_counter()
    ta.append(t1 - t0)
    tb.append(t2 - t1)
  return statistics.median(ta) * 1e6, statistics.median(tb) * 1e6


def run(calls: int = 2000, rounds: int = 3,
        match: tuple[str, ...] = ()) -> list[dict]:
  """Median per-call times (µs) and counts for every workload (or those
  whose name contains one of ``match``).

  In each of ``rounds`` rounds the cache and the baseline are called
  alternately, call by call; the ratio reported is the median of the
  rounds' ratios. Trace and compile counts are taken over a further
  ``calls`` cached calls, on their own.
  """
  rows = []
  for make in WORKLOADS:
    w = make()
    if match and not any(m in w.name for m in match):
      continue
    print(f"bench: {w.name} ({w.stock_calls} stock calls"
          + (", each a full trace and compile" if w.baseline == "hoisted"
             else "") + ") ...", file=sys.stderr, flush=True)
    cache.clear()
    stock_us, stock_tr, stock_co = _median_us(w.stock, w.stock_calls)
    # A workload the cache sends to stock compiles on every call: time it
    # over as few calls as stock, or one row would take stock's compile
    # time thousands of times over.
    falls_back = _compiles_every_call(w.cached, w.stock_calls)
    n = w.stock_calls if falls_back else calls
    pairs = [_interleaved_us(w.cached, w.hoisted, n)
             for _ in range(1 if falls_back else rounds)]
    pairs.sort(key=lambda p: p[0] / p[1])
    c_us, h_us = pairs[len(pairs) // 2]   # the round with the median ratio
    _, cache_traces, cache_compiles = _median_us(w.cached, n)
    rows.append({
        "workload": w.name, "baseline": w.baseline,
        "stock_us": stock_us, "cache_us": c_us, "hoisted_us": h_us,
        "stock_over_cache": stock_us / c_us,
        "cache_over_hoisted": c_us / h_us, "target": w.target,
        "met": None if w.target is None else c_us / h_us <= w.target,
        "stock_traces_per_call": stock_tr / w.stock_calls,
        "stock_compiles_per_call": stock_co / w.stock_calls,
        "cache_traces": cache_traces,
        "cache_compiles": cache_compiles,
        "cache_calls": n, "falls_back": falls_back,
    })
  return rows


def machine() -> str:
  dev = jax.devices()[0]
  return (f"{platform.node() or 'unknown host'}: {platform.processor() or platform.machine()}, "
          f"{jax.device_count()}x {dev.platform.upper()} ({dev.device_kind}), "
          f"python {platform.python_version()}, jax {jax.__version__}, "
          f"{front()}")


def front() -> str:
  """Which fast front the rows measure: the C entrance is an optional
  extension, and a source tree imported from its own root (``python -m``
  there) has none built, whatever the installed copy has."""
  if entrance.entrance_built():
    return "fast front with its C entrance"
  return ("fast front in pure Python (no C entrance here: run "
          "`jax-closure-cache bench`, or from outside the source tree)")


def _verdict(row: dict) -> str:
  stock = (", the cache sends every call to stock" if row.get("falls_back")
           else "")
  if row["target"] is None:
    return f"(no target{stock})"
  return f"(≤ {row['target']}: {'met' if row['met'] else 'MISSED'}{stock})"


def format_table(rows: list[dict]) -> str:
  head = ("| workload | stock µs | cache µs | baseline µs | stock/cache | "
          "cache/baseline (target) | stock traces+compiles per call | "
          "cache traces+compiles in timed calls |")
  lines = [head, "|" + "---|" * 8]
  for r in rows:
    base = r.get("baseline", "hoisted")
    lines.append(
        f"| {r['workload']} | {r['stock_us']:.1f} | {r['cache_us']:.1f} | "
        f"{r['hoisted_us']:.1f} ({base}) | {r['stock_over_cache']:.2f}x | "
        f"{r['cache_over_hoisted']:.2f} {_verdict(r)} | "
        f"{r['stock_traces_per_call']:.0f} + {r['stock_compiles_per_call']:.0f} | "
        f"{r['cache_traces']} + {r['cache_compiles']} of {r['cache_calls']} |")
  return "\n".join(lines)
