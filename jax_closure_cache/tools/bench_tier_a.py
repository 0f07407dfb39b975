"""``bench --only tier-a``: library-shaped workloads in pure JAX, each
building a fresh function per call, timed per call four ways in one
process: stock ``jax.jit``; stock with JAX's persistent compilation cache
(same run, its own folder); tier A alone (``enable(closure_key=False)``:
stock's trace, the shared executable); and both tiers (``enable()``).

Stock's per-call time is split with JAX's own duration events (tracing,
lowering to MLIR, XLA compile), so each row says how much of stock's cost
tier A can remove, and its target: tier A per call at most 1.2x stock's
tracing time alone, and, where lowering plus compiling is over 80% of
stock's time, at least 5x faster than stock and 2x faster than the
persistent cache.

Invariants: every way runs the same calls on fresh function objects after
two warm-up calls of its own (a structure's first meeting is stock's own
lowering, its second compiles the shared one); results are compared with
stock's, the largest difference reported.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import jax_closure_cache as jcc

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"


class AdamState(NamedTuple):
  """An optimizer's state, a NamedTuple class read as a global."""
  mu: dict
  nu: dict
  count: jax.Array


def _mlp(params, x):
  for w, b in params[:-1]:
    x = jax.nn.gelu(x @ w + b)
  w, b = params[-1]
  return x @ w + b


def solver_loop() -> Callable[[int], object]:
  """A fixed-point solver handed a fresh objective per problem."""
  rng = np.random.default_rng(0)
  mats = [jnp.asarray(np.eye(8) * 2 + 0.1 * rng.standard_normal((8, 8)),
                      jnp.float32) for _ in range(4)]
  b, x0 = jnp.ones(8), jnp.zeros(8)   # the user's data, made once

  def call(i):
    # (a float inside the loop's body is keyed by value: a tolerance that
    # changed every call would make a new structure every call)
    a, tol = mats[i % 4], 1e-5

    def residual(x):
      return a @ x - b

    def body(c):
      x, k = c
      return x - 0.3 * residual(x), k + 1

    def cond(c):
      x, k = c
      return (jnp.linalg.norm(residual(x)) > tol) & (k < 200)

    def solve(x0):
      return jax.lax.while_loop(cond, body, (x0, 0))[0]
    return jax.jit(solve)(x0)
  return call


def mcmc_kernel() -> Callable[[int], object]:
  """A random-walk Metropolis kernel built per data set."""
  rng = np.random.default_rng(1)
  data = [jnp.asarray(rng.standard_normal(64), jnp.float32) for _ in range(4)]
  key0 = jax.random.key(0)

  def call(i):
    ys, step_size = data[i % 4], 0.5

    def logdensity(theta):
      return -0.5 * jnp.sum((ys - theta) ** 2) - 0.5 * theta ** 2

    def step(_, carry):
      key, theta = carry
      key, k1, k2 = jax.random.split(key, 3)
      prop = theta + step_size * jax.random.normal(k1)
      accept = jnp.log(jax.random.uniform(k2)) < (logdensity(prop)
                                                   - logdensity(theta))
      return key, jnp.where(accept, prop, theta)

    def run(key):
      return jax.lax.fori_loop(0, 100, step, (key, 0.0))[1]
    return jax.jit(run)(key0)
  return call


def training_step() -> Callable[[int], object]:
  """``jit(value_and_grad(loss))`` with the loss closing over the batch, and
  an Adam update over a NamedTuple state, re-made every step."""
  rng = np.random.default_rng(2)
  sizes = [16, 32, 32, 4]
  params = [(jnp.asarray(rng.standard_normal((m, n)) * 0.1, jnp.float32),
             jnp.zeros(n)) for m, n in zip(sizes[:-1], sizes[1:])]
  batches = [(jnp.asarray(rng.standard_normal((8, 16)), jnp.float32),
              jnp.asarray(rng.standard_normal((8, 4)), jnp.float32))
             for _ in range(4)]
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  state = AdamState(zeros, zeros, jnp.zeros((), jnp.int32))

  def call(i):
    x, y = batches[i % 4]
    lr = 1e-3 / (1 + i)   # a schedule: a new Python float every step

    def loss(p):
      return jnp.mean((_mlp(p, x) - y) ** 2)

    def update(p, s):
      value, g = jax.value_and_grad(loss)(p)
      mu = jax.tree_util.tree_map(lambda m, d: 0.9 * m + 0.1 * d, s.mu, g)
      nu = jax.tree_util.tree_map(lambda v, d: 0.99 * v + 0.01 * d * d,
                                  s.nu, g)
      p = jax.tree_util.tree_map(
          lambda q, m, v: q - lr * m / (jnp.sqrt(v) + 1e-8), p, mu, nu)
      return value, p, AdamState(mu, nu, s.count + 1)
    return jax.jit(update)(params, state)
  return call


def scalar_hyperparameters() -> Callable[[int], object]:
  """A momentum step re-made every step, closing over a batch and over jax
  scalars (a learning rate, a momentum) that XLA folds with the gradient
  in stock's module (``(1 - beta) * g``): tier A bakes the scalars, keyed
  by their values, and passes the batch."""
  rng = np.random.default_rng(4)
  w = jnp.asarray(rng.standard_normal((32, 8)) * 0.1, jnp.float32)
  batches = [(jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
              jnp.asarray(rng.standard_normal((16, 8)), jnp.float32))
             for _ in range(4)]
  lr, beta = jnp.float32(0.05), jnp.float32(0.9)
  m0 = jnp.zeros_like(w)

  def call(i):
    x, y = batches[i % 4]

    def loss(w):
      return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    def update(w, m):
      g = jax.grad(loss)(w)
      m = beta * m + (1 - beta) * g
      return w - lr * m, m
    return jax.jit(update)(w, m0)
  return call


class Config:
  """A module's static configuration (an activation, a name) beside its
  arrays, as a filtered jit splits them."""

  def __init__(self, act, name):
    self.act, self.name = act, name


def filtered_jit() -> Callable[[int], object]:
  rng = np.random.default_rng(3)
  ws = [jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)
        for _ in range(4)]
  cfg = Config(jax.nn.silu, "block")
  x = jnp.ones((4, 16))

  def call(i):
    module = {"w": ws[i % 4], "cfg": cfg}

    def forward(x):
      h = module["cfg"].act(x @ module["w"])
      return jnp.sum(jax.nn.softmax(h, axis=-1) * h, axis=-1)
    return jax.jit(forward)(x)
  return call


WORKLOADS = {"solver loop (while_loop, fresh objective)": solver_loop,
             "MCMC kernel per data set (fori_loop)": mcmc_kernel,
             "training step: jit(value_and_grad) + NamedTuple Adam":
                 training_step,
             "momentum step over jax-scalar hyperparameters":
                 scalar_hyperparameters,
             "filtered jit (arrays beside a static config)": filtered_jit}


class _Durations:
  """JAX's duration events, summed per event while listening."""

  def __init__(self):
    self.total = collections.Counter()
    self.on = False
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event, seconds, **_):
    if self.on and event in (TRACE, LOWER, COMPILE):
      self.total[event] += seconds

  @contextlib.contextmanager
  def listening(self):
    self.total.clear()
    self.on = True
    try:
      yield
    finally:
      self.on = False


#: warm-up calls before the timed ones: a structure's first meeting, its
#: shared compile, and a first hit (whose own first-use costs, JAX's and
#: Python's, are no per-call cost)
WARM_UP = 3


def _time(call: Callable[[int], object], calls: int, start: int,
          listening=contextlib.nullcontext):
  """Median µs of calls ``start + WARM_UP ...`` after the warm-up calls,
  each with a fresh function, from a collected heap (each mode's timing
  starts alike, whatever the one before left); ``listening`` wraps the
  timed calls alone."""
  for i in range(WARM_UP):
    jax.block_until_ready(call(start + i))
  gc.collect()
  times, outs = [], []
  with listening():
    for i in range(calls):
      t0 = time.perf_counter()
      out = jax.block_until_ready(call(start + WARM_UP + i))
      times.append(time.perf_counter() - t0)
      outs.append(out)
  return statistics.median(times) * 1e6, outs


@contextlib.contextmanager
def persistent_cache():
  keys = ("jax_compilation_cache_dir",
          "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  saved = {k: getattr(jax.config, k) for k in keys}
  with tempfile.TemporaryDirectory() as folder:
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
      yield
    finally:
      for k, v in saved.items():
        jax.config.update(k, v)
      from jax_closure_cache import _compat
      _compat.reset_persistent_cache()


def max_diff(a, b) -> float:
  return max((float(np.max(np.abs(np.asarray(x, np.float64)
                                  - np.asarray(y, np.float64))))
              for x, y in zip(jax.tree_util.tree_leaves(a),
                              jax.tree_util.tree_leaves(b))), default=0.0)


def run(calls: int = 9) -> list[dict]:
  durations = _Durations()
  rows = []
  for name, make in WORKLOADS.items():
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    call = make()
    jcc.disable()
    jcc.clear()
    stock_us, stock_outs = _time(call, calls, 0, durations.listening)
    d = durations.total
    trace_us = d[TRACE] / calls * 1e6
    lower_compile = (d[LOWER] + d[COMPILE]) / calls * 1e6
    with persistent_cache():
      _time(call, 1, 100)   # fills the persistent cache
      persistent_us, _ = _time(call, calls, 0)
    jcc.clear()
    jcc.enable(closure_key=False)
    tier_a_us, tier_a_outs = _time(call, calls, 0)
    jcc.disable()
    jcc.clear()
    jcc.enable()
    both_us, both_outs = _time(call, calls, 0)
    jcc.disable()
    jcc.clear()
    diff = max(max_diff(a, b) for outs in (tier_a_outs, both_outs)
               for a, b in zip(outs, stock_outs))
    share = lower_compile / stock_us
    rows.append({
        "workload": name, "stock_us": stock_us, "trace_us": trace_us,
        "lower_compile_share": share, "persistent_us": persistent_us,
        "tier_a_us": tier_a_us, "both_us": both_us, "max_abs_diff": diff,
        "tier_a_over_trace": tier_a_us / trace_us if trace_us else None,
        "stock_over_tier_a": stock_us / tier_a_us,
        "persistent_over_tier_a": persistent_us / tier_a_us,
        "met": _met(tier_a_us, trace_us, stock_us, persistent_us, share)})
  return rows


def _met(tier_a, trace, stock, persistent, share) -> bool:
  ok = tier_a <= 1.2 * trace
  if share > 0.8:
    ok = ok and stock / tier_a >= 5 and persistent / tier_a >= 2
  return ok


def format_table(rows: list[dict]) -> str:
  lines = ["| workload | stock µs | stock's trace µs | lowering+compile share "
           "| persistent cache µs | tier A µs | both tiers µs | tier A / trace "
           "| stock / tier A | persistent / tier A | max abs diff | targets |",
           "|" + "---|" * 12]
  for r in rows:
    lines.append(
        f"| {r['workload']} | {r['stock_us']:.0f} | {r['trace_us']:.0f} | "
        f"{r['lower_compile_share']:.0%} | {r['persistent_us']:.0f} | "
        f"{r['tier_a_us']:.0f} | {r['both_us']:.0f} | "
        f"{r['tier_a_over_trace']:.2f} | {r['stock_over_tier_a']:.1f}x | "
        f"{r['persistent_over_tier_a']:.1f}x | {r['max_abs_diff']:.1e} | "
        f"{'met' if r['met'] else 'MISSED'} |")
  return "\n".join(lines)
