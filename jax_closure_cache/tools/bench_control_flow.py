"""Benchmark workloads for eager control flow with fresh closures.

Each workload is measured as stock ``jax.lax`` (fresh closures every call),
stock with JAX's persistent compilation cache (in a subprocess, so its
configuration never leaks into the other measurements), this cache, and,
where one exists, the hand-hoisted jitted equivalent. Times are medians of
calls 2..N (the cache: calls 3..N, after the first body object, which is stock's own, and the second, which compiles the shared entry); counts come from JAX's own counters.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_closure_cache import _compat, cache, lax as cached_lax

STOCK_JIT = jax.jit


class Workload(NamedTuple):
  name: str
  # (lax module, call index) -> one call's result; the index picks the
  # inputs (a checkpoint, a dataset), so calls differ in values, not shapes
  run: Callable
  hoisted: Callable | None   # call index -> result
  calls: int


# -- (a) greedy decoding of a tiny transformer-like model -------------------

VOCAB, DIM, LAYERS, MAX_LEN = 64, 32, 2, 16


def init_params(seed: int = 0):
  k = jax.random.key(seed)
  def normal(i, shape):
    return jax.random.normal(jax.random.fold_in(k, i), shape) / np.sqrt(shape[0])
  layers = [{"qkv": normal(10 * i + 1, (DIM, 3 * DIM)),
             "out": normal(10 * i + 2, (DIM, DIM)),
             "up": normal(10 * i + 3, (DIM, 4 * DIM)),
             "down": normal(10 * i + 4, (4 * DIM, DIM))} for i in range(LAYERS)]
  return {"embed": normal(0, (VOCAB, DIM)), "pos": normal(99, (MAX_LEN, DIM)),
          "layers": layers}


def logits_at(params, tokens, i):
  """Next-token logits at position ``i - 1`` of a causal model."""
  h = params["embed"][tokens] + params["pos"]
  mask = jnp.tril(jnp.ones((MAX_LEN, MAX_LEN), bool))
  for layer in params["layers"]:
    q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
    att = jnp.where(mask, q @ k.T / np.sqrt(DIM), -1e9)
    h = h + jax.nn.softmax(att) @ v @ layer["out"]
    h = h + jax.nn.gelu(h @ layer["up"]) @ layer["down"]
  return h[i - 1] @ params["embed"].T


def generate(lax, params, prompt, prompt_len):
  """Greedy decoding as libraries write it: body and cond closures are built
  afresh on every call, closing over the model's params."""
  def cond_fn(state):
    return state[0] < MAX_LEN

  def body_fn(state):
    i, tokens = state
    next_token = jnp.argmax(logits_at(params, tokens, i)).astype(tokens.dtype)
    return i + 1, tokens.at[i].set(next_token)

  return lax.while_loop(cond_fn, body_fn, (prompt_len, prompt))[1]


@STOCK_JIT
def generate_hoisted(params, prompt, prompt_len):
  return generate(jax.lax, params, prompt, prompt_len)


def _decode() -> Workload:
  params = [init_params(s) for s in range(3)]   # several checkpoints, one shape
  prompt = jnp.zeros(MAX_LEN, jnp.int32).at[:3].set(jnp.array([1, 2, 3]))
  n = jnp.int32(3)
  return Workload(
      "greedy decode, tiny transformer (while_loop)",
      lambda lax, i: generate(lax, params[i % 3], prompt, n),
      lambda i: generate_hoisted(params[i % 3], prompt, n), calls=200)


# -- (b) jax.scipy.optimize.minimize over several datasets ------------------

def _loss(x, data):
  return jnp.sum((x - data) ** 2) + 0.1 * jnp.sum(x ** 4)


def _minimize() -> Workload:
  from jax.scipy.optimize import minimize
  datasets = [jnp.linspace(0.0, 1.0, 8) * (i + 1) for i in range(4)]
  x0 = jnp.zeros(8)

  def run(lax, i):
    data = datasets[i % 4]
    # minimize calls while_loop through jax._src.lax: patch it for the cache
    patch = lax is cached_lax
    if patch:
      from jax_closure_cache import patching
      with patching.enabled():
        return minimize(lambda x: _loss(x, data), x0, method="BFGS").x
    return minimize(lambda x: _loss(x, data), x0, method="BFGS").x
  return Workload("scipy.optimize.minimize BFGS, fresh objective", run, None,
                  calls=40)


# -- (c) eager scan and fori_loop with fresh closures ------------------------

def _scan() -> Workload:
  w = jnp.eye(64) * 0.5
  xs, init = jnp.ones((32, 64)), jnp.zeros(64)

  def run(lax, i):
    return lax.scan(lambda c, x: (jnp.tanh(c @ w + x), c.sum()), init, xs)

  hoisted = STOCK_JIT(lambda w, init, xs: jax.lax.scan(
      lambda c, x: (jnp.tanh(c @ w + x), c.sum()), init, xs))
  return Workload("eager scan, fresh body over 64x64 w", run,
                  lambda i: hoisted(w, init, xs), calls=400)


def _fori() -> Workload:
  w, init = jnp.eye(64) * 0.5, jnp.ones(64)

  def run(lax, i):
    return lax.fori_loop(0, 32, lambda i, v: jnp.tanh(v @ w) + i, init)

  hoisted = STOCK_JIT(lambda w, init: jax.lax.fori_loop(
      0, 32, lambda i, v: jnp.tanh(v @ w) + i, init))
  return Workload("eager fori_loop, fresh body over 64x64 w", run,
                  lambda i: hoisted(w, init), calls=400)


# -- (d) odeint and cg with a fresh function every call ----------------------

def _module_copy(name: str, tag: str):
  """A private copy of module ``name``: jitted functions it makes at import
  are made by whichever ``jax.jit`` is current, so the stock and the cached
  runs each get their own (neither's wrapper serves the other)."""
  import importlib.util
  spec = importlib.util.find_spec(name)
  copy = importlib.util.spec_from_file_location(f"{name}__{tag}", spec.origin)
  module = importlib.util.module_from_spec(copy)
  copy.loader.exec_module(module)
  return module


def _odeint() -> Workload:
  from jax_closure_cache import patching
  stock_ode = _module_copy("jax.experimental.ode", "stock")
  with patching.enabled():
    cached_ode = _module_copy("jax.experimental.ode", "cached")
  ws = [jnp.eye(8) * -(0.5 + i) for i in range(4)]
  y0, ts = jnp.ones(8), jnp.linspace(0.0, 1.0, 8)

  def run(lax, i):
    w = ws[i % 4]
    field = lambda y, t: jnp.tanh(w @ y)   # a fresh vector field every call
    if lax is cached_lax:
      with patching.enabled():
        return cached_ode.odeint(field, y0, ts)
    return stock_ode.odeint(field, y0, ts)

  def field_with(y, t, w):
    return jnp.tanh(w @ y)
  return Workload("odeint, fresh vector field over 8x8 w (eager)", run,
                  lambda i: stock_ode.odeint(field_with, y0, ts, ws[i % 4]),
                  calls=40)


def _cg() -> Workload:
  import jax.scipy.sparse.linalg as spl   # (``spl.cg`` looked up per call)
  from jax_closure_cache import patching
  mats = [jnp.eye(16) * (2.0 + i) + 0.1 for i in range(4)]
  b = jnp.linspace(1.0, 2.0, 16)

  def run(lax, i):
    a = mats[i % 4]
    matvec = lambda v: a @ v   # a fresh matvec every call
    if lax is cached_lax:
      with patching.enabled():   # the cache's cg and bicgstab are patched
        return spl.cg(matvec, b)[0]
    return spl.cg(matvec, b)[0]

  hoisted = STOCK_JIT(lambda a, b: spl.cg(lambda v: a @ v, b)[0])
  return Workload("scipy.sparse.linalg.cg, fresh matvec over 16x16 (eager)",
                  run, lambda i: hoisted(mats[i % 4], b), calls=100)


# -- (e) the seed's real client: transformers' Flax GPT-2 generate ----------

def _gpt2():
  try:
    import transformers   # noqa: F401  (optional extra: pip install .[clients])
  except ImportError:
    return None
  from transformers import FlaxGPT2LMHeadModel, GPT2Config
  config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                      n_positions=64)
  model = FlaxGPT2LMHeadModel(config, seed=0)
  ids = jnp.array([[1, 2, 3, 4]], dtype=jnp.int32)

  def run(lax, i):
    if lax is cached_lax:
      from jax_closure_cache import patching
      with patching.enabled():
        return model.generate(ids, max_length=32, do_sample=False).sequences
    return model.generate(ids, max_length=32, do_sample=False).sequences
  return Workload("transformers FlaxGPT2 generate (2 layers)", run, None,
                  calls=12)


WORKLOADS = {"decode": _decode, "minimize": _minimize, "scan": _scan,
             "fori": _fori, "odeint": _odeint, "cg": _cg, "gpt2": _gpt2}

#: cache-over-hoisted or speed-up targets, from the control-flow issue
TARGETS = {"decode": "cache/hoisted ≤ 1.3",
           "minimize": "stock/cache ≥ 100, persistent/cache ≥ 20",
           "odeint": "stock/cache ≥ 20", "cg": "stock/cache ≥ 20",
           "gpt2": "stock/cache ≥ 8, persistent/cache ≥ 2, 0 compiles"}


def _median_after_first(call: Callable, n: int, first: int = 1):
  """Median per-call µs of calls ``first+1``..n of ``call(i)``, with trace and
  compile counts over them. The cache path skips two calls: the first body
  object of a code is stock's own, the second compiles the shared entry."""
  for i in range(first):
    jax.block_until_ready(call(i))
  times = []
  with _compat.count_traces() as traces, _compat.count_compiles() as compiles:
    for i in range(first, n):
      t0 = time.perf_counter()
      jax.block_until_ready(call(i))
      times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e6, traces(), compiles()


def persistent_worker(name: str, calls: int) -> None:
  """Subprocess entry: stock with the persistent compilation cache."""
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  w = WORKLOADS[name]()
  us, traces, compiles = _median_after_first(lambda i: w.run(jax.lax, i), calls)
  print(json.dumps({"us": us, "traces": traces, "compiles": compiles}))


def _persistent(name: str, calls: int) -> float | None:
  code = ("from jax_closure_cache.tools.bench_control_flow import persistent_worker;"
          f"persistent_worker({name!r}, {calls})")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=dict(os.environ, JAX_CLOSURE_CACHE="0"))
  if out.returncode != 0:
    return None
  return json.loads(out.stdout.strip().splitlines()[-1])["us"]


def _max_abs_diff(a, b) -> float:
  diffs = [float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
           for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
  return max(diffs, default=0.0)


def run(names=None) -> tuple[list[dict], list[str]]:
  rows, skipped = [], []
  for name, make in WORKLOADS.items():
    if names and name not in names:
      continue
    w = make()
    print(f"bench: {name} ({max(3, w.calls // 20) if w else 0} stock calls, "
          "each a full trace and compile) ...", file=sys.stderr, flush=True)
    if w is None:
      skipped.append(f"{name}: transformers/flax not installed "
                     "(pip install '.[clients]')")
      continue
    cache.clear()
    n_stock = max(3, w.calls // 20)
    stock_us, s_tr, s_co = _median_after_first(
        lambda i: w.run(jax.lax, i), n_stock)
    cache_us, c_tr, c_co = _median_after_first(
        lambda i: w.run(cached_lax, i), w.calls, first=2)
    hoisted_us = (None if w.hoisted is None else
                  _median_after_first(w.hoisted, w.calls)[0])
    # Results on the same inputs, every input the timed calls used.
    diff = max(_max_abs_diff(w.run(cached_lax, i), w.run(jax.lax, i))
               for i in range(4))
    persistent_us = _persistent(name, n_stock)
    rows.append({
        "workload": w.name, "key": name,
        "stock_us": stock_us, "persistent_us": persistent_us,
        "cache_us": cache_us, "hoisted_us": hoisted_us,
        "stock_over_cache": stock_us / cache_us,
        "persistent_over_cache": (None if persistent_us is None
                                  else persistent_us / cache_us),
        "cache_over_hoisted": (None if hoisted_us is None
                               else cache_us / hoisted_us),
        "stock_traces_compiles_per_call": ((s_tr / (n_stock - 1)),
                                           (s_co / (n_stock - 1))),
        "cache_traces": c_tr, "cache_compiles": c_co,
        "cache_calls": w.calls - 1,
        "max_abs_diff_vs_stock": diff,
        "target": TARGETS.get(name, "—"),
    })
  return rows, skipped


def _fmt(v, spec=".1f", suffix=""):
  return "—" if v is None else f"{v:{spec}}{suffix}"


def format_table(rows: list[dict]) -> str:
  lines = ["| workload | stock µs | persistent-cache µs | cache µs | hoisted µs "
           "| stock/cache | persistent/cache | cache/hoisted | stock traces+"
           "compiles per call | cache traces+compiles in timed calls | max "
           "abs diff vs stock | target |", "|" + "---|" * 12]
  for r in rows:
    st, sc = r["stock_traces_compiles_per_call"]
    lines.append(
        f"| {r['workload']} | {_fmt(r['stock_us'])} | {_fmt(r['persistent_us'])}"
        f" | {_fmt(r['cache_us'])} | {_fmt(r['hoisted_us'])} | "
        f"{_fmt(r['stock_over_cache'], '.0f', 'x')} | "
        f"{_fmt(r['persistent_over_cache'], '.0f', 'x')} | "
        f"{_fmt(r['cache_over_hoisted'], '.2f')} | {st:.0f} + {sc:.0f} | "
        f"{r['cache_traces']} + {r['cache_compiles']} of {r['cache_calls']} | "
        f"{r['max_abs_diff_vs_stock']:.1e} | {r['target']} |")
  return "\n".join(lines)
