"""``bench --only hit-path``: what a hit costs against the hoisted call.

One row per pattern that re-creates a function every call (a nested
``def``, ``jax.grad`` / ``jax.value_and_grad`` / ``jax.vmap`` /
``functools.partial`` of a closure, a fresh lambda as a static argument,
eager ``scan`` / ``fori_loop`` / ``cg`` with a fresh body), plus a long-
lived jitted closure. Each row is timed four ways in one process, in
interleaved blocks of calls (each round runs its calls of every way in
blocks of ``BLOCK``, the ways taking turns block by block, the order
rotating):

* ``cache``: the user's code as written, the function re-created per call,
  with the cache enabled (``jax.jit`` and ``jax.lax`` patched);
* ``hoisted``: one long-lived stock jitted function taking the closed-over
  values as arguments, the limit a hit can reach;
* ``construction``: the user's own wrappers alone (the ``def``, the
  ``jax.grad(loss)``, the ``functools.partial(f, w)``), made and not
  called, which the cache's call pays and the hoisted call does not;
* ``together``: the construction, then the hoisted call, in one loop (the
  two timed apart can sum to less than this).

The ratio is ``cache / (hoisted + construction)``, the median of the
rounds' ratios: 1.0 means a hit costs what the hoisted call costs. The
long-lived row's baseline is stock ``jax.jit`` of a twin object (no
construction).

Invariants: before timing, each row's cached calls (past the warm-up, so
hits) are compared with stock's on the same inputs (the same code with
the cache disabled, or a long-lived object's stock twin), the largest
difference reported; trace and compile counts and the paths the cache took
(``stats()``: hits through the inline matcher or generated front, hits
that analysed the key again, misses, fallbacks, tier A) are counted over
the timed cached calls.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_closure_cache import _compat, cache, patching

STOCK_JIT = jax.jit


class Row(NamedTuple):
  key: str    # what ``--match`` and the quick set name
  name: str
  # call index -> the call's result; the index picks the closed-over
  # values (a batch, a weight), so calls differ in values, not shapes
  cached: Callable[[int], object]   # the user's code, run with the cache on
  stock: Callable[[int], object]    # the same with the cache off
  hoisted: Callable[[int], object]  # the baseline
  construct: Callable[[int], object] | None   # the user's wrappers alone
  baseline: str = "hoisted"   # "stock": a long-lived object's stock twin


def _rotate(values: list) -> Callable[[int], object]:
  return lambda i: values[i % len(values)]


def _ready(out):
  return jax.block_until_ready(out)


# -- the patterns -------------------------------------------------------------

def _mse(p, x, y):
  return jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)


def _data(seed: int, n: int = 4):
  rng = np.random.default_rng(seed)
  batches = [(jnp.asarray(rng.standard_normal((8, 8)), jnp.float32),
              jnp.asarray(rng.standard_normal((8, 4)), jnp.float32))
             for _ in range(n)]
  params = {"w": jnp.asarray(rng.standard_normal((8, 4)) * 0.3, jnp.float32),
            "b": jnp.zeros(4)}
  return _rotate(batches), params


def _nested_def() -> Row:
  ws = _rotate([jnp.full((4, 4), 0.1 * (i + 1)) for i in range(4)])
  x = jnp.ones((4, 4))

  def user(i):
    w = ws(i)

    def f(x):
      return jnp.tanh(x @ w)
    return _ready(jax.jit(f)(x))

  def construct(i):
    w = ws(i)

    def f(x):
      return jnp.tanh(x @ w)
    return f

  hoisted_f = STOCK_JIT(lambda x, w: jnp.tanh(x @ w))
  return Row("nested-def", "nested def f(x): tanh(x @ w), 4x4", user, user,
             lambda i: _ready(hoisted_f(x, ws(i))), construct)


#: The module namespace of :func:`_global_def`'s function: a global it reads
#: (``W``), rebound before each call as a script's loop rebinds its data.
_GLOBAL_SOURCE = "def f(x):\n  return jnp.tanh(x @ W)\n"


def _global_def() -> Row:
  ws = _rotate([jnp.full((4, 4), 0.1 * (i + 1)) for i in range(4)])
  x = jnp.ones((4, 4))
  ns = {"jnp": jnp}
  code = compile(_GLOBAL_SOURCE, "<bench: global-def>", "exec")

  def construct(i):   # the def, re-run: a new closure-free object
    ns["W"] = ws(i)
    exec(code, ns)
    return ns["f"]

  def user(i):
    return _ready(jax.jit(construct(i))(x))

  hoisted_f = STOCK_JIT(lambda x, w: jnp.tanh(x @ w))
  return Row("global-def",
             "closure-free def f(x): tanh(x @ W), W a global array, 4x4",
             user, user, lambda i: _ready(hoisted_f(x, ws(i))), construct)


def _grad() -> Row:
  batch, p = _data(0)

  def construct(i):
    x, y = batch(i)

    def loss(p):
      return _mse(p, x, y)
    return jax.grad(loss)

  def user(i):   # the user's own construction, then the call
    return _ready(jax.jit(construct(i))(p))

  hoisted_f = STOCK_JIT(jax.grad(_mse))
  return Row("grad", "jax.jit(jax.grad(loss))(p), loss over a batch", user,
             user, lambda i: _ready(hoisted_f(p, *batch(i))), construct)


def _mse_aux(p, x, y):
  pred = jnp.tanh(x @ p["w"] + p["b"])
  return jnp.mean((pred - y) ** 2), {"pred_mean": jnp.mean(pred)}


def _value_and_grad() -> Row:
  batch, p = _data(1)

  def construct(i):
    x, y = batch(i)

    def loss(p):
      return _mse_aux(p, x, y)
    return jax.value_and_grad(loss, has_aux=True)

  def user(i):   # the user's own construction, then the call
    return _ready(jax.jit(construct(i))(p))

  hoisted_f = STOCK_JIT(jax.value_and_grad(_mse_aux, has_aux=True))
  return Row("value-and-grad",
             "jax.jit(jax.value_and_grad(loss, has_aux=True))(p)", user, user,
             lambda i: _ready(hoisted_f(p, *batch(i))), construct)


def _layer(w, x):
  return jnp.tanh(x @ w)


def _partial() -> Row:
  ws = _rotate([jnp.full((4, 4), 0.1 * (i + 1)) for i in range(4)])
  x = jnp.ones((4, 4))

  def user(i):
    return _ready(jax.jit(functools.partial(_layer, ws(i)))(x))

  hoisted_f = STOCK_JIT(_layer)
  return Row("partial", "jax.jit(functools.partial(f, w))(x), 4x4", user,
             user, lambda i: _ready(hoisted_f(ws(i), x)),
             lambda i: functools.partial(_layer, ws(i)))


def _apply(f, v):
  return f(v)


def _static_lambda() -> Row:
  ws = _rotate([jnp.eye(4) * (i + 1.0) for i in range(4)])
  x = jnp.ones((4, 4))
  stock_apply = STOCK_JIT(_apply, static_argnums=0)
  with patching.enabled():
    cached_apply = jax.jit(_apply, static_argnums=0)   # the package's jit

  def user(apply):
    def call(i):
      w = ws(i)
      return _ready(apply(lambda v: jnp.tanh(v @ w), x))
    return call

  def construct(i):
    w = ws(i)
    return lambda v: jnp.tanh(v @ w)

  hoisted_f = STOCK_JIT(lambda v, w: jnp.tanh(v @ w))
  return Row("static-lambda",
             "fresh lambda as a static argument of a long-lived jit, 4x4",
             user(cached_apply), user(stock_apply),
             lambda i: _ready(hoisted_f(x, ws(i))), construct)


def _vmap() -> Row:
  ws = _rotate([jnp.full((8, 4), 0.1 * (i + 1)) for i in range(4)])
  xs = jnp.ones((16, 8))

  def user(i):
    w = ws(i)
    return _ready(jax.jit(jax.vmap(lambda v: v @ w))(xs))

  def construct(i):
    w = ws(i)
    return jax.vmap(lambda v: v @ w)

  hoisted_f = STOCK_JIT(jax.vmap(lambda v, w: v @ w, in_axes=(0, None)))
  return Row("vmap", "jax.jit(jax.vmap(lambda v: v @ w))(xs), 16x8 @ 8x4",
             user, user, lambda i: _ready(hoisted_f(xs, ws(i))), construct)


def _scan() -> Row:
  ws = _rotate([jnp.eye(8) * (0.1 * (i + 1)) for i in range(4)])
  xs, init = jnp.ones((16, 8)), jnp.zeros(8)

  def user(i):
    w = ws(i)
    return _ready(jax.lax.scan(lambda c, x: (jnp.tanh(c @ w + x), c.sum()),
                               init, xs))

  def construct(i):
    w = ws(i)
    return lambda c, x: (jnp.tanh(c @ w + x), c.sum())

  hoisted_f = STOCK_JIT(lambda w, init, xs: jax.lax.scan(
      lambda c, x: (jnp.tanh(c @ w + x), c.sum()), init, xs))
  return Row("scan", "eager lax.scan, fresh body, 16 steps over 8x8 w", user,
             user, lambda i: _ready(hoisted_f(ws(i), init, xs)), construct)


def _fori() -> Row:
  ws = _rotate([jnp.eye(8) * (0.1 * (i + 1)) for i in range(4)])
  init = jnp.ones(8)

  def user(i):
    w = ws(i)
    return _ready(jax.lax.fori_loop(0, 16, lambda k, v: jnp.tanh(v @ w) + k,
                                    init))

  def construct(i):
    w = ws(i)
    return lambda k, v: jnp.tanh(v @ w) + k

  hoisted_f = STOCK_JIT(lambda w, init: jax.lax.fori_loop(
      0, 16, lambda k, v: jnp.tanh(v @ w) + k, init))
  return Row("fori", "eager lax.fori_loop, fresh body, 16 steps over 8x8 w",
             user, user, lambda i: _ready(hoisted_f(ws(i), init)), construct)


def _cg() -> Row:
  # (looked up at each call, as ``spl.cg`` after ``import
  # jax.scipy.sparse.linalg as spl``: the row is made before the cache is on)
  import jax.scipy.sparse.linalg as spl
  mats = _rotate([jnp.eye(16) * (2.0 + i) + 0.1 for i in range(4)])
  b = jnp.linspace(1.0, 2.0, 16)

  def user(i):
    a = mats(i)
    return _ready(spl.cg(lambda v: a @ v, b)[0])

  def construct(i):
    a = mats(i)
    return lambda v: a @ v

  hoisted_f = STOCK_JIT(lambda a, b: spl.cg(lambda v: a @ v, b)[0])
  return Row("cg", "eager scipy.sparse.linalg.cg, fresh matvec, 16x16", user,
             user, lambda i: _ready(hoisted_f(mats(i), b)), construct)


def _long_lived() -> Row:
  w, x = jnp.full((4, 4), 0.1), jnp.ones((4, 4))

  def make(w):
    def step(x):
      return jnp.tanh(x @ w)
    return step
  stock_f = STOCK_JIT(make(w))
  with patching.enabled():
    cached_f = jax.jit(make(w))
  return Row("long-lived", "long-lived jitted closure tanh(x @ w), 4x4",
             lambda i: _ready(cached_f(x)), lambda i: _ready(stock_f(x)),
             lambda i: _ready(stock_f(x)), None, baseline="stock")


ROWS = {"nested-def": _nested_def, "global-def": _global_def, "grad": _grad,
        "value-and-grad": _value_and_grad, "partial": _partial,
        "static-lambda": _static_lambda, "vmap": _vmap, "scan": _scan,
        "fori": _fori, "cg": _cg, "long-lived": _long_lived}

#: The rows in the quick headline set (``bench`` without ``--full``).
QUICK = ("grad", "partial", "vmap", "scan")


# -- measuring ----------------------------------------------------------------

def _max_abs_diff(a, b) -> float:
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  if len(la) != len(lb):
    return float("inf")
  return max((float(np.max(np.abs(np.asarray(x, np.float64)
                                  - np.asarray(y, np.float64))))
              for x, y in zip(la, lb)), default=0.0)


def check(row: Row, calls: int = 4) -> float:
  """The largest difference between the cache's and stock's results on
  calls ``0..calls-1`` (the cache warmed up first: these are hits)."""
  with patching.enabled():
    for i in range(calls, calls + 4):
      row.cached(i)   # a code's first object is stock's; then a compile
    cached = [row.cached(i) for i in range(calls)]
  stock = [row.stock(i) for i in range(calls)]
  return max(_max_abs_diff(a, b) for a, b in zip(cached, stock))


def path_counts() -> dict:
  s = cache.stats()
  front = cache.STORE.record_hits()
  return {"fast_hits": front, "slow_hits": s["hits"] - front,
          "misses": s["misses"], "fallbacks": s["fallbacks"],
          "reasons": dict(s["fallback_reasons"]),
          "tier_a_hits": s.get("tier_a", {}).get("hits", 0)}


def counts_since(after: dict, before: dict) -> dict:
  out = {k: after[k] - before[k] for k in after if k != "reasons"}
  reasons = {r: n - before["reasons"].get(r, 0)
             for r, n in after["reasons"].items()}
  out["reasons"] = {r: n for r, n in reasons.items() if n}
  return out


def path_of(d: dict, calls: int) -> str:
  """Which path the timed cached calls took, from the ``stats()`` deltas."""
  parts = []
  if d["fast_hits"]:
    parts.append(f"matcher hit {d['fast_hits'] / calls:.0%}")
  if d["slow_hits"]:
    parts.append(f"key re-analysed {d['slow_hits'] / calls:.0%}")
  if d["misses"]:
    parts.append(f"miss {d['misses'] / calls:.0%}")
  if d["fallbacks"]:
    parts.append(f"stock {d['fallbacks'] / calls:.0%} ("
                 + ", ".join(sorted(d["reasons"])) + ")")
  if d["tier_a_hits"]:
    parts.append(f"tier A {d['tier_a_hits'] / calls:.0%}")
  return "; ".join(parts) or "none counted (identity: stock's object)"


#: Calls per block: each round runs its calls of every way in blocks of
#: this many, the ways taking turns block by block.
BLOCK = 50


def _block(call: Callable[[int], object], start: int, n: int) -> float:
  """Seconds for ``call(start) ... call(start + n - 1)``."""
  t0 = time.perf_counter()
  for i in range(start, start + n):
    call(i)
  return time.perf_counter() - t0


def measure(row: Row, calls: int = 200, rounds: int = 3) -> dict:
  """Per-call µs of each way: in each of ``rounds`` rounds, ``calls``
  calls of every way in interleaved blocks of :data:`BLOCK` (the order
  rotating block by block); the median over the rounds. The ratio is the
  median of the rounds' ``cache / (baseline + construction)``; beside it,
  ``cache`` over ``together``: the construction and the baseline call
  made one after the other in one loop."""
  ways = {"cache": row.cached, "baseline": row.hoisted}
  if row.construct is not None:
    ways["construction"] = row.construct
    # both in one loop, as a hoisting user's code runs them: the two
    # measured apart can sum to less (caches, the collector)
    ways["together"] = lambda i: (row.construct(i), row.hoisted(i))
  names = list(ways)
  per_call = {name: [] for name in names}
  with patching.enabled():
    for name in names:
      _block(ways[name], 0, 8)   # warm-up: a code's first object, a compile
    before = path_counts()
    with _compat.count_traces() as traces, \
        _compat.count_compiles() as compiles:
      start = 0
      for _ in range(rounds):
        spent = dict.fromkeys(names, 0.0)
        done = 0
        while done < calls:
          n = min(BLOCK, calls - done)
          turn = (start // BLOCK) % len(names)
          for name in names[turn:] + names[:turn]:
            spent[name] += _block(ways[name], start, n)
          done += n
          start += n
        for name in names:
          per_call[name].append(spent[name] / calls * 1e6)
    paths = counts_since(path_counts(), before)
    n_traces, n_compiles = traces(), compiles()
  built = per_call.get("construction") or [0.0] * rounds
  ratios = [c / (b + k) for c, b, k in zip(per_call["cache"],
                                           per_call["baseline"], built)]
  med = {name: statistics.median(ts) for name, ts in per_call.items()}
  total = calls * rounds
  together = per_call.get("together") or per_call["baseline"]
  return {"cache_us": med["cache"], "baseline_us": med["baseline"],
          "construction_us": med.get("construction"),
          "together_us": med.get("together"),
          "ratio": statistics.median(ratios),
          "cache_over_together": statistics.median(
              c / t for c, t in zip(per_call["cache"], together)),
          "cache_over_baseline": statistics.median(
              c / b for c, b in zip(per_call["cache"], per_call["baseline"])),
          "cache_traces": n_traces, "cache_compiles": n_compiles,
          "cache_calls": total, "path": path_of(paths, total),
          "paths": paths}


def run(names=None, calls: int = 200, rounds: int = 3) -> list[dict]:
  """Every row (or those whose key is in ``names``), measured in turn."""
  rows = []
  for key, make in ROWS.items():
    if names is not None and key not in names:
      continue
    print(f"bench: hit path, {key} ...", file=sys.stderr, flush=True)
    cache.clear()
    row = make()
    diff = check(row)
    m = measure(row, calls, rounds)
    rows.append({"workload": row.name, "key": key, "baseline": row.baseline,
                 "max_abs_diff_vs_stock": diff, **m})
    cache.clear()
  return rows


def _fmt(v, spec=".1f"):
  return "—" if v is None else f"{v:{spec}}"


def format_table(rows: list[dict]) -> str:
  lines = ["| workload | cache µs | baseline µs | construction µs | cache / "
           "(baseline + construction) | construction then baseline, one "
           "loop µs | cache / that | cache / baseline | cache traces+"
           "compiles in timed calls | path of the timed calls | max abs diff "
           "vs stock |", "|" + "---|" * 11]
  for r in rows:
    lines.append(
        f"| {r['workload']} | {r['cache_us']:.1f} | {r['baseline_us']:.1f} "
        f"({r['baseline']}) | {_fmt(r['construction_us'], '.2f')} | "
        f"{r['ratio']:.2f} | {_fmt(r['together_us'])} | "
        f"{r['cache_over_together']:.2f} | {r['cache_over_baseline']:.2f} | "
        f"{r['cache_traces']} + {r['cache_compiles']} of {r['cache_calls']} "
        f"| {r['path']} | {r['max_abs_diff_vs_stock']:.1e} |")
  return "\n".join(lines)
