"""Eager control flow with fresh closures: one executable per closure key,
results and errors equal to stock jax.lax (cache off)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat
from jax_closure_cache import lax as cached_lax
from conftest import (counting, counts_side_effects, replay_in_both_modes,
                      stock_off, warm)

STOCK_LAX = {name: _compat.STOCK_CONTROL_FLOW[name] for name in
             ("while_loop", "fori_loop", "scan", "map", "cond", "switch")}


def assert_trees_equal(got, want):
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree
  for g, w in zip(got_leaves, want_leaves):
    g, w = jnp.asarray(g), jnp.asarray(w)
    assert g.dtype == w.dtype and g.weak_type == w.weak_type, (g, w)
    np.testing.assert_array_equal(g, w)


# Each program builds its closures afresh from (lax module, w, x): calling it
# with jax.lax is stock, with jax_closure_cache.lax the cache.
def prog_while(lax, w, x):
  return lax.while_loop(lambda c: c["i"] < 3,
                        lambda c: {"i": c["i"] + 1, "x": jnp.tanh(c["x"] @ w)},
                        {"i": 0, "x": x})


def prog_fori_static(lax, w, x):
  return lax.fori_loop(0, 4, lambda i, v: v @ w + i, x)


def prog_fori_traced(lax, w, x):
  return lax.fori_loop(jnp.int32(1), jnp.int32(4), lambda i, v: v @ w + i, x)


def prog_scan(lax, w, x):
  return lax.scan(lambda c, xi: (c @ w + xi, c.sum()), x, jnp.stack([x, 2 * x]))


def prog_scan_reverse(lax, w, x):
  return lax.scan(lambda c, xi: (c * w[0] + xi, c), x, jnp.stack([x, 2 * x]),
                  reverse=True, unroll=2)


def prog_scan_no_xs(lax, w, x):
  return lax.scan(lambda c, _: (c @ w, c), x, None, length=3)


def prog_cond(lax, w, x):
  return lax.cond(x.sum() > 0, lambda a, b: a @ w + b, lambda a, b: a - b, x, 1.0)


def prog_switch_clamped_high(lax, w, x):
  return lax.switch(7, [lambda a: a @ w, lambda a: a + w[0], lambda a: -a], x)


def prog_switch_clamped_low(lax, w, x):
  return lax.switch(jnp.int32(-3), [lambda a: a @ w, lambda a: a + w[0]], x)


def prog_map(lax, w, x):
  return lax.map(lambda r: r @ w, jnp.stack([x, 3 * x, x]), batch_size=2)


PROGRAMS = [prog_while, prog_fori_static, prog_fori_traced, prog_scan,
            prog_scan_reverse, prog_scan_no_xs, prog_cond,
            prog_switch_clamped_high, prog_switch_clamped_low, prog_map]


class StockLax:
  while_loop = staticmethod(STOCK_LAX["while_loop"])
  fori_loop = staticmethod(STOCK_LAX["fori_loop"])
  scan = staticmethod(STOCK_LAX["scan"])
  map = staticmethod(STOCK_LAX["map"])
  cond = staticmethod(STOCK_LAX["cond"])
  switch = staticmethod(STOCK_LAX["switch"])


@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p.__name__)
def test_fresh_closures_reuse_one_executable(prog):
  x = jnp.arange(3.0) / 3
  w1, w2 = jnp.eye(3) / 2, jnp.eye(3) / 4 + 0.125   # same dtype, not weak
  # The first body object is stock's; the second compiles the shared entry.
  assert_trees_equal(prog(cached_lax, w1, x), prog(StockLax, w1, x))
  assert_trees_equal(prog(cached_lax, w1, x), prog(StockLax, w1, x))
  with counting() as c:
    out = prog(cached_lax, w2, x)
  assert c == {"traces": 0, "compiles": 0}
  assert_trees_equal(out, prog(StockLax, w2, x))
  assert jcc.stats()["hits"] == 1 and jcc.stats()["misses"] == 2


@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p.__name__)
def test_fresh_closures_are_answered_by_the_launchers_generated_front(
    prog, monkeypatch):
  """From a launcher code's second stored key on, eager control flow makes
  its wrapper of that code's generated front class (the matcher inline, no
  ``__init__``), publishes no identity row for the launcher (nothing else
  holds it), and answers as stock does."""
  from jax_closure_cache import cache
  from jax_closure_cache.control_flow import launchers
  from jax_closure_cache.front import inline, options
  made = []

  def wrap(launcher, user):
    w = launchers._Launcher.made(launcher, user)
    made.append(type(w))
    return w
  monkeypatch.setattr(launchers, "_wrap", wrap)
  x = jnp.arange(3.0) / 3
  for s in (2.0, 4.0, 8.0):   # the first object is stock's, then a miss
    prog(cached_lax, jnp.eye(3) / s, x)
  fronts = [c for c in inline.client_fronts.values()
            if c.__name__ == "_Launcher"]
  assert fronts, "no launcher front was filed"
  rows = len(options.hot_spec().table)
  hits, fronted = jcc.stats()["hits"], cache.STORE.record_hits()
  del made[:]
  for s in (3.0, 5.0, 6.0):
    w = jnp.eye(3) / s + 0.125
    with counting() as c:
      out = prog(cached_lax, w, x)
    assert c == {"traces": 0, "compiles": 0}
    assert_trees_equal(out, prog(StockLax, w, x))
  assert jcc.stats()["hits"] - hits == 3
  assert cache.STORE.record_hits() - fronted == 3
  assert len(made) == 3 and all(cls in fronts for cls in made), made
  assert len(options.hot_spec().table) == rows


def test_static_parameters_are_keyed():
  x = jnp.arange(3.0)
  step = lambda c, _: (c + 1, c)
  # each: 2 is stock's first object, 3 a key met once (stock's); met again,
  # 2 and 3 compile an entry each; then both hit
  for n in (2, 3, 2, 3, 2, 3):
    assert_trees_equal(count_up(cached_lax, 0, n, x), count_up(StockLax, 0, n, x))
  assert jcc.stats()["misses"] == 3 and jcc.stats()["hits"] == 2
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 1}
  # one step object launched at each length: its first launch is stock's
  # (its code's first object), and so is every later one (identity first:
  # stock's own cache answers it), so no entry is made for it
  for length in (2, 3, 2, 3, 2, 3):
    assert_trees_equal(cached_lax.scan(step, x, None, length=length),
                       StockLax.scan(step, x, None, length=length))
  assert jcc.stats()["misses"] == 4 and jcc.stats()["hits"] == 2


def count_up(lax, lo, hi, x):
  return lax.fori_loop(lo, hi, lambda i, v: v + i, x)


def test_concrete_array_fori_bounds_specialize_as_stocks():
  """Concrete jax-array bounds are specialized on their values, as stock
  does (``int()`` of each and its scan path, whose loop index is a weak
  int32: an ``int16`` bound does not make ``i * 1000`` overflow); bounds
  of two dtypes are stock's own call (its dtype rules); a re-created body
  with the same bounds hits."""
  def scaled(lo, hi):
    return cached_lax.fori_loop(
        lo, hi, lambda i, c: c + (i * 1000).astype(jnp.float32), 0.0)

  def stock(lo, hi):
    return StockLax.fori_loop(
        lo, hi, lambda i, c: c + (i * 1000).astype(jnp.float32), 0.0)
  def outcome(run, lo, hi):
    try:
      return run(lo, hi)
    except Exception as e:   # stock's error for bounds of two dtypes
      return type(e).__name__
  for lo, hi in ((jnp.int16(30), jnp.int16(40)), (jnp.int32(0), jnp.int32(5)),
                 (jnp.int16(1), jnp.int32(4)), (3, jnp.int32(6)),
                 (jnp.int16(30), jnp.int16(40))):
    got, want = outcome(scaled, lo, hi), outcome(stock, lo, hi)
    if isinstance(want, str):
      assert got == want
    else:
      assert_trees_equal(got, want)
  x = jnp.arange(3.0)
  lo, hi = jnp.int32(0), jnp.int32(5)
  warm(lambda: count_up(cached_lax, lo, hi, x))
  with counting() as c:
    out = count_up(cached_lax, lo, hi, x)
  assert c["compiles"] == 0
  assert_trees_equal(out, count_up(StockLax, lo, hi, x))


def test_carry_type_change_raises_stock_error_type():
  body = lambda c: c.astype(jnp.int32)
  with pytest.raises(TypeError) as stock_err:
    StockLax.while_loop(lambda c: False, body, jnp.ones(2))
  with pytest.raises(TypeError) as ours:
    cached_lax.while_loop(lambda c: False, body, jnp.ones(2))
  assert str(ours.value) == str(stock_err.value)


def test_under_a_trace_and_disable_jit_it_is_stock():
  w = jnp.eye(3)
  def outer(x):
    return prog_while(cached_lax, w, x)["x"].sum()
  def stock_outer(x):
    return prog_while(StockLax, w, x)["x"].sum()
  x = jnp.arange(3.0)
  np.testing.assert_allclose(jax.jit(outer)(x), jax.jit(stock_outer)(x))
  assert_trees_equal(jax.jvp(outer, (x,), (x,)), jax.jvp(stock_outer, (x,), (x,)))
  assert_trees_equal(jax.vmap(outer)(jnp.stack([x, x])),
                     jax.vmap(stock_outer)(jnp.stack([x, x])))
  with jax.disable_jit():
    assert_trees_equal(prog_scan(cached_lax, w, x), prog_scan(StockLax, w, x))
  assert jcc.stats()["hits"] + jcc.stats()["misses"] == 0


def test_closure_over_tracer_falls_back_to_stock():
  def outer(x):
    return cached_lax.while_loop(lambda c: c[0] < 2,
                                 lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]
  assert jax.jvp(outer, (3.0,), (1.0,))[1] == 6.0   # a trace: stock path
  assert jcc.stats()["entries"] == 0


def test_enable_patches_every_alias_and_disable_restores_exactly():
  import jax._src.lax as internal_lax
  before = {name: getattr(internal_lax, name, None) for name in STOCK_LAX}
  jcc.enable()
  try:
    for name in STOCK_LAX:
      assert getattr(jax.lax, name) is getattr(cached_lax, name)
      if before[name] is not None:
        assert getattr(internal_lax, name) is getattr(cached_lax, name)
    prog_while(jax.lax, jnp.eye(3), jnp.ones(3))   # routed either way
    prog_while(jax.lax, jnp.eye(3), jnp.ones(3))
    prog_while(jax.lax, 2 * jnp.eye(3), jnp.ones(3))
    assert jcc.stats()["hits"] == 1
  finally:
    jcc.disable()
  for name, original in STOCK_LAX.items():
    assert getattr(jax.lax, name) is original
    assert getattr(internal_lax, name, None) is before[name]


def _loss(x, data):
  return jnp.sum((x - data) ** 2) + 0.1 * jnp.sum(x ** 4)


def test_scipy_minimize_with_fresh_objectives():
  from jax.scipy.optimize import minimize
  x0 = jnp.zeros(3)
  datasets = [jnp.arange(3.0) + i for i in range(3)]
  stock = [minimize(lambda x: _loss(x, d), x0, method="BFGS") for d in datasets]
  assert jcc.stats()["hits"] + jcc.stats()["misses"] == 0   # not patched
  objective = lambda d: (lambda x: _loss(x, d))
  with jcc.enabled():
    minimize(objective(datasets[0]), x0, method="BFGS")   # stock's object
    cached = [minimize(objective(datasets[0]), x0, method="BFGS")]
    with counting() as c:
      cached += [minimize(objective(d), x0, method="BFGS") for d in datasets[1:]]
  assert c["compiles"] == 0
  for s, r in zip(stock, cached):
    np.testing.assert_allclose(r.x, s.x, atol=1e-6)
    np.testing.assert_allclose(r.fun, s.fun, atol=1e-6)


def test_fori_bound_types_are_kept():
  body = lambda i, c: c
  with pytest.raises(TypeError, match="arguments to fori_loop must have equal types"):
    StockLax.fori_loop(np.int16(0), jnp.int32(10), body, jnp.float32(7))
  with pytest.raises(TypeError, match="arguments to fori_loop must have equal types"):
    cached_lax.fori_loop(np.int16(0), jnp.int32(10), body, jnp.float32(7))
  assert_trees_equal(cached_lax.fori_loop(np.int16(0), 10, lambda i, c: c + 1, jnp.float32(1)),
                     StockLax.fori_loop(np.int16(0), 10, lambda i, c: c + 1, jnp.float32(1)))


def _signs_equal(got, want):
  assert_trees_equal(got, want)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.signbit(np.asarray(g)), np.signbit(np.asarray(w)))


def _zeros_cond(lax, v, z, x):
  return lax.cond(x[1] > 0, lambda y: (jnp.asarray(list(v)), y + z),
                  lambda y: (jnp.zeros(2), y), x)


def _zeros_scan(lax, v, z, x):
  return lax.scan(lambda c, _: (c + z, jnp.asarray(list(v))), x, None, length=2)


def _zeros_while(lax, v, z, x):
  return lax.while_loop(lambda c: c[0] < 1,
                        lambda c: (c[0] + 1, c[1] + z, jnp.asarray(list(v))),
                        (0, x, jnp.ones(2)))


@pytest.mark.parametrize("prog", [_zeros_cond, _zeros_scan, _zeros_while],
                         ids=lambda p: p.__name__)
def test_a_constant_holding_a_zero_stays_an_operand(prog):
  # Stock's eager cond or loop binds its primitive to the trace's constants
  # as operands; compiled as one module, they would be baked, and XLA folds
  # a baked zero by value: [-0.0, 1.0] becomes an iota (its sign lost) and
  # x + zeros becomes x (-0.0 + 0.0 is 0.0 with an operand). A launcher
  # whose trace has constants runs as stock's eager primitive does (one
  # without shares its executable: test_fresh_closures_reuse_one_executable).
  x = jnp.asarray([-0.0, 1.0, 2.0])
  z = np.zeros(3, np.float32)          # NumPy: baked by default
  with jcc.enabled():
    for _ in range(3):                 # first object, second, a third
      _signs_equal(prog(cached_lax, (-0.0, 1), z, x),
                   prog(StockLax, (-0.0, 1), z, x))
    assert jcc.stats()["not_stored"].get("operand_zero", 0) >= 2
    assert jcc.stats()["hits"] == 0


def _mask_cond(lax, x, mask):
  return lax.cond(x.sum() > 0, lambda y: y * mask, lambda y: y, x)


def _int_zeros_cond(lax, x, zeros):
  return lax.cond(x.sum() > 0, lambda y: y + zeros, lambda y: y, x)


@pytest.mark.parametrize("prog,x,constant", [
    (_mask_cond, [0.3, -1.2, 2.0], np.array([False, False, True])),
    (_int_zeros_cond, [-0.0, 1.0, 2.0], np.zeros(3, np.int32))],
    ids=["bool_mask", "int_zeros"])
def test_a_boolean_or_integer_constant_with_a_zero_stays_an_operand(
    prog, x, constant):
  # Stock's eager cond passes the constant as an operand: XLA makes x * mask
  # a select (0.0 where the mask is off) and sums x + zeros (-0.0 + 0 is
  # 0.0). Baked, XLA folds the converted constant: a product (-0.0 for a
  # negative x), and x + 0 is x (-0.0 kept).
  x = jnp.asarray(x)
  with jcc.enabled():
    for _ in range(3):
      _signs_equal(prog(cached_lax, x, constant), prog(StockLax, x, constant))
    assert jcc.stats()["not_stored"].get("operand_zero", 0) >= 2


def _reused_body_program(route):
  """One body object launched three times while a value it closes over
  changes (0, 1, 0), beside fresh bodies of the same code: stock keeps
  the reused object's first trace (its cache is keyed on the object), and
  traces each fresh one, appending to ``log`` at trace time."""
  def make(log, box):
    def body(c, x=1.0):
      log.append("traced")
      return c * (1.0 + box[0]) + x
    return body

  def launch(body, x):
    if route == "scan":
      return jax.lax.scan(lambda c, v: (body(c, v), None), x,
                          jnp.arange(3.0))[0]
    if route == "fori_loop":
      return jax.lax.fori_loop(0, 3, lambda i, c: body(c), x)
    if route == "while_loop":
      return jax.lax.while_loop(lambda c: c < 50.0, body, x)
    if route == "cond":
      return jax.lax.cond(True, body, lambda c: c, x)
    if route == "switch":
      return jax.lax.switch(0, [body, lambda c: c], x)
    return jax.lax.map(body, jnp.arange(3.0) + x)

  def run():
    out = []
    for _ in range(2):
      log, box = [], [0.0]
      reused = make(log, box)
      for scale in (0.0, 1.0, 0.0):
        box[0] = scale
        r = launch(reused, jnp.float32(2.0))
        out.append((np.asarray(r).tolist(), len(log)))
        del log[:]
        fresh_log = []
        r = launch(make(fresh_log, [scale]), jnp.float32(2.0))
        out.append((np.asarray(r).tolist(), len(fresh_log)))
    return out
  return run


@pytest.mark.parametrize("route", ["while_loop", "cond", "switch", "map",
                                   "scan", "fori_loop"])
@counts_side_effects
def test_a_body_launched_again_keeps_its_first_answer(route):
  """Identity first for eager control flow: a body object launched again
  after what it closes over changed is answered as its first launch was
  where stock's trace cache is keyed on the object, and afresh where stock
  traces it at every call (``map``), while fresh bodies of the same code
  trace (and write at trace time) as stock's do; the first run stores
  entries, the second hits them."""
  run = _reused_body_program(route)
  want = _with_cache(False, run)
  jcc.enable()
  assert run() == want
  assert run() == want


def _with_cache(on, run):
  was = jcc.is_enabled()
  (jcc.enable if on else jcc.disable)()
  try:
    return run()
  finally:
    (jcc.enable if was else jcc.disable)()


@pytest.mark.parametrize("kind", ["while_loop", "fori_loop", "scan", "map",
                                  "cond", "switch", "custom_linear_solve",
                                  "custom_root"])
def test_a_launch_keeps_a_row_only_for_a_function_held_elsewhere(kind):
  """A function written in the launch's own call (nothing else holds it)
  cannot be launched again, so it gets no identity row; one the caller
  holds by name does (the reference counts ``launchers._LONE`` assumes),
  except where stock traces it afresh at every call (``map``, the custom
  solves), which keep none."""
  from jax_closure_cache.control_flow import launchers
  x = jnp.ones(2)
  jcc.enable()
  before = len(launchers._rows)
  # the function a launch is called with directly: temporary here
  direct = {"while_loop": lambda: jax.lax.while_loop(
                lambda c: c[0] < 2.0, lambda c: c + 1.0, x),
            "fori_loop": lambda: jax.lax.fori_loop(
                0, 2, lambda i, c: c + 1.0, x),
            "scan": lambda: jax.lax.scan(lambda c, v: (c + 1.0, None), x,
                                         None, length=2),
            "map": lambda: jax.lax.map(lambda v: v + 1.0, x),
            "cond": lambda: jax.lax.cond(True, lambda c: c + 1.0,
                                         lambda c: c, x),
            "switch": lambda: jax.lax.switch(0, [lambda c: c + 1.0,
                                                 lambda c: c], x),
            "custom_linear_solve": lambda: jax.lax.custom_linear_solve(
                lambda v: v * 2.0, x, lambda m, b: b),
            "custom_root": lambda: jax.lax.custom_root(
                lambda c: c * 0.5, x, lambda g, c: c, lambda g, y: y)}[kind]
  for _ in range(3):
    direct()
  assert len(launchers._rows) == before
  held = {"while_loop": lambda c: c + 1.0, "fori_loop": lambda i, c: c + 1.0,
          "scan": lambda c, v: (c + 1.0, None), "map": lambda v: v + 1.0,
          "cond": lambda c: c + 1.0, "switch": lambda c: c + 1.0,
          "custom_linear_solve": lambda v: v * 2.0,
          "custom_root": lambda c: c * 0.5}[kind]
  # (the launch's other functions held too: a row goes with any of them)
  other = (lambda c: c[0] < 2.0) if kind == "while_loop" else (lambda c: c)
  if kind == "while_loop":
    jax.lax.while_loop(other, held, x)
  elif kind == "fori_loop":
    jax.lax.fori_loop(0, 2, held, x)
  elif kind == "scan":
    jax.lax.scan(held, x, None, length=2)
  elif kind == "map":
    jax.lax.map(held, x)
  elif kind == "cond":
    jax.lax.cond(True, held, other, x)
  elif kind == "switch":
    branches = [held, other]
    jax.lax.switch(0, branches, x)
  elif kind == "custom_linear_solve":
    jax.lax.custom_linear_solve(held, x, lambda m, b: b)
  else:
    jax.lax.custom_root(held, x, lambda g, c: c, lambda g, y: y)
  rows = 0 if kind in ("map", "custom_linear_solve", "custom_root") else 1
  assert len(launchers._rows) == before + rows
  del held
  branches = None
  assert len(launchers._rows) == before


@pytest.mark.parametrize("kind", ["while_loop", "fori_loop", "scan", "cond"])
def test_a_fronts_launch_counts_the_callers_references_as_the_generic_does(
    kind, monkeypatch):
  """A launcher's front class launches with the hit inline
  (``generated.front_class``'s ``launch``). It records a row exactly where
  the generic launch would: for a body the caller holds, not for one
  written in the call, also where its match fails after it named the body
  (a closed-over value of another type) and the generic launch answers."""
  from jax_closure_cache.control_flow import launchers
  remembered = []
  original = launchers._Launcher.remember
  monkeypatch.setattr(launchers._Launcher, "remember",
                      lambda self: remembered.append(1) or original(self))
  x = jnp.ones(2)

  def written(w):   # the launch's functions made in its own call
    if kind == "while_loop":
      return jax.lax.while_loop(lambda c: c[0] < 3.0, lambda c: c + w, x)
    if kind == "fori_loop":
      return jax.lax.fori_loop(0, 2, lambda i, c: c + w, x)
    if kind == "scan":
      return jax.lax.scan(lambda c, v: (c + w, None), x, None, length=2)[0]
    return jax.lax.cond(True, lambda c: c + w, lambda c: c, x)

  def run():
    out = [written(jnp.float32(k)) for k in range(1, 5)]
    # a closed-over value of another type: the match names the body, fails
    out += [written(np.float32(k)) for k in (5, 6)]
    for k in range(3):   # a body the caller holds by name, once
      w = jnp.float32(k + 7)

      def held(*c):   # (a loop's index or a scan's row first)
        return (c[0] + w, None) if kind == "scan" else c[-1] + w
      for _ in range(2):
        if kind == "while_loop":
          out.append(jax.lax.while_loop(lambda c: c[0] < 3.0, held, x))
        elif kind == "fori_loop":
          out.append(jax.lax.fori_loop(0, 2, held, x))
        elif kind == "scan":
          out.append(jax.lax.scan(held, x, None, length=2)[0])
        else:
          out.append(jax.lax.cond(True, held, lambda c: c, x))
    return [np.asarray(o).tolist() for o in out]

  want = stock_off(run)
  jcc.enable()
  front_code = {"while_loop": launchers._while_launcher,
                "cond": launchers._cond_launcher}.get(kind)
  for _ in range(2):
    del remembered[:]
    assert run() == want
    # written: none; held: each body's first launch (its second reads the
    # row)
    assert len(remembered) == 3
  if front_code is not None:
    code = front_code(None, None).__code__
    assert "launch" in vars(launchers.inline.client_fronts[code])


@pytest.mark.parametrize("kind", ["while_loop", "fori_loop", "scan", "cond"])
def test_a_launch_whose_new_signature_fails_lifted_is_answered_as_stocks(
    kind):
  """A fresh body meeting a stored entry with a carry of another shape
  traces that signature with its closed-over scalar lifted; where that
  trace fails (``float`` of it) stock answers (the front's launch retries
  as the generic one does), and a body the caller holds, launched again,
  keeps its first answer."""
  def launch(body, x):
    if kind == "while_loop":
      return jax.lax.while_loop(lambda c: c.sum() < 3.0, body, x)
    if kind == "fori_loop":
      return jax.lax.fori_loop(0, 2, lambda i, c: body(c), x)
    if kind == "scan":
      return jax.lax.scan(lambda c, v: (body(c), None), x, None,
                          length=2)[0]
    return jax.lax.cond(True, body, lambda c: c, x)

  def run():
    out = []
    for k, x in enumerate([jnp.ones(2)] * 4 + [jnp.ones((2, 2))] * 3):
      w = jnp.float32(k + 1.0)

      def body(c):
        return c + (w if c.ndim == 1 else float(w))
      out.append(launch(body, x))
      out.append(launch(body, x))   # held by name: launched again
    return [(np.asarray(o).tolist(), str(o.dtype)) for o in out]

  replay_in_both_modes(run, clear=True)


def test_a_launch_row_keeps_no_array_of_a_function_dropped_since():
  """A row kept for a body the caller holds goes when any function of its
  launch dies: an array closed over by a dropped ``cond`` false branch or
  ``while_loop`` condition is freed, as without the cache."""
  import gc
  import weakref
  jcc.enable()
  x = jnp.ones(3)
  for kind in ("cond", "while_loop"):
    for _ in range(3):   # a shared entry from the second launch on
      big = jnp.ones(3) * 2.0
      alive = weakref.ref(big)

      def held(v):
        return v + 1.0
      if kind == "cond":
        other = lambda v, big=big: v * big
        jax.lax.cond(True, held, other, x)
      else:
        other = lambda v, big=big: v[0] < big[0] + 5.0
        jax.lax.while_loop(other, held, x)
      del other, big
      gc.collect()
      assert alive() is None, kind


def _long_lived_condition(c):   # a condition that outlives every launch
  return c[0] < 4.0


def test_a_launch_row_frees_its_arrays_when_its_body_dies_without_a_collection():
  """A held body's row, pinning the arrays of the entry it hit, goes the
  moment the body dies, with the cyclic collector off: nothing of the
  row's refers back to it (a row whose other function's weak reference
  named the row itself kept its arrays until a collection)."""
  import gc
  import weakref
  jcc.enable()
  x = jnp.zeros(3)
  was = gc.isenabled()
  gc.disable()
  try:
    for _ in range(3):   # a shared entry from the second launch on
      big = jnp.ones(3) * 2.0
      alive = weakref.ref(big)

      def held(c, big=big):
        return c + big
      jax.lax.while_loop(_long_lived_condition, held, x)
      del held, big
      assert alive() is None
  finally:
    if was:
      gc.enable()


@counts_side_effects
def test_an_entry_is_never_stored_over_a_stale_answer_of_jaxs_own_cache():
  """A body launched once, whose closure then changed, is answered by
  JAX's own per-object cache with its first trace, in stock as here (a
  later launch of it, with a fresh condition, is stock's); no trace built
  on such an answer is stored under the key the body has now, so later
  fresh objects with that key trace as stock's do."""
  def make(c):
    cell = [c]

    def body(x):
      return x * cell[0] + 1.0
    return body, cell

  def run():
    out = []
    x = jnp.float32(0.0)
    for k in range(4):
      b, cell = make(float(k + 2))
      jax.lax.while_loop(lambda v: v < 50, b, x)
      cell[0] = 5.0
      out.append(float(jax.lax.while_loop(lambda v: v < 50, b, x)))
    return out
  want = _with_cache(False, run)
  jcc.enable()
  assert run() == want
  assert run() == want


def test_switch_branches_given_as_an_iterator_raise_stocks_error():
  x = jnp.ones(2)
  errors = []
  for lax_module in (StockLax, cached_lax):
    try:
      lax_module.switch(0, (f for f in [lambda v: v, lambda v: -v]), x)
    except Exception as e:
      errors.append(type(e))
  jcc.enable()
  try:
    jax.lax.switch(0, map(lambda f: f, [lambda v: v, lambda v: -v]), x)
  except Exception as e:
    errors.append(type(e))
  assert len(errors) == 3 and len(set(errors)) == 1, errors


@counts_side_effects
@pytest.mark.parametrize("kind", ["fori", "scan", "while", "cond"])
def test_a_body_stock_must_answer_is_traced_once_per_object(kind):
  """A fresh body whose trace writes to a log and holds a callback (which
  only stock answers: a hit would call the first object's): each object's
  trace runs once, as under stock. The second object's lifted trace,
  answered by stock after it, made the write twice, for each new key; the
  first meeting's own stock trace (seen by the trace lookup while stock's
  eager control flow ran it) now tells the key goes to stock before any
  lifted trace. Two keys (two shapes) are met, each twice."""

  def run():
    counts = []
    for i in range(8):
      log = []
      w = jnp.full(3 if i % 4 < 2 else 2, float(i))

      def body(v):
        log.append("traced")
        jax.debug.callback(lambda _: None, v)
        return v * w
      x = jnp.ones_like(w)
      if kind == "fori":
        out = jax.lax.fori_loop(0, 2, lambda k, v: body(v), x)
      elif kind == "scan":
        out = jax.lax.scan(lambda c, _: (body(c), None), x, None, length=2)[0]
      elif kind == "while":
        out = jax.lax.while_loop(lambda c: c[0] < 2,
                                 lambda c: (c[0] + 1, body(c[1])), (0, x))[1]
      else:
        out = jax.lax.cond(True, body, lambda v: v, x)
      jax.effects_barrier()
      counts.append((len(log), np.asarray(out).tolist()))
    return counts

  want = replay_in_both_modes(run, clear=True)
  assert all(n == want[0][0] for n, _ in want), want


def test_a_body_closing_over_arrays_warned_of_is_traced_once_per_object():
  """A fresh body whose closed-over arrays reach
  ``jax_captured_constants_warn_bytes``: a lifted trace's constants would
  be warned of, so stock answers every object (the cache's own rule), and
  the first meeting's stock traces, read with the key's arrays, tell so
  before any lifted trace: each object's trace-time write is made once."""

  def run():
    counts = []
    for i in range(4):
      log = []
      w = jnp.full(64, float(i))

      def body(k, v):
        log.append("traced")
        return v * w + k
      out = jax.lax.fori_loop(0, 2, body, jnp.ones(64))
      counts.append((len(log), np.asarray(out).tolist()))
    return counts

  saved = jax.config.jax_captured_constants_warn_bytes
  jax.config.update("jax_captured_constants_warn_bytes", 64)
  try:
    want = replay_in_both_modes(run, clear=True)
    assert [n for n, _ in want] == [1, 1, 1, 1]
  finally:
    jax.config.update("jax_captured_constants_warn_bytes", saved)


def test_a_body_closing_over_arrays_below_the_warned_size_is_shared():
  """The first meeting's check of captured constants counts the key's
  lifted arrays once: JAX's traces of the eager primitive hold copies of
  them, and counting those too sent a body over 120 bytes to stock at a
  200-byte threshold (no sharing, a compile per object)."""
  saved = jax.config.jax_captured_constants_warn_bytes
  jax.config.update("jax_captured_constants_warn_bytes", 200)
  try:
    jcc.enable()
    for i in range(5):
      w = jnp.full(30, float(i))
      got = jax.lax.fori_loop(0, 2, lambda k, v: v * w, jnp.ones(30))
      np.testing.assert_array_equal(got, np.full(30, float(i) ** 2))
    stats = jcc.stats()
    assert stats["hits"] >= 3, stats
    assert "captured_constants" not in stats["fallback_reasons"], stats
  finally:
    jax.config.update("jax_captured_constants_warn_bytes", saved)


@counts_side_effects
@pytest.mark.parametrize("kind", ["fori", "scan", "jit"])
def test_a_first_meeting_stock_answers_with_an_error_is_read_at_the_next(
    kind):
  """The first object's stock trace raises (the key's meeting cannot be
  read); the next object of the key holds a callback: it is stock's again
  and read there, so its trace-time write is made once (it was traced
  lifted, then by stock: twice). The callback runs as under stock."""
  calls = []

  def run():
    calls.clear()
    out = []
    for i in range(5):
      log = []
      w = jnp.full(3, float(i))

      def body(k, v):
        log.append("traced")
        if v.shape[0] == 2:
          raise ValueError("bad shape")
        jax.debug.callback(lambda _: calls.append(1), v)
        return v * w[: v.shape[0]]
      x = jnp.ones(2 if i == 0 else 3)
      try:
        if kind == "fori":
          got = jax.lax.fori_loop(0, 2, body, x)
        elif kind == "scan":
          got = jax.lax.scan(lambda c, _: (body(0, c), None), x, None,
                             length=2)[0]
        else:
          got = jax.jit(body)(0, x)
        got = np.asarray(got).tolist()
      except ValueError as e:
        got = str(e)
      jax.effects_barrier()
      out.append((len(log), got))
    return out, len(calls)

  replay_in_both_modes(run, clear=True)


@pytest.mark.parametrize("kind", ["scan", "map", "fori"])
def test_eager_control_flow_under_checking_leaks_is_as_stock(kind):
  """Under ``jax.checking_leaks()`` eager loops answer as stock's: reading a
  first meeting's stock traces keeps none made inside another trace (JAX's
  lowering of the eager primitive closes over its tracers), which the
  leak check reported as a leaked trace at every call."""

  def run():
    out = []
    for i in range(4):
      w = jnp.full(3, float(i))
      with jax.checking_leaks():
        if kind == "scan":
          got = jax.lax.scan(lambda c, x: (c + x * w, c), jnp.zeros(3),
                             jnp.ones((2, 3)))
        elif kind == "map":
          got = jax.lax.map(lambda x: x * w, jnp.ones((2, 3)))
        else:
          got = jax.lax.fori_loop(0, 3, lambda k, v: v * w + k, jnp.ones(3))
      out.append(jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), got))
    return out

  replay_in_both_modes(run, clear=True)


def _solver_outcome(call):
  """What a caller sees of a solve: the solution's leaves (structure,
  dtype, weak type, shape, committed-ness and bits) and the second output,
  or the exception's type and text."""
  try:
    x, info = call()
  except Exception as e:   # what a user's except clause would see
    return type(e).__name__, str(e)
  leaves, tree = jax.tree_util.tree_flatten(x)
  return (str(tree), None if info is None else np.asarray(info).tolist(),
          [(l.dtype, l.weak_type, l.shape, l.committed, np.asarray(l).tobytes())
           for l in leaves])


@pytest.mark.parametrize("solver", ["cg", "bicgstab"])
def test_eager_iterative_solvers_with_fresh_functions_are_stocks(solver):
  """``cg`` and ``bicgstab`` called eagerly with fresh functions are one
  cached executable set-up included, and every call is stock's to the bit:
  a matvec over an array, a matrix given as such, a pytree right-hand side
  with a given ``x0`` and a fresh preconditioner, tolerances keyed by
  exact type and bits (``0.0``/``-0.0``, ``1``/``1.0``), NumPy operands,
  a debug callback in the matvec (its effects counted), a trace-time write
  (not shared), a matvec that reads its input where it can (stock hands it
  the concrete initial guess once per trace: a fresh one, which it may
  keep or delete), weakly typed right-hand
  sides (stock's eager solve returns its solve's types), and stock's
  errors (shapes, trees, a non-square matrix)."""
  log, traced, read, kept = [], [], [], []

  def run():
    solve = getattr(jax.scipy.sparse.linalg, solver)
    del log[:], traced[:], read[:], kept[:]
    out = []
    for s in (2.0, 3.0, 2.0):
      a = jnp.eye(4) * s + 0.25
      d = 1.0 / jnp.diag(a)
      b = jnp.arange(1.0, 5.0)
      out.append(_solver_outcome(lambda: solve(lambda v: a @ v, b)))
      out.append(_solver_outcome(lambda: solve(a, np.arange(4.0, dtype=np.float32))))
      for tol, atol in ((1e-5, 0.0), (1e-5, -0.0), (1, 0.0), (1.0, 0.0)):
        out.append(_solver_outcome(lambda: solve(
            lambda v: a @ v, b, tol=tol, atol=atol, maxiter=3)))
      tree_b = {"u": b, "v": b[:2] * s}
      tree_x0 = {"u": b * 0.5, "v": jnp.ones(2)}
      out.append(_solver_outcome(lambda: solve(
          lambda t: {"u": a @ t["u"], "v": t["v"] * s}, tree_b, tree_x0,
          M=jax.tree_util.Partial(lambda t: {"u": d * t["u"], "v": t["v"]}))))

      def logged(v):
        jax.debug.callback(lambda r: log.append(float(r)), v.sum())
        return a @ v
      out.append(_solver_outcome(lambda: solve(logged, b, maxiter=2)))

      def writes(v):
        traced.append(s)
        return a @ v
      out.append(_solver_outcome(lambda: solve(writes, b)))

      def reads(v):
        try:
          read.append(np.asarray(v).sum())
        except jax.errors.TracerArrayConversionError:
          pass
        return a @ v

      def keeps(v):   # the concrete initial guess it is handed, kept
        if not isinstance(v, jax.core.Tracer):
          kept.append(v)
        return a @ v

      def deletes(v):   # ... or deleted
        if not isinstance(v, jax.core.Tracer):
          v.delete()
        return a @ v
      out.append(_solver_outcome(lambda: solve(keeps, b)))
      out.append(_solver_outcome(lambda: solve(deletes, b)))
      out.append(_solver_outcome(lambda: solve(reads, b)))
      out.append(_solver_outcome(lambda: solve(reads, b, b * 0.5)))
      out.append(_solver_outcome(lambda: solve(lambda v: s * v,
                                               jnp.asarray(3.0))))
      out.append(_solver_outcome(lambda: solve(
          lambda v: [s * v[0], v[1]], [1.0, 2.0])))
      out.append(_solver_outcome(lambda: solve(lambda v: a @ v, b,
                                               np.ones(4, np.float32))))
      out.append(_solver_outcome(lambda: solve(lambda v: a @ v, b, jnp.ones(3))))
      out.append(_solver_outcome(lambda: solve(lambda v: a @ v, b, [b])))
      out.append(_solver_outcome(lambda: solve(jnp.ones((4, 3)), b)))
    distinct = len({id(v) for v in kept})
    return (out, sorted(log), list(traced), [float(r) for r in read],
            len(kept), distinct)

  replay_in_both_modes(run, clear=True)


def test_the_cached_solvers_pickle_as_stocks_do():
  """``pickle`` finds a function by its module and name: the cached ``cg``
  and ``bicgstab`` are found there while the cache is on (a partial of one
  too), and stock's after ``disable()``."""
  import functools
  import pickle
  jcc.enable()
  for name in ("cg", "bicgstab"):
    solve = getattr(jax.scipy.sparse.linalg, name)
    assert solve is not _compat.STOCK_SOLVERS[name]
    assert pickle.loads(pickle.dumps(solve)) is solve
    made = pickle.loads(pickle.dumps(functools.partial(solve, tol=1e-3)))
    assert made.func is solve and made.keywords == {"tol": 1e-3}
  jcc.disable()
  for name in ("cg", "bicgstab"):
    solve = getattr(jax.scipy.sparse.linalg, name)
    assert solve is _compat.STOCK_SOLVERS[name]
    assert pickle.loads(pickle.dumps(solve)) is solve


def _count_eager_zeros(monkeypatch, solver, also_public=False) -> list:
  """The shapes of the eager ``zeros_like`` calls the solver's module makes
  from now on (and ``jax.numpy``'s, the package's own, with
  ``also_public``)."""
  eager_zeros = []
  numpy_of_solver = _compat.STOCK_SOLVERS[solver].__globals__["jnp"]
  stock_zeros_like = numpy_of_solver.zeros_like

  def zeros_like(x, *args, **kwargs):
    if not isinstance(x, jax.core.Tracer):
      eager_zeros.append(x.shape)
    return stock_zeros_like(x, *args, **kwargs)
  monkeypatch.setattr(numpy_of_solver, "zeros_like", zeros_like)
  if also_public:
    monkeypatch.setattr(jnp, "zeros_like", zeros_like)
  return eager_zeros


@pytest.mark.parametrize("solver", ["cg", "bicgstab"])
def test_a_fresh_cg_matvec_runs_its_set_up_inside_the_cached_executable(
    monkeypatch, solver):
  """The whole eager call, its initial guess of zeros included, is the
  cached executable: from the third matvec on no trace, no compile and no
  eager ``zeros_like`` (stock computes it eagerly on every call, then traces
  and compiles the solve)."""
  eager_zeros = _count_eager_zeros(monkeypatch, solver)
  b = jnp.arange(1.0, 5.0)

  def call(s):
    a = jnp.eye(4) * s + 0.1
    return getattr(jax.scipy.sparse.linalg, solver)(lambda v: a @ v, b)[0]

  want = stock_off(call, 2.0)
  assert eager_zeros == [(4,)]
  jcc.enable()
  warm(lambda: call(1.0))
  del eager_zeros[:]
  hits = jcc.stats()["hits"]
  with counting() as c:
    got = call(2.0)
  assert c == {"traces": 0, "compiles": 0}, c
  assert eager_zeros == []
  assert jcc.stats()["hits"] == hits + 1
  np.testing.assert_array_equal(got, want)


def test_a_large_right_hand_side_is_set_up_by_stock_alone(monkeypatch):
  """Zeros over ``ZEROS_KEPT_BYTES`` are not kept: such a call is stock's
  set-up (one eager ``zeros_like``, as stock's; none made beside it) around
  the cached solve, with stock's results."""
  from jax_closure_cache.key import values
  eager_zeros = _count_eager_zeros(monkeypatch, "cg", also_public=True)
  n = values.ZEROS_KEPT_BYTES // 4 + 1
  b = jnp.ones(n)

  def call(s):
    return jax.scipy.sparse.linalg.cg(lambda v: v * s, b, maxiter=2)[0]

  want = stock_off(call, 2.0)
  jcc.enable()
  warm(lambda: call(1.0))
  del eager_zeros[:]
  got = call(2.0)
  assert eager_zeros == [(n,)]
  np.testing.assert_array_equal(got, want)


def test_a_carry_a_loop_passes_through_is_the_callers_own_object():
  """Stock's eager ``while_loop``, ``fori_loop`` and ``scan`` return a carry
  their body passes through unchanged (and a ``scan``'s ``xs`` returned as
  its ``ys``) as the caller's own object: a Python ``float`` or ``int``, a
  NumPy array, the very jax array; its ``cond`` returns a new array; its
  ``map`` returns a jax ``xs`` its function returns unchanged. So do the
  launchers' hits."""
  kept = jnp.arange(3.0)
  host = np.arange(3.0, dtype=np.float32)

  def seen(out, given):
    return [(type(o).__name__, o is g, np.asarray(o).tobytes())
            for o, g in zip(out, given)]

  def run():
    got = []
    for i in range(3):
      w = jnp.ones(3) * i
      given = (0.5, 7, host, kept)
      out = jax.lax.while_loop(
          lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + w, *c[2:]),
          (0, jnp.zeros(3), *given))
      got.append(seen(out[2:], given))
      out = jax.lax.fori_loop(0, 2, lambda k, c: (c[0] + w, *c[1:]),
                              (jnp.zeros(3), *given))
      got.append(seen(out[1:], given))
      carry, ys = jax.lax.scan(lambda c, x: ((c[0] + w, *c[1:]), x),
                               (jnp.zeros(3), *given), kept[:, None])
      got.append(seen(carry[1:], given) + [ys is kept])
      out = jax.lax.cond(True, lambda a, b: (a + w, b), lambda a, b: (a, b),
                         jnp.zeros(3), 1.5)
      got.append(type(out[1]).__name__)
      # a map's xs returned as its result: the caller's jax array itself,
      # a NumPy xs put on the device; batched, a new array
      for xs in (kept[:, None], host[:, None], {"k": kept, "h": host}):
        out = jax.lax.map(lambda v: (v, jax.tree_util.tree_map(
            lambda u: u * w[0], v)), xs)
        got.append(seen(jax.tree_util.tree_leaves(out[0]),
                        jax.tree_util.tree_leaves(xs)))
      out = jax.lax.map(lambda v: v if w is not None else v, kept,
                        batch_size=2)
      got.append((out is kept, np.asarray(out).tobytes()))
    return got

  replay_in_both_modes(run, clear=True)


def test_an_operand_every_branch_passes_through_is_stocks_object():
  """Stock's eager ``cond`` and ``switch`` return an operand every branch
  returns unchanged through ``asarray``: a jax array as the caller's own
  object, a NumPy array or Python float as a new array; where one branch
  changes it, a new array. So do the launchers' hits."""
  kept = jnp.arange(3.0)
  host = np.arange(3.0, dtype=np.float32)

  def run():
    got = []
    for i in range(4):
      w = jnp.full(3, float(i))
      given = (kept, host, 0.5)
      outs = [jax.lax.cond(True, lambda a, b, c: (a, b, c + w),
                           lambda a, b, c: (a, b, c - w), *given),
              jax.lax.cond(False, lambda a, b, c: (a * w, b, c * w),
                           lambda a, b, c: (a, b, c + w), *given),
              jax.lax.switch(i % 2, [lambda a, b, c: (a, b, c + w),
                                     lambda a, b, c: (a, b, c * w)], *given),
              jax.lax.cond(True, lambda d: {"k": d["k"], "v": d["v"] + w},
                           lambda d: d, {"k": kept, "v": kept})]
      for out in outs:
        leaves = jax.tree_util.tree_leaves(out)
        got.append([(type(o).__name__, o is kept, np.asarray(o).tobytes())
                    for o in leaves])
    return got

  want = replay_in_both_modes(run, clear=True)
  assert [leaf[1] for leaf in want[0]] == [True, False, False]


def test_a_held_body_launched_again_passes_its_carries_through_as_stocks():
  """A body the caller holds, launched twice: its second launch is
  answered by its row's entry, and returns a carry the body passes through
  as the caller's own object too (a NumPy array, a Python float, the very
  jax array), as stock's eager loops do."""
  host = np.arange(3.0, dtype=np.float32)
  kept = jnp.arange(3.0)

  def run():
    got = []
    for i in range(3):
      w = jnp.full(3, float(i + 1))

      def passthru(*c):   # (a loop's index first)
        return (c[-1][0] + w, *c[-1][1:])

      def scanned(c, x):
        return passthru(c), x
      given = (jnp.zeros(3), host, 0.5, kept)
      for _ in range(2):
        outs = [jax.lax.fori_loop(0, 3, passthru, given),
                jax.lax.while_loop(lambda c: c[0][0] < 5.0, passthru,
                                   (jnp.ones(3), *given[1:])),
                jax.lax.scan(scanned, given, None, length=2)[0]]
        got.append([[(type(o).__name__, o is g) for o, g in
                     zip(out[1:], given[1:])] for out in outs])
    return got

  replay_in_both_modes(run, clear=True)


@pytest.mark.parametrize("kind", ["while", "fori", "scan", "map", "cond",
                                  "switch"])
def test_a_body_closing_over_an_array_it_never_reads_verifies(kind):
  """A fresh body closes over one array it reads and one it never reads
  (``if unused is not None``). Stock's trace drops the unused one; so does
  the lifted trace. Verify mode's own stock trace traces the body as stock
  does (not through the lookup's shared trace, which lifts every
  closed-over array): every hit verifies, and the results are stock's."""
  x = jnp.arange(3.0)

  def body_of(w, unused):
    if kind == "while":
      return lambda: jax.lax.while_loop(
          lambda c: c[0] < 3 if unused is not None else False,
          lambda c: (c[0] + 1, c[1] * w if unused is not None else c[1]),
          (0, x))
    if kind == "fori":
      return lambda: jax.lax.fori_loop(
          0, 3, lambda i, c: c + w if unused is not None else c, x)
    if kind == "scan":
      return lambda: jax.lax.scan(
          lambda c, xi: (c + xi * w if unused is not None else c, None),
          x, x[:2])
    if kind == "map":
      return lambda: jax.lax.map(
          lambda r: r * w if unused is not None else r, x)
    if kind == "cond":
      return lambda: jax.lax.cond(
          x[0] > -1, lambda v: v * w if unused is not None else v,
          lambda v: v - 1.0, x)
    return lambda: jax.lax.switch(
        1, [lambda v: v - w, lambda v: v * w if unused is not None else v],
        x)

  def run():
    got = []
    for i in range(3):
      out = body_of(jnp.float32(i + 2), jnp.full(4, i))()
      got.append([np.asarray(o).tobytes() for o in
                  jax.tree_util.tree_leaves(out)])
    return got

  before = jcc.stats().get("verify_mismatches", 0)
  replay_in_both_modes(run, clear=True)
  assert jcc.stats().get("verify_mismatches", 0) == before


@pytest.mark.parametrize("kind", ["while", "fori", "scan", "map"])
def test_what_a_loop_passes_through_is_read_per_argument_signature(kind):
  """One fresh body per call, traced for three carries of other types and
  lengths (one shared entry, a trace per signature): a float carry it
  passes through, an int carry it doubles, a longer carry. Each call's
  results are stock's (values and which objects are the caller's own),
  whichever signature the entry traced last."""
  def body(w, c):
    rest = tuple(v if v.dtype == jnp.float32 else v * 2 for v in c[1:])
    return (c[0] + w, *rest)

  def launch(w, carry):
    if kind == "while":
      out = jax.lax.while_loop(lambda c: c[0][0] < 2,
                               lambda c: body(w, c), carry)
    elif kind == "fori":
      out = jax.lax.fori_loop(0, 2, lambda i, c: body(w, c), carry)
    elif kind == "scan":
      out, _ = jax.lax.scan(lambda c, _: (body(w, c), None), carry,
                            length=2)
    else:
      out = jax.lax.map(lambda c: body(w, c), carry)
    return [(o is g, np.asarray(o).dtype.name, np.asarray(o).tobytes())
            for o, g in zip(out, carry)]

  ints = jnp.arange(3, dtype=jnp.int32)
  floats = jnp.arange(3.0)

  def run():
    got = []
    for carry in [(jnp.zeros(3), ints), (jnp.zeros(3), floats),
                  (jnp.zeros(3), floats, ints), (jnp.zeros(3), ints),
                  (jnp.zeros(3), floats, floats), (jnp.zeros(3), floats)]:
      got.append(launch(jnp.float32(1.5), carry))
    return got

  replay_in_both_modes(run, clear=True)
