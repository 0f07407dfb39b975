"""``bench --only ecosystem``: real libraries' everyday fresh-closure idioms
(optax, equinox, flax, dm-haiku; ``pip install 'jax-closure-cache[ecosystem]'``),
each a training sequence whose step function is re-made every step, timed
per call three ways in one process: stock ``jax.jit``; stock with JAX's
persistent compilation cache (same run, its own folder, filled by one
sequence first); and this cache (``enable()``, both tiers).

Each row gives the median per-call time of calls 3-6 of a sequence, the
best of ``rounds`` alternating rounds, each cache run starting from an
empty cache (calls 1 and 2 are the cache's warm-up: a structure's first
meeting is stock's own compile, its second compiles the shared
executable); the ratio stock / cache (target: at least 5x); which tier
answered (from ``stats()``); the compiles JAX counted in calls 3-6; and
the largest difference from stock's results. A library that is not installed is skipped with a
message saying so.

Invariants: every way runs the same sequence from the same initial state on
fresh function objects; the tests in ``tests/ecosystem/`` check the same
idioms step by step against stock in verify mode.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_closure_cache as jcc
from jax_closure_cache.tools.bench_tier_a import max_diff, persistent_cache

CALLS = 6        # calls 3..CALLS are timed
INSTALL = "pip install 'jax-closure-cache[ecosystem]'"


def _batches(seed, d_in, d_out):
  rng = np.random.default_rng(seed)
  return [(jnp.asarray(rng.standard_normal((8, d_in)), jnp.float32),
           jnp.asarray(rng.standard_normal((8, d_out)), jnp.float32))
          for _ in range(4)]


def _mlp(params, x):
  for w, b in params[:-1]:
    x = jnp.tanh(x @ w + b)
  w, b = params[-1]
  return x @ w + b


# -- optax --------------------------------------------------------------------

def _optax(optimizer_for_step):
  import optax
  rng = np.random.default_rng(0)
  params0 = [(jnp.asarray(rng.standard_normal((m, n)) * 0.3, jnp.float32),
              jnp.zeros(n, jnp.float32)) for m, n in ((8, 16), (16, 4))]
  batches = _batches(0, 8, 4)

  def make_sequence():
    state = [params0, optimizer_for_step(optax, 0).init(params0)]

    def step(i):
      x, y = batches[i % 4]
      opt = optimizer_for_step(optax, i)

      def loss(p):
        return jnp.mean((_mlp(p, x) - y) ** 2)

      def update(params, opt_state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
      params, opt_state, value = jax.jit(update)(*state)
      state[:] = [params, opt_state]
      return params, opt_state, value
    return step
  return make_sequence


def optax_adam_schedule():
  import optax
  opt = optax.adam(optax.exponential_decay(1e-2, 1, 0.9))
  return _optax(lambda optax, i: opt)


def optax_adam_float_lr():
  return _optax(lambda optax, i: optax.adam(1e-2 / (1 + i)))


def optax_sgd():
  import optax
  opt = optax.sgd(0.05)
  return _optax(lambda optax, i: opt)


# -- equinox ------------------------------------------------------------------

def _equinox(value_and_grad_only):
  import equinox as eqx
  model0 = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0))
  batches = _batches(1, 4, 2)

  def make_sequence():
    model = [model0]

    def step(i):
      x, y = batches[i % 4]

      def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

      if value_and_grad_only:
        value, grads = eqx.filter_jit(eqx.filter_value_and_grad(loss))(
            model[0])
        return value, grads

      @eqx.filter_jit
      def train_step(m):
        value, grads = eqx.filter_value_and_grad(loss)(m)
        return value, eqx.apply_updates(
            m, jax.tree_util.tree_map(lambda g: -0.1 * g, grads))
      value, model[0] = train_step(model[0])
      return value, eqx.filter(model[0], eqx.is_array)
    return step
  return make_sequence


def equinox_filter_jit_step():
  return _equinox(False)


def equinox_filter_value_and_grad():
  return _equinox(True)


# -- flax ---------------------------------------------------------------------

def flax_nnx_jit_step():
  import optax
  from flax import nnx
  batches = _batches(2, 4, 2)

  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.l1 = nnx.Linear(4, 16, rngs=rngs)
      self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
      return self.l2(nnx.relu(self.l1(x)))

  def make_sequence():
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    def step(i):
      x, y = batches[i % 4]

      @nnx.jit
      def train_step(model, optimizer):
        def loss_fn(model):
          return jnp.mean((model(x) - y) ** 2)
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss
      loss = train_step(model, optimizer)
      return loss, jax.tree_util.tree_leaves(nnx.state(model))
    return step
  return make_sequence


def _linen(fresh_closure):
  import flax.linen as nn
  import optax
  from flax.training import train_state
  batches = _batches(2, 4, 2)

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(nn.relu(nn.Dense(16)(x)))

  model = MLP()
  params0 = model.init(jax.random.key(0), batches[0][0])["params"]

  def train_step(st, x, y):
    def loss_fn(params):
      return jnp.mean((st.apply_fn({"params": params}, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(st.params)
    return st.apply_gradients(grads=grads), loss
  jitted_once = jax.jit(train_step)

  def make_sequence():
    state = [train_state.TrainState.create(
        apply_fn=model.apply, params=params0, tx=optax.adam(1e-2))]

    def step(i):
      x, y = batches[i % 4]
      if fresh_closure:
        st = state[0].replace(apply_fn=functools.partial(model.apply))
        st, loss = jax.jit(lambda st: train_step(st, x, y))(st)
      else:
        st = state[0].replace(apply_fn=lambda v, inp: model.apply(v, inp))
        st, loss = jitted_once(st, x, y)
      state[0] = st
      return loss, st.params, st.opt_state
    return step
  return make_sequence


def flax_linen_fresh_closure():
  return _linen(True)


def flax_linen_jitted_once():
  return _linen(False)


# -- dm-haiku -----------------------------------------------------------------

def _haiku(transform_each_call):
  import haiku as hk
  batches = _batches(3, 4, 2)
  forward = hk.transform(lambda x: hk.nets.MLP([16, 2])(x))
  params0 = forward.init(jax.random.key(0), batches[0][0])

  def make_sequence():
    params = [params0]

    def step(i):
      x, y = batches[i % 4]
      f = (hk.transform(lambda inp: hk.nets.MLP([16, 2])(inp))
           if transform_each_call else forward)

      def loss(p):
        return jnp.mean((f.apply(p, None, x) - y) ** 2)

      def sgd_step(p):
        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p,
                                      grads), value
      params[0], value = jax.jit(sgd_step)(params[0])
      return params[0], value
    return step
  return make_sequence


def haiku_transform_once():
  return _haiku(False)


def haiku_transform_each_call():
  return _haiku(True)


# (library, idiom, factory, modules it needs)
WORKLOADS = [
    ("optax", "adam + exponential_decay, fresh jit step", optax_adam_schedule,
     ("optax",)),
    ("optax", "adam re-made with a Python-float lr", optax_adam_float_lr,
     ("optax",)),
    ("optax", "sgd, fresh loss over the batch", optax_sgd, ("optax",)),
    ("equinox", "filter_jit step re-made (filter_value_and_grad)",
     equinox_filter_jit_step, ("equinox",)),
    ("equinox", "filter_jit(filter_value_and_grad(loss)) re-made",
     equinox_filter_value_and_grad, ("equinox",)),
    ("flax", "nnx.jit train step re-made (Module + Optimizer)",
     flax_nnx_jit_step, ("flax", "optax")),
    ("flax", "linen TrainState, fresh apply_fn, fresh jit closure",
     flax_linen_fresh_closure, ("flax", "optax")),
    ("flax", "linen TrainState, fresh apply_fn, one jitted step",
     flax_linen_jitted_once, ("flax", "optax")),
    ("dm-haiku", "transform once, apply in a fresh jit closure",
     haiku_transform_once, ("haiku",)),
    ("dm-haiku", "transform every call, fresh jit closure",
     haiku_transform_each_call, ("haiku",)),
]


def missing(modules) -> list[str]:
  """The modules of ``modules`` that cannot be imported."""
  import importlib
  absent = []
  for m in modules:
    try:
      importlib.import_module(m)
    except ImportError:
      absent.append(m)
  return absent


def _time(make_sequence, calls: int = CALLS):
  """Per-call seconds of calls 3..calls, their outputs, and the compiles
  JAX counted in them."""
  from jax_closure_cache import _compat
  step = make_sequence()
  times, outs, compiles = [], [], 0
  for i in range(calls):
    with _compat.count_compiles() as count:
      t0 = time.perf_counter()
      out = jax.block_until_ready(step(i))
      dt = time.perf_counter() - t0
    if i >= 2:
      times.append(dt)
      outs.append(jax.tree_util.tree_map(np.asarray, out))
      compiles += count()
  return statistics.median(times) * 1e6, outs, compiles


def _tier(before: dict, after: dict) -> str:
  b_hits = after["hits"] - before["hits"]
  retraces = after["retraces"] - before["retraces"]
  if b_hits and not retraces:
    return "B (no trace)"
  if b_hits:
    return "B key, retraced; A"
  reasons = ", ".join(sorted(after["fallback_reasons"]))
  return f"A (B: {reasons})" if reasons else "A"


def run(calls: int = CALLS, match=(), rounds: int = 1
        ) -> tuple[list[dict], list[str]]:
  """The rows, and a line for each library skipped as not installed.
  ``match``: only idioms whose "library idiom" contains one of these;
  ``rounds``: each way is timed that many times, the best median kept."""
  rows, skipped = [], []
  told = set()
  for library, idiom, factory, modules in WORKLOADS:
    if match and not any(m in f"{library} {idiom}" for m in match):
      continue
    absent = missing(modules)
    if absent:
      if library not in told:
        told.add(library)
        skipped.append(f"{library}: {', '.join(absent)} not installed "
                       f"({INSTALL})")
      continue
    print(f"bench: {library}: {idiom} ...", file=sys.stderr, flush=True)
    make_sequence = factory()
    stock_us = persistent_us = cache_us = float("inf")
    for _ in range(max(1, rounds)):
      jcc.disable()
      jcc.clear()
      us, stock_outs, stock_compiles = _time(make_sequence, calls)
      stock_us = min(stock_us, us)
      with persistent_cache():
        _time(make_sequence, calls)   # fills the persistent cache
        us, _, _ = _time(make_sequence, calls)
      persistent_us = min(persistent_us, us)
      jcc.clear()   # each round's cache run starts empty
      jcc.enable()
      before = jcc.stats()
      us, cache_outs, cache_compiles = _time(make_sequence, calls)
      cache_us = min(cache_us, us)
      tier = _tier(before, jcc.stats())
      jcc.disable()
      jcc.clear()
    diff = max((max_diff(a, b) for a, b in zip(cache_outs, stock_outs)),
               default=0.0)
    rows.append({
        "library": library, "idiom": idiom, "stock_us": stock_us,
        "persistent_us": persistent_us, "cache_us": cache_us,
        "stock_over_cache": stock_us / cache_us,
        "persistent_over_cache": persistent_us / cache_us,
        "stock_compiles": stock_compiles, "cache_compiles": cache_compiles,
        "tier": tier, "max_abs_diff": diff,
        "met": stock_us / cache_us >= 5})
  return rows, skipped


def format_table(rows: list[dict]) -> str:
  lines = ["| library | idiom | stock µs | persistent cache µs | cache µs "
           "| stock / cache | persistent / cache | compiles, calls 3-6 "
           "(stock / cache) | tier | max abs diff | ≥ 5x |",
           "|" + "---|" * 11]
  for r in rows:
    lines.append(
        f"| {r['library']} | {r['idiom']} | {r['stock_us']:.0f} | "
        f"{r['persistent_us']:.0f} | {r['cache_us']:.0f} | "
        f"{r['stock_over_cache']:.1f}x | {r['persistent_over_cache']:.1f}x | "
        f"{r['stock_compiles']} / {r['cache_compiles']} | {r['tier']} | "
        f"{r['max_abs_diff']:.1e} | {'met' if r['met'] else 'MISSED'} |")
  return "\n".join(lines)
