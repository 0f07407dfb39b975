"""Tier A: the executable shared after stock's own trace, by the jaxpr's
structure (``lowering/shared.py``), compared with stock on fresh function
objects, each sequence run twice, in verify mode.

Closures here hold what the closure key refuses (an object holding a
logger, too large to key by its attributes), so every call traces as
stock does; only lowering and compiling are shared.
"""

import contextlib
import functools
import logging
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import test_util as jtu
from jax.ad_checkpoint import checkpoint_name

import jax_closure_cache as jcc
from conftest import (
    STOCK_JIT, counting, counts_side_effects, needs_trace_lookup,
    replay_in_both_modes, same_as_stock, stock_off)

LOG = logging.getLogger("tier_a_test")


class Model:
  """What the closure key refuses (a logger inside): tier A's case."""

  def __init__(self, w):
    self.w = w
    self.log = LOG


def tier_a_stats():
  return jcc.stats()["tier_a"]


def run_steps(make, n, *args):
  return [jax.jit(make(i))(*args) for i in range(n)]


WEIGHTS = [np.full((4, 4), 1.0 + i, np.float32) for i in range(8)]


def make_model_step(i):
  m = Model(jnp.asarray(WEIGHTS[i]))
  lr = 0.1 / (i + 1)

  def step(p):
    return p - lr * jnp.tanh(p @ m.w) + 1.0
  return step


@pytest.mark.parametrize("rerun", [0, 1])
def test_refused_closures_trace_as_stock_and_compile_twice(rerun):
  del rerun   # the sequence runs twice: the second finds the first's entry
  p = jnp.eye(4)
  with counting() as stock:
    want = stock_off(run_steps, make_model_step, 8, p)
  jcc.enable(verify=True)
  with counting() as c:
    got = run_steps(make_model_step, 8, p)
  for g, w in zip(got, want):
    same_as_stock(g, w, rtol=1e-6)
  assert c["traces"] == 8   # every call traces, as stock
  assert stock["compiles"] >= 8
  assert c["compiles"] <= 2   # stock: 8
  s = jcc.stats()
  assert s["verify_mismatches"] == 0 and s["tier_a"]["hits"] >= 6
  with counting() as c:
    run_steps(make_model_step, 4, p)
  assert c["compiles"] == 0


def test_learning_rate_schedule_compiles_twice():
  """A new Python float each step, 100 steps: stock compiles 100 times; the
  first step's is stock's own lowering (the literal baked, as for any
  structure met once), the shared lowering takes the literal as an argument
  from the second step."""
  p = jnp.eye(4)
  m = Model(jnp.ones((4, 4)))

  def run(n):
    out, q = [], p
    for i in range(n):
      lr = 0.5 / (i + 1)
      q = jax.jit(lambda q: q - lr * jnp.tanh(q @ m.w))(q)
      out.append(q)
    return out

  want = stock_off(run, 100)   # (and JAX's own one-time executables)
  jcc.enable(verify=True)
  with counting() as c:
    got = run(100)
  for g, w in zip(got, want):
    same_as_stock(g, w)   # the literal an argument, bit for bit
  assert c["compiles"] == 2, (c, jcc.stats()["tier_a"])
  assert jcc.stats()["tier_a"]["met_once"] == 1
  assert jcc.stats()["verify_mismatches"] == 0


#: Scalar constants XLA folds together in stock's module (a changing
#: Python float ``c``, or a closed-over 0-d array, beside a literal):
#: passed as an argument, the product or sum would keep the written order.
_REASSOCIATED = {
    "product": lambda y, c: (y * c) * 3.0,
    "product_first": lambda y, c: 3.0 * (c * y),
    "quotient": lambda y, c: (y / c) * 3.0,
    "quotients": lambda y, c: (y / c) / 3.0,
    "sum": lambda y, c: (y + c) - 3.0,
    "square": lambda y, c: (y * c) * c,
    "factored": lambda y, c: y * c + y * (1 - c),
    "scaled_total": lambda y, c: jnp.sum(y) * c * 3.0,
    "inside_cond": lambda y, c: jax.lax.cond(y[0] > -100, lambda u: (u * c)
                                             * 3.0, lambda u: u, y),
    # through a move XLA sees through
    "through_reshape": lambda y, c: (y * c).reshape(8, 8) * 0.3,
    "through_rev": lambda y, c: (y * c)[::-1] * 0.3,
    "through_broadcast": lambda y, c: jnp.broadcast_to(y + c, (2, 64)) + 0.3,
    # a function of the constant alone, which XLA evaluates at compile time
    "tanh_of_it": lambda y, c: y + jnp.tanh(c),
    "log_of_it": lambda y, c: y + jnp.log(jnp.abs(c)),
    "rsqrt_of_it": lambda y, c: y * jax.lax.rsqrt(jnp.abs(c)),
    "power": lambda y, c: jax.lax.pow(jnp.abs(y), jnp.float32(c)),
    # across a call XLA inlines, either way
    "into_a_jit": lambda y, c: _times_three(y * c),
    "out_of_a_jit": lambda y, c: jax.jit(lambda u: u * c)(y) * 3.0,
    "gradient_sum": lambda y, c: jax.grad(
        lambda u: jnp.sum(u * c * u) * 0.5)(y),
}


@jax.jit
def _times_three(u):
  return u * 3.0


@pytest.mark.parametrize("pattern", sorted(_REASSOCIATED))
def test_scalars_xla_folds_together_are_stocks_bit_for_bit(pattern):
  """A changing Python float (tier A's changed literal) and a fresh
  closed-over 0-d array (the closure key's lifted leaf) beside another
  scalar constant, in a chain XLA reassociates in stock's module: the
  cache's results are stock's bit for bit (such a jaxpr is stock's), and
  verify mode finds nothing to report."""
  f = _REASSOCIATED[pattern]
  y = jnp.asarray(np.random.default_rng(0).standard_normal(64) * 10,
                  jnp.float32)

  def run():
    out = []
    for c in (2.0, 3.0, 0.1, 1 / 3, 7.0, -0.5, 1e-3, 12.5):
      out.append(jax.jit(lambda v: f(v, c))(y))
      w = jnp.float32(c)
      out.append(jax.jit(lambda v: f(v, w))(y))
    return [np.asarray(o).tobytes() for o in out]

  want = stock_off(run)
  for closure_key in (False, True):
    jcc.clear()
    jcc.enable(closure_key=closure_key, verify=True)
    for _ in range(2):
      assert run() == want, closure_key
    assert jcc.stats()["verify_mismatches"] == 0
    jcc.disable()


def test_a_scalar_beside_no_other_constant_of_its_chain_is_shared():
  """What the reassociation check leaves shared: a changing learning rate
  scaling a value no other scalar constant multiplies (Adam's update), a
  mean (whose divisor never changes) scaled by a literal, a constant from
  which a sum is subtracted (``c - (x + 0.3)``, which XLA does not
  reassociate): one shared executable after the first step, bit for bit
  stock's."""
  y = jnp.asarray(np.random.default_rng(1).standard_normal(64), jnp.float32)

  def run(n):
    out = []
    for i in range(n):
      # (no step's rate is one of the module's own constants, 0.1 or 0.3,
      # which XLA would hold once: such a step's rate is keyed by value)
      lr = 0.5 / (i + 1.5)
      out.append(jax.jit(lambda v: v - lr * (0.9 * v + 0.1 * v * v)
                         / (jnp.sqrt(v * v) + 1e-8))(y))
      out.append(jax.jit(lambda v: jnp.mean(v * lr) * 2.0)(y))
      out.append(jax.jit(lambda v: lr - (v + 0.3))(y))
    return out

  want = stock_off(run, 6)
  jcc.enable(closure_key=False, verify=True)
  with counting() as c:
    got = run(6)
  for g, w in zip(got, want):
    same_as_stock(g, w)
  assert c["compiles"] == 6, c   # each structure: its first two steps
  assert jcc.stats()["verify_mismatches"] == 0


def test_division_by_a_zero_scalar_raises_as_stock():
  m = Model(jnp.ones(3))

  def run(lr):
    return jax.jit(lambda x: x * m.w * (1.0 / lr))(jnp.ones(3))

  jcc.enable(verify=True)
  run(1.0), run(2.0), run(4.0)
  with pytest.raises(ZeroDivisionError):
    run(0.0)
  with pytest.raises(ZeroDivisionError):
    stock_off(run, 0.0)


def test_int_and_bool_literals_stay_part_of_the_key():
  """``1``, ``True`` and ``1.0`` make different jaxprs; integer literals are
  never arguments (they may be indices XLA folds)."""
  m = Model(jnp.arange(6.0))

  def run(k):
    return jax.jit(lambda x: x[k] + m.w[k] * k)(jnp.arange(6.0))

  jcc.enable(verify=True)
  for k in (1, True, 2, 1, True, 2):
    same_as_stock(run(k), stock_off(run, k))


@counts_side_effects
def test_runtime_callbacks_never_share_an_executable():
  """Each fresh callback is a parameter held by identity: every object logs
  to its own list, as stock's."""
  m = Model(jnp.ones(3))

  def run(log):
    def f(x):
      jax.debug.callback(lambda v: log.append(float(v)), x.sum())
      return x * m.w
    out = jax.jit(f)(jnp.ones(3))
    jax.effects_barrier()
    return out

  jcc.enable(verify=True)
  logs = [[] for _ in range(4)]
  for log in logs:
    run(log)
  want = [[] for _ in range(4)]
  for log in want:
    stock_off(run, log)
  assert logs == want == [[3.0]] * 4


def test_weak_types_and_dtypes_of_constants_as_stock():
  def run(c):
    m = Model(c)
    return jax.jit(lambda x: x + m.w)(jnp.ones(3, jnp.float32))

  jcc.enable(verify=True)
  for c in (np.float32(2), jnp.float32(2), np.ones(3, np.float32),
            jnp.ones(3, jnp.int32), np.float32(3), jnp.ones(3, jnp.int32) * 2,
            np.ones(3, np.float32) * 5):
    same_as_stock(run(c), stock_off(run, c))


def test_a_committed_constant_is_answered_by_stock():
  w = jax.device_put(jnp.ones(3), jax.devices()[0])
  assert w.committed

  def run():
    m = Model(w)
    return jax.jit(lambda x: x + m.w)(jnp.ones(3))

  jcc.enable(verify=True)
  for _ in range(3):
    out = run()
    same_as_stock(out, stock_off(run))
    assert out.committed == stock_off(run).committed
  assert tier_a_stats()["refused"].get("a constant committed to a device")


def test_never_repeating_structures_store_nothing():
  jcc.enable()
  m = Model(jnp.ones(2))
  for n in range(1, 12):
    jax.jit(lambda x: x * m.w.sum() + jnp.arange(float(n)))(jnp.ones(n))
  assert tier_a_stats()["entries"] == 0


def test_lower_is_stocks_own():
  m = Model(jnp.ones(3))
  mk = lambda: jax.jit(lambda x: x * m.w)   # noqa: E731
  jcc.enable()
  for _ in range(3):
    mk()(jnp.ones(3))
  text = mk().lower(jnp.ones(3)).as_text()
  assert text == stock_off(lambda: mk().lower(jnp.ones(3)).as_text())


@pytest.mark.closure_cache_expects_mismatches
def test_verify_mode_catches_a_lowering_that_differs(monkeypatch):
  """The oracle can fail: a structure key that left out what the lowering
  reads (here, every parameter) is caught on the hit, and stock answers."""
  from jax_closure_cache.lowering import structure
  monkeypatch.setattr(structure, "param_key", lambda p, named=True: None)
  m = Model(jnp.full(4, 2.0))   # (not all 1.0: XLA removes x * 1)

  def run(axis):
    return jax.jit(lambda x: jnp.sum(x * m.w[:, None], axis=axis))(
        jnp.arange(16.0).reshape(4, 4))

  jcc.enable(verify=True)
  outs = [run(a) for a in (0, 0, 1)]
  same_as_stock(outs[2], stock_off(run, 1))
  assert jcc.stats()["verify_mismatches"] == 1


def test_eager_control_flow_shares_through_tier_a():
  m = Model(jnp.ones(3))

  def run(i):
    def body(c, x):
      return c * m.w + x, c
    return jax.lax.scan(body, jnp.zeros(3) + i, jnp.ones((5, 3)))

  jcc.enable(verify=True)
  with counting() as c:
    got = [run(i) for i in range(6)]
  for i, g in enumerate(got):
    same_as_stock(g, stock_off(run, i))
  assert c["compiles"] <= 4
  assert jcc.stats()["verify_mismatches"] == 0


def test_a_constant_free_structure_shares_its_first_lowering_while_it_lives():
  """A second jaxpr of a structure with nothing to pass (no constants, the
  same literals) uses the first meeting's own lowering as it is, while the
  first's jitted object keeps it alive: one compile in all."""
  scale = Model(2.0)   # a Python float inside an object: baked, no constant

  def make():
    return jax.jit(lambda x: x * scale.w + 1.0)

  x = jnp.ones(3)
  jcc.enable(verify=True)
  first = make()
  with counting() as c:
    outs = [first(x)] + [make()(x) for _ in range(4)]
  assert c["compiles"] == 1, (c, jcc.stats()["tier_a"])
  for o in outs:
    same_as_stock(o, stock_off(lambda: make()(x)))
  assert jcc.stats()["verify_mismatches"] == 0


def test_explanations_name_the_first_structural_difference(monkeypatch,
                                                           caplog):
  import logging
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  m = Model(jnp.ones(3))
  jcc.enable()
  # (an element added: a product by, or a sum with, a value computed from
  # a constant alone is never shared, and refused before its structure is
  # met)
  jax.jit(lambda x: jnp.sin(x) + m.w[0])(jnp.ones(3))
  jax.jit(lambda x: jnp.sin(x) + m.w[0])(jnp.ones(4))
  text = caplog.text
  assert "met <lambda>'s structure for the first time" in text
  assert "it differs from the last one at the inputs" in text
  caplog.clear()
  jax.jit(lambda x: jnp.cos(x) + m.w[0])(jnp.ones(4))
  # (the earlier structure's primitive, named as itself)
  assert "differs from the last one at equation 0 (sin): its primitive" in (
      caplog.text)


def test_the_equation_context_is_part_of_the_structure():
  """``threefry_partitionable`` (an equation's context) changes the random
  bits: a structure traced under the other setting is not shared."""
  def run(p):
    with jax.threefry_partitionable(p):
      return jax.jit(lambda k: jax.random.bits(k, (3,)))(jax.random.key(0))

  want = {p: np.asarray(stock_off(run, p)) for p in (True, False)}
  jcc.enable(verify=True)
  for p in (True, True, False, False, True, False):
    np.testing.assert_array_equal(run(p), want[p])


def test_a_constant_only_dead_code_reads_is_not_passed():
  """pjit prunes an input only dead code reads; a constant passed for it
  would be paired with another input's sharding (two devices)."""
  import subprocess
  import sys
  import textwrap
  code = textwrap.dedent("""
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import NamedSharding, PartitionSpec as P
      import jax_closure_cache as jcc
      mesh = jax.make_mesh((2,), ("x",))
      x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("x")))
      def run(i):
        c, d = jnp.ones(3) * i, jnp.float32(i + 1)
        return jax.jit(lambda x: (c[:2], x * d)[1])(x)
      want = [np.asarray(run(i)) for i in range(4)]
      jcc.enable(verify=True, closure_key=False)   # tier A alone
      got = [np.asarray(run(i)) for i in range(4)]
      assert all((g == w).all() for g, w in zip(got, want)), (got, want)
      assert jcc.stats()["verify_mismatches"] == 0
      print("ok", jcc.stats()["tier_a"]["refused"])
      """)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], env=env, timeout=300,
                       capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "dead code" in out.stdout


def test_a_nested_jits_constants_are_arguments_of_the_shared_lowering():
  """An inner ``jax.jit`` closing over an array puts it in its own jaxpr's
  constants; at the top level they are hoisted into arguments, so the
  outer structure is shared whatever the array's value."""
  def run(i):
    m = Model(jnp.asarray(WEIGHTS[i % 8]))
    inner = jax.jit(lambda x: x @ m.w)
    return jax.jit(lambda x: jnp.tanh(inner(x)) + 1.0)(jnp.eye(4))

  want = [stock_off(run, i) for i in range(6)]
  jcc.enable(verify=True)
  for _ in range(2):
    with counting() as c:
      got = [run(i) for i in range(6)]
    for g, w in zip(got, want):
      same_as_stock(g, w, rtol=1e-6)
    assert c["compiles"] <= 2, c
  assert jcc.stats()["verify_mismatches"] == 0


@pytest.mark.parametrize("closure_key", [False, True])
def test_a_jitted_function_passed_statically_over_a_new_array_each_call(
    closure_key):
  """Seed 000's closure form: a fresh jitted ``f`` closing over a new array
  each call, passed statically to a fresh ``jax.jit(g, static_argnums=0)``.
  ``g``'s jaxpr holds ``f``'s jit with its array as a nested constant, and
  its top level has no constant: the first meeting's lowering (the array
  baked into it) must not serve the second (it answered with the first
  array, then crashed on a layout when passed one argument more)."""
  x = jnp.linspace(0.0, 1.0, 4)

  def make(w):
    return jax.jit(lambda v: jnp.square(v) * w)

  def g(f, v):
    return f(v) + 1.0

  def run(n):
    out = []
    for i in range(n):
      f = make(jnp.asarray(float(i + 1)))
      gj = jax.jit(g, static_argnums=(0,))
      out += [f(x), gj(f, x), gj(f, x)]
    return out

  want = stock_off(run, 4)
  for rerun in range(2):   # the second finds the first's entries
    jcc.enable(closure_key=closure_key, verify=True)
    got = run(4)
    for k, (a, b) in enumerate(zip(got, want)):
      same_as_stock(a, b, rtol=1e-6, where=f"rerun {rerun} output {k}")
    assert jcc.stats()["verify_mismatches"] == 0
    jcc.disable()


def _zero_sum_step(i):
  m = Model(jnp.asarray(((1.0, 1.0, 1.0), (0.5, -1.0, 0.0))[i % 2]))

  def f(y):   # the gradient adds ct * -0.0 * w (from w alone) to ct * 0
    return (y * m.w * -0.0).sum() + (y * 0).sum()
  return jax.grad(f)


def _signs_as_stocks(make, n):
  """``n`` steps of ``make`` with tier A alone in verify mode: values and
  signs of zero as stock's; returns stock's results."""
  x = jnp.asarray([-2.0, -0.5, 1.0])
  want = stock_off(run_steps, make, n, x)
  jcc.enable(closure_key=False, verify=True)
  got = run_steps(make, n, x)
  for g, w in zip(got, want):
    same_as_stock(g, w)
    np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
  return want


def test_a_lifted_value_added_to_a_zero_xla_folds_is_stocks():
  # Stock bakes the constant w, so XLA folds both terms and sums them
  # (-0.0 + 0.0 is 0.0); passed as an argument, w's term is a runtime value
  # and XLA simplifies "+ 0" away, keeping -0.0. Such a jaxpr is stock's.
  # A small w is baked as stock bakes it, keyed by its bytes: the two
  # values of w share an executable each, with stock's signs.
  _signs_as_stocks(_zero_sum_step, 6)
  stats = tier_a_stats()
  assert stats["baked"] >= 1 and stats["hits"] >= 1, stats


def _adds_a_constant_of_zeros(i):
  # a fresh array each step: NumPy int32, NumPy float32, a jax array
  c = (np.zeros(3, np.int32), np.zeros(3, np.float32), jnp.zeros(3))[i % 3]
  return lambda y: y * 0.0 + c


def test_a_constant_of_zeros_is_baked_as_stock_bakes_it():
  # Baked, XLA folds "x + zeros" to x and keeps x's -0.0; passed as an
  # argument the addition runs and gives 0.0 (value-grammar seed 6, program
  # 1006: a masked array's filled zeros). Such a constant is never an
  # argument: its trace is lowered as stock lowers it.
  # Such a constant is never an argument: a small one is baked as stock
  # bakes it and keyed by its bytes (shared by the calls whose constant is
  # the same zeros), a large one refused (its trace lowered as stock's).
  want = _signs_as_stocks(_adds_a_constant_of_zeros, 9)
  assert np.signbit(np.asarray(want[0]))[0]   # the fold it must keep
  stats = tier_a_stats()
  assert stats["baked"] >= 1 and stats["hits"] >= 1, stats
  jcc.clear()
  big = jnp.zeros(4096)
  _signs_as_stocks(lambda i: (lambda y: y * 0.0 + big[:3]), 4)
  assert tier_a_stats()["refused"].get(
      "a constant of zeros (XLA folds x + 0 in stock's module)")
  assert tier_a_stats()["hits"] == 0


def test_a_nan_literal_or_constant_is_baked_as_stock_bakes_it():
  # XLA folds max(x, nan) with a baked NaN to a NaN of another sign than
  # it computes with an argument (adversarial pass: a schedule ending in a
  # NaN). Neither a NaN literal nor a constant holding one is an argument.
  rates = (0.1, 0.2, 0.3, float("nan"), 0.2, float("nan"))

  def run():
    outs = []
    for lr in rates:
      f = lambda p, lr=lr: jnp.maximum(p - 3.0, lr) + jnp.minimum(p, -lr)
      outs.append(jax.jit(f)(jnp.ones(3, jnp.float32) * 3))
      c = jnp.asarray([lr, 1.0, 2.0], jnp.float32)
      g = lambda p, c=c: jnp.maximum(p - 3.0, c)
      outs.append(jax.jit(g)(jnp.ones(3, jnp.float32) * 3))
    return [np.asarray(o).view(np.uint32) for o in outs]

  want = stock_off(run)
  jcc.enable(closure_key=False)
  for _ in range(2):
    for g, w in zip(run(), want):
      np.testing.assert_array_equal(g, w)   # bit for bit: a NaN's sign


def test_store_is_bounded_by_the_bytes_of_its_executables():
  """Each stored lowering counts its compiled executable's bytes: with room
  for about two, six structures keep at most two, and every call still
  answers as stock."""
  from jax_closure_cache.lowering import shared
  m = Model(jnp.arange(8.0))

  def run(k, scale):
    # ``k`` extra sines: a structure per k; ``scale`` a float literal
    def f(x):
      for _ in range(k):
        x = jnp.sin(x)
      return x * m.w * scale
    return jax.jit(f)(jnp.ones(8))

  jcc.enable(verify=True)
  run(1, 0.5)
  run(1, 0.25)
  sizes = [e.nbytes for e in shared.LOWERINGS.store.values()]
  assert len(sizes) == 1 and sizes[0] > 0, sizes
  saved = jcc.max_bytes()
  jcc.set_max_bytes(int(sizes[0] * 2.5))
  try:
    for k in range(2, 8):
      for scale in (0.5, 0.25):
        same_as_stock(run(k, scale), stock_off(run, k, scale), rtol=2e-6)
      assert len(shared.LOWERINGS.store) <= 3
    tier_a = jcc.stats()["tier_a"]
    assert tier_a["bytes"] == sum(e.nbytes
                                  for e in shared.LOWERINGS.store.values())
    assert tier_a["bytes"] <= jcc.max_bytes() or tier_a["entries"] == 1
  finally:
    jcc.set_max_bytes(saved)
  assert jcc.stats()["verify_mismatches"] == 0


def test_a_pow_exponent_stays_in_the_key():
  """``x ** p`` with a changing float ``p``: XLA compiles a constant
  exponent 2.0 into a product (many times faster than the general power an
  argument exponent needs), so the exponent is never an argument: one
  shared lowering per exponent, each stock's module, results exact."""
  m = Model(jnp.linspace(0.5, 2.0, 16))

  def run(p):
    return jax.jit(lambda x: jnp.sum((x * m.w) ** p))(jnp.ones(16))

  jcc.enable(verify=True)
  for p in (2.0, 3.0, 2.0, 3.0, 2.0, 3.0):
    same_as_stock(run(p), stock_off(run, p))
  s = tier_a_stats()
  assert s["entries"] == 2 and s["hits"] >= 2, s
  assert jcc.stats()["verify_mismatches"] == 0


def test_a_jax_array_constant_is_read_once_while_it_lives(monkeypatch):
  """Whether a jax array constant can be an argument (not zeros, no -0.0,
  not committed) is read off its values once per array, not copied to the
  host on every call; a new array is read afresh: one of zeros is still
  baked as stock bakes it, and the shared entry's results stay stock's."""
  from jax_closure_cache._compat import lowering as compat_lowering
  reads = []
  all_zero = compat_lowering.all_zero

  def counting_all_zero(c, **kwargs):
    reads.append(id(c))
    return all_zero(c, **kwargs)
  monkeypatch.setattr(compat_lowering, "all_zero", counting_all_zero)
  w = jnp.asarray(WEIGHTS[1])

  def make(w, i):
    m = Model(w)   # the closure key refuses it: tier A answers
    lr = 0.1 * (i + 1)

    def step(p):
      return p - lr * jnp.tanh(p @ m.w) + 1.0
    return step

  p = jnp.ones((4, 4))
  jcc.enable(verify=True)
  for i in range(6):
    same_as_stock(jax.jit(make(w, i))(p), stock_off(
        lambda i: jax.jit(make(w, i))(p), i))
  assert reads.count(id(w)) == 1, reads
  assert tier_a_stats()["hits"] >= 3
  zeros = jnp.zeros((32, 32))   # (over shared.BAKED_BYTES: not baked)
  q = jnp.ones((4, 32))
  for i in range(3):
    same_as_stock(jax.jit(make(zeros, i))(q), stock_off(
        lambda i: jax.jit(make(zeros, i))(q), i))
  assert reads.count(id(zeros)) == 1, reads
  assert tier_a_stats()["refused"].get(
      "a constant of zeros (XLA folds x + 0 in stock's module)")
  assert jcc.stats()["verify_mismatches"] == 0


def test_parameter_keys_of_treedefs_and_jax_closures_trust_no_user_equality():
  """A parameter JAX makes afresh per trace (a treedef, a function of jax's
  code over a jaxpr, as closure conversion makes for ``custom_root``) is
  keyed by its parts: equal parts key equal, and a user's object among
  them by identity, never by its ``__eq__``."""
  from jax_closure_cache.lowering import structure
  key = lambda p: structure.param_key(p, named=False)   # noqa: E731
  tree = jax.tree_util.tree_structure
  assert key(tree({"a": 1, "b": (2, None)})) == key(
      tree({"a": 3, "b": (4, None)}))
  assert key(tree({"a": 1})) != key(tree({"b": 1}))
  assert key(tree((1, 2))) != key(tree([1, 2]))

  class AlwaysEqual:
    def __eq__(self, other):
      return True

    def __hash__(self):
      return 0

  @jax.tree_util.register_pytree_node_class
  class Node:
    def __init__(self, x, aux):
      self.x, self.aux = x, aux

    def tree_flatten(self):
      return (self.x,), self.aux

    @classmethod
    def tree_unflatten(cls, aux, children):
      return cls(children[0], aux)

  assert key(tree(Node(1, 1))) != key(tree(Node(1, True)))   # 1 == True
  assert key(tree(Node(1, 1))) == key(tree(Node(2, 1)))
  one, two = AlwaysEqual(), AlwaysEqual()
  assert tree(Node(1, one)) == tree(Node(1, two))   # JAX's own equality
  assert key(tree(Node(1, one))) != key(tree(Node(1, two)))
  # a set's members by their own keys (a user's object by identity)
  assert key(frozenset({one})) != key(frozenset({two}))
  assert key(tree(Node(1, frozenset({one})))) != key(
      tree(Node(1, frozenset({two}))))
  assert key(frozenset({1, 2.0})) == key(frozenset({2.0, 1}))
  assert key(frozenset({1})) != key(frozenset({True}))

  def converted(k):
    return jax.closure_convert(lambda y: 2.0 * y + k, jnp.ones(3))[0]
  # fresh functions over equal jaxprs: one key; another literal: another
  assert key(converted(1.0)) == key(converted(1.0))
  assert key(converted(1.0)) != key(converted(2.0))
  user = lambda y: y   # noqa: E731
  assert key(user) != key(lambda y: y)   # a user's function by identity


class _Named:
  def __init__(self, name):
    self.name = name


class _AlwaysEqualCallback:
  """A pure_callback's callable whose ``__eq__`` says True to any other,
  counting the calls made from the package's code (JAX's own caches call
  it too, with the cache off as on)."""
  eq_calls = 0

  def __init__(self, k):
    self.k = k

  def __call__(self, x):
    return np.float32(x * self.k)

  def __eq__(self, other):
    package = os.path.dirname(jcc.__file__)
    frame = sys._getframe(1)
    while frame is not None:
      if frame.f_code.co_filename.startswith(package):
        type(self).eq_calls += 1
        break
      frame = frame.f_back
    return True

  def __hash__(self):
    return 0


def _callback_programs():
  """Fresh jitted functions whose runtime callbacks see objects of their
  own trace: a debug.callback's static argument (a frozenset holding a
  user's object; a set changed after its trace), a pure_callback's callable
  with its own ``__eq__``; and a debug.print of a treedef deeper than the
  walk keys by its nodes. Returns every log and value."""
  log = []

  def show(x, s):
    log.append(sorted(o.name if isinstance(o, _Named) else o for o in s))
  x = jnp.float32(1.0)
  for o in (_Named("A"), _Named("A"), _Named("B")):
    jax.jit(lambda v: jax.debug.callback(show, v, frozenset({o})) or v + 1)(
        x).block_until_ready()
  sets = [{1}, {1}]
  for s in sets:
    jax.jit(lambda v: jax.debug.callback(show, v, s) or v + 1)(
        x).block_until_ready()
  sets[1].add(99)   # changed after its trace: a later fresh set is {1}
  jax.jit(lambda v: jax.debug.callback(show, v, {1}) or v + 1)(
      x).block_until_ready()
  values = [float(jax.jit(lambda v: jax.pure_callback(
      _AlwaysEqualCallback(k), jax.ShapeDtypeStruct((), jnp.float32), v))(x))
      for k in (1.0, 2.0, 3.0)]
  deep = x
  for _ in range(300):
    deep = [deep]
  for _ in range(2):
    jax.jit(lambda d: jax.debug.callback(lambda t: log.append(
        len(jax.tree_util.tree_leaves(t))), d) or d)(deep)
  jax.effects_barrier()
  return log, values


@counts_side_effects
def test_runtime_callbacks_never_share_by_equality_of_what_they_hold():
  """Tier A alone, in verify mode: an executable whose callback would run
  on another trace's objects is never shared (a callback's flat wrapper is
  keyed by identity; a set by its members' own keys; a jax dataclass field
  by field, never by its ``__eq__``), a deep treedef neither crashes nor
  counts a mismatch, and no user ``__eq__`` is called."""
  want = _callback_programs()
  _AlwaysEqualCallback.eq_calls = 0
  jcc.enable(closure_key=False, verify=True)
  got = [_callback_programs() for _ in range(2)]
  assert got == [want, want]
  assert _AlwaysEqualCallback.eq_calls == 0
  assert jcc.stats()["verify_mismatches"] == 0


def _bits(tree):
  """Each leaf's dtype, weak type and bit pattern (a -0.0 and a NaN's sign
  and payload included)."""
  return [(x.dtype, x.weak_type, np.asarray(x).tobytes())
          for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("closure_key", [False, True])
def test_literals_are_read_as_their_dtype_holds_them_and_folded_as_stock(
    closure_key):
  """A float literal is passed as an argument only where XLA would not
  fold it in stock's module: not one its dtype holds as a zero (``1e-50``
  in float32: stock's ``x + 0`` keeps a -0.0), nor one read by an equation
  on literals and constants alone (stock folds ``log(1.0)``, ``c - inf``,
  ``6.0 % 3.0`` at compile time: the sign of a zero and a NaN's bits are
  the compiler's)."""
  def make(c):
    def f(x):
      return (jax.lax.add(x, c), jax.lax.add(x.astype(jnp.complex64), c * 1j),
              x + jnp.log(c), jnp.float32(c) - jnp.inf, x + jnp.float32(c) % c,
              x + (jnp.float32(c) - jnp.float32(c)), jnp.log(-jnp.float32(c)))
    return f

  def run():
    z = jnp.float32(-0.0)
    return [_bits(jax.jit(make(c))(z)) for c in (2.0, 3.0, 1e-50, 1.0, 1.0)]

  want = stock_off(run)
  jcc.enable(closure_key=closure_key, verify=False)
  for _ in range(2):
    assert run() == want


@pytest.mark.parametrize("closure_key", [False, True])
def test_subnormal_literals_and_constants_are_folded_as_stock(closure_key):
  """A subnormal float (``1e-40`` in float32, either part of a complex) is
  never passed as an argument: XLA's compile-time evaluation keeps stock's
  baked one exactly, where the runtime reads an argument's as a zero (a
  comparison flips, ``x / eps`` gives inf). Literals and constants
  (NumPy and jax arrays) alike, beside normal values that are shared."""
  mask = jnp.asarray([True, False])

  def make(eps, table):
    def f(m):
      x = m.astype(jnp.float32)
      # (no complex quotient or product, nor a quotient by an array, of a
      # constant: XLA folds those otherwise than the runtime computes them,
      # so they are never shared; ``test_what_xla_rewrites_with_baked_constants_is_never_shared``)
      # (``x // eps`` keys its divisor by value: jnp's floor division
      # compares it with zero, which XLA folds)
      return (jnp.where(x > 1, eps, x), x / eps,
              x.astype(jnp.complex64) + 1j * eps, x * table)
    return f

  def compared(eps, table):
    # (a comparison keys its literal by value, and a constant it reads is
    # never an argument: such a jaxpr shares only with itself)
    return lambda m: (m.astype(jnp.float32) < eps,
                      m.astype(jnp.float32) < table)

  # (a jax array the closure key lifts is an argument of its entry, passed
  # only where it holds no subnormal: ``entries.check_values``)
  kinds = (np.float32, jnp.float32)

  def run():
    outs = []
    for eps in (1e-3, 1e-40, 2e-40, 1e-5, 1e-40, 3e-3):
      for kind in kinds:
        table = kind([eps, 1.0])
        outs.append(_bits(jax.jit(make(eps, table))(mask)))
        outs.append(_bits(jax.jit(compared(eps, table))(mask)))
    return outs

  want = stock_off(run)
  jcc.enable(closure_key=closure_key)
  for _ in range(2):
    assert run() == want
  assert jcc.stats()["verify_mismatches"] == 0
  assert jcc.stats()["tier_a"]["hits"] > 0   # the normal values share


@pytest.mark.parametrize("closure_key", [False, True])
def test_identity_values_are_folded_as_stock(closure_key):
  """1, -1 and the infinities are never passed as arguments: stock's XLA
  removes ``x * 1.0``, ``x / 1.0``, ``max(x, -inf)``, ``min(x, inf)`` and
  a clamp between infinities, and makes ``x * -1.0`` a negation, where the
  runtime's operation with an argument flushes a subnormal ``x`` to zero
  and keeps a NaN's sign. Literals (a warm-up factor reaching 1.0, a clip
  bound of inf) and constants (NumPy float and int arrays of ones, a 0-d
  jax array; moved, computed on alone, or read in a loop's body), beside
  other values that are shared."""
  x = jnp.asarray([3e-39, -1e-40, np.nan, 1.0], jnp.float32)

  def make(scale, bound, table, ints, scalar):
    def f(v):
      return (v * scale, v / scale, jnp.maximum(v, -bound),
              jnp.minimum(v, bound), jnp.clip(v, -bound, bound),
              v * table, v * ints, v * scalar,
              jax.lax.scan(lambda c, _: (c * table, None), v, None,
                           length=2)[0])
    return f

  def computed(table):   # (a value XLA computes from a constant first)
    def f(v):
      return v * jnp.abs(-table)
    return f

  def run():
    outs = []
    # (a bound of max, min or clip is keyed by value: the calls that share
    # meet a bound again)
    for scale, bound in ((0.5, 3.0), (1.0, np.inf), (2.0, 3.0),
                         (-1.0, np.inf), (3.0, 7.0), (1.0, 3.0),
                         (-1.0, 7.0), (0.25, np.inf), (0.75, 7.0)):
      table = np.full(4, scale, np.float32)
      ints = np.full(4, int(scale) or 2, np.int32)
      # (a 0-d jax array the closure key lifts, which tier A never meets:
      # ``test_cache_hits.py::test_lifted_arrays_stock_folds_by_value_are_stocks``)
      scalar = (np.float32(scale) if closure_key
                else jnp.float32(scale))
      outs.append(_bits(jax.jit(make(scale, bound, table, ints, scalar))(x)))
      outs.append(_bits(jax.jit(computed(table))(x)))
    return outs

  want = stock_off(run)
  jcc.enable(closure_key=closure_key)
  for _ in range(2):
    assert run() == want
  assert jcc.stats()["verify_mismatches"] == 0
  assert jcc.stats()["tier_a"]["hits"] > 0   # the other values share


@pytest.mark.parametrize("closure_key", [False, True])
def test_remainders_by_a_changing_divisor_are_computed_as_stock(closure_key):
  """A remainder's operand (``lax.rem``, jnp's ``x % c`` and ``x // c``,
  whose nested jits compare the divisor with zero and take its sign) is
  never passed as an argument: XLA computes with stock's constant
  otherwise (a subnormal kept, a NaN's sign, the last bit of a large
  quotient). Literals and NumPy constants; each divisor's structure is its
  own, every bit as stock's."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(np.concatenate([
      rng.standard_normal(64).astype(np.float32) * 1e30,
      np.asarray([1e38, -1e38, 3e-39, np.inf, -np.inf, 5.5], np.float32)]))

  def make(c, constant):
    def f(v):
      return v // c, v % c, jax.lax.rem(v, c), v // constant, v % constant
    return f

  def run():
    return [_bits(jax.jit(make(c, np.float32(c)))(x))
            for c in (0.5, 2.0, 3.0, 7.0, 2.0, 0.25, 3.0)]

  want = stock_off(run)
  jcc.enable(closure_key=closure_key)
  for _ in range(2):
    assert run() == want
  assert jcc.stats()["verify_mismatches"] == 0


def test_literals_xla_rewrites_or_merges_are_computed_as_stock():
  """A special function's literal operand (``atan2(x, 1.0)``, which XLA
  rewrites; ``igamma(0.5, x)``, whose lowering computes on ``a`` alone,
  folded for a constant) and a comparison's (``jnp.where(x > s, x, s)``,
  whose two constants XLA's CSE makes one and whose ``select`` it then
  makes a ``max``, which flushes a subnormal) are keyed by value, and so
  is a literal whose value the module also holds as a constant
  (``jnp.where(x > 2.0, x, s)`` where ``s`` is 2.0); a literal used twice
  elsewhere is two arguments, each use rewritten as stock's constant is
  (``(x - s) / s``: the quotient by a lone argument becomes a product by
  its reciprocal, as stock's does). Fresh functions, every bit as stock's;
  the changing values that can be arguments still share."""
  x = jnp.asarray(np.concatenate([
      np.asarray([1e-41, -1e-41, 2.0, 0.3, -3.0, 100.0, 1.5], np.float32),
      np.arange(-40, 40, dtype=np.float32) * 0.37 + 0.11]))

  def run():
    out = []
    for s in (3.0, 1.0, 1.0, -1.0, 2.0, 1.7, 0.7978845608):
      out.append(_bits(jax.jit(lambda v: jax.lax.atan2(v, s))(x)))
      out.append(_bits(jax.jit(lambda v: jax.lax.igamma(abs(s), v))(
          jnp.abs(x))))
      out.append(_bits(jax.jit(lambda v: jnp.where(v > s, v, s))(x)))
      out.append(_bits(jax.jit(lambda v: (v * s, jnp.where(v > 2.0, v, s))
                               )(x)))
      out.append(_bits(jax.jit(lambda v: ((v - s) / s,
                                          jnp.round(v * s) / s))(x)))
    return out

  want = stock_off(run)
  jcc.enable()   # (a Python float closed over: each value its own key)
  for _ in range(2):
    assert run() == want
  assert jcc.stats()["verify_mismatches"] == 0
  assert jcc.stats()["tier_a"]["hits"] > 0


@pytest.mark.parametrize("closure_key", [False, True])
def test_literals_inlined_bounds_and_expansions_are_computed_as_stock(
    closure_key):
  """Three more of XLA's rewrites by a constant's value. A literal of a
  jaxpr the top level holds (a nested ``jit``, ``cond``, ``scan``,
  ``checkpoint``) is a constant of both modules, which XLA inlines and
  merges with an equal top-level one: ``jnp.where(jit(v > 2.0)(v), s,
  v)`` with ``s`` 2.0 becomes a ``min``, which flushes a subnormal. A
  bound of ``clip`` or ``clamp``, a literal or a closed-over 0-d array
  (crossed bounds: a NaN's sign). A
  special function whose lowering is arithmetic with constants
  (``lgamma``, ``digamma``, ``acosh``, ``cosh``, ``exp2``) of an operation
  by a lifted scalar: XLA reassociates the two. Fresh functions, values
  ordinary first and special later, every bit as stock's, in tier A alone
  and both tiers; other values still share."""
  x = jnp.asarray(np.asarray(
      [1e-40, -1e-40, 3.0, -0.0, np.nan, -np.nan, 0.5, 1.25, 2.5, 10.0,
       -0.5, 0.9], np.float32))
  gt = jax.jit(lambda v: v > 2.0)
  y = jnp.asarray(np.asarray([1.0, 2.0, 0.5, 3.0, 0.1, 10.0, -0.5, 1e-3, 0.9,
                              0.33], np.float32))
  expansions = (lambda v, s: jax.lax.lgamma(v + s),
                lambda v, s: jax.lax.digamma(v - s),
                lambda v, s: jnp.arccosh(v + s),
                lambda v, s: jnp.cosh(v + s),
                lambda v, s: jnp.exp2(v * s))

  def run():
    out = []
    for s in (0.3, 0.7, 2.0, 1.3, 0.45, -2.0, 2.0):
      out.append(_bits(jax.jit(lambda v: jnp.where(gt(v), s, v))(x)))
      out.append(_bits(jax.jit(lambda v: jnp.where(
          jax.lax.cond(True, lambda u: u > 2.0, lambda u: u < 2.0, v),
          s, v))(x)))
      out.append(_bits(jax.jit(lambda v: jnp.where(jax.lax.scan(
          lambda c, u: (c, u > 2.0), 0.0, v[None])[1][0], s, v))(x)))
      out.append(_bits(jax.jit(lambda v: (jnp.clip(v, -s, s),
                                          jax.lax.clamp(-s, v, s)))(x)))
      lo, hi = jnp.float32(-s), jnp.float32(s)   # (closed over: lifted)
      out.append(_bits(jax.jit(lambda v: (
          jnp.clip(v, lo, hi), jax.lax.clamp(lo, v, hi),
          jnp.minimum(jnp.maximum(v, lo), 2.0)))(x)))
      for special in expansions:
        out.append(_bits(jax.jit(lambda v: special(v, s))(y)))
      out.append(_bits(jax.jit(lambda v: v * s + 1.0)(x)))
    return out

  want = stock_off(run)
  jcc.enable(closure_key=closure_key)
  try:
    for _ in range(2):
      assert run() == want
    assert jcc.stats()["tier_a"]["hits"] > 0
  finally:
    jcc.disable()


@pytest.mark.parametrize("closure_key", [False, True])
def test_what_xla_rewrites_with_baked_constants_is_never_shared(closure_key):
  """Where stock's XLA rewrites an operation with a constant it bakes (a
  quotient by an array as a product by its folded reciprocal, ``x /
  sqrt(c)`` as ``x * rsqrt(c)``, two array constants of a product or sum
  reassociated, one-element arrays as scalars, complex quotients and
  products simplified or folded, a branch or a one-trip loop inlined and a
  product reassociated across it, a choice by a lifted predicate folded,
  sums, ``min`` of signed zeros and arithmetic narrower than 32 bits
  folded by its own evaluator, a product or square of constants it folds
  before an addition the runtime fuses with it, through a slice too,
  ``abs`` of a complex value, a transposed constant laid out anew for a
  dot), a
  closed-over value or a changed literal passed as an
  argument would round otherwise: such a jaxpr is never shared. Fresh
  functions, three values each, tier A alone and both tiers; every bit as
  stock's."""
  rng = np.random.default_rng(0)
  vals = [np.array(rng.uniform(1, 13, 6), np.float32) for _ in range(3)]
  x = jnp.arange(1.0, 7.0, dtype=jnp.float32)
  rows = jnp.arange(1.0, 13.0, dtype=jnp.float32).reshape(2, 6)
  xc = jnp.asarray([1.7 + 0.3j, -2.9 + 1.1j, 0.77 - 2.4j], jnp.complex64)
  xr = jnp.asarray([float.fromhex("-0x1.f45dc4p-1"),
                    float.fromhex("-0x1.a42a04p-3")], jnp.float32)
  makers = [
      lambda i: (lambda v: v / vals[i]),   # a NumPy constant
      lambda i: (lambda v, c=jnp.asarray(vals[i]): v / c),
      lambda i: (lambda v, c1=jnp.asarray(vals[i]),
                         c2=jnp.asarray(vals[i - 1]): (v * c1) * c2),
      lambda i: (lambda v, c1=jnp.asarray(vals[i]) * 1e-3,
                         c2=jnp.asarray(vals[i - 1]): (v * 0.37 + c1) + c2),
      lambda i: (lambda v, c=jnp.asarray(vals[i]):
                         rows / c[None, :] + v[0]),
      lambda i: (lambda v, c=jnp.asarray(vals[i][1]):
                         v / jnp.sqrt(c)),
      lambda i: (lambda v, m=jnp.asarray(vals[i]),
                         s=jnp.asarray(vals[i - 1]):
                         (v - m) / jnp.sqrt(s + 1e-5) * 1.5 + 0.1),
      lambda i: (lambda v, c=(3.0, 7.0, 11.0)[i]: xc / c + v[0]),
      lambda i: (lambda v, c=(1 + 2j, 0.5j, 3 + 0j)[i]:
                         xr * c + 1.0),
      lambda i: (lambda v, a=jnp.asarray(vals[i]).reshape(2, 3),
                 b=jnp.asarray(vals[i - 1]).reshape(3, 2):
                 v.reshape(3, 2) @ (a @ b)),   # a contraction XLA folds
      lambda i: (lambda v, lr=(0.1, 0.0137, 0.00731)[i]: jax.lax.cond(
          jnp.asarray(True), lambda y: y * 0.37, lambda y: y * 0.59, v * lr)),
      lambda i: (lambda v, lr=(0.1, 0.0137, 0.00731)[i]: jax.lax.scan(
          lambda c, _: (c * 0.37, None), v * lr, None, length=1)[0]),
      lambda i: (lambda v, lr=(0.1, 0.0137, 0.00731)[i]: jax.lax.while_loop(
          lambda c: c[0] < 1, lambda c: (c[0] + 1, c[1] * 0.37),
          (0, v * lr))[1]),
      lambda i: (lambda v, t=jnp.asarray(vals[i][3] - 6.0): jax.lax.cond(
          t > 0, lambda y: y * 0.59, lambda y: y * 0.23, v) * 0.37),
      lambda i: (lambda v, t=jnp.asarray(vals[i][4] - 6.0):
                 jnp.where(t > 0, v * 0.37, v) * 0.59),
      lambda i: (lambda v, c=jnp.asarray(vals[i][:1]): (v * c) * 0.37),
      lambda i: (lambda v, c=jnp.asarray(np.random.default_rng(i).uniform(
          -2, 2, 5000).astype(np.float32)): v * jnp.mean(c)),
      lambda i: (lambda v, a=jnp.asarray(np.array(
          [-0.0] * 5 + [vals[i][0]], np.float32)), b=jnp.asarray(np.array(
              [0.0] * 5 + [20.0], np.float32)): v * jnp.clip(a, -1.0, b)),
      lambda i: (lambda v, c=jnp.asarray(np.array(
          [np.nan] * 5 + [vals[i][0]], np.float32)):
                 v * c.astype(jnp.float8_e4m3fn).astype(jnp.float32)),
      lambda i: (lambda v, m=jnp.asarray(vals[i]): 0.9 * m + 0.1 * v),
      lambda i: (lambda v, c=jnp.asarray(vals[i]),
                 d=jnp.asarray(vals[i - 1]): v - c * d),
      lambda i: (lambda v, c=jnp.asarray(vals[i], jnp.bfloat16),
                 d=jnp.asarray(vals[i - 1], jnp.bfloat16):
                 v + (c + d).astype(v.dtype)),
      lambda i: (lambda v, c=jnp.asarray(vals[i]):
                 v * (c.astype(jnp.bfloat16) * 1.37).astype(v.dtype)),
      lambda i: (lambda v, c=jnp.asarray(vals[i] + 1j * vals[i - 1]):
                 v * jnp.abs(c)),
      lambda i: (lambda v, c=jnp.asarray(np.random.default_rng(i).uniform(
          -2, 2, 5000).astype(np.float32)): jax.lax.scan(
              lambda a, _: (a * jnp.sum(c), None), v, None, length=1)[0]),
      lambda i: (lambda v, w=jnp.asarray(np.random.default_rng(i).uniform(
          -1, 1, (24, 32)).astype(np.float32)):
                 (jnp.tile(v, (16, 6))[:, :32] * 0.173) @ w.T),
      lambda i: (lambda v, c=jnp.asarray(np.random.default_rng(i).uniform(
          -2, 2, 16).astype(np.float32)), d=jnp.asarray(
              np.random.default_rng(i + 7).uniform(-2, 2, 16).astype(
                  np.float32)): v + (c * d)[3:9]),
      lambda i: (lambda v, c=jnp.asarray(vals[i]): v + jnp.square(c)),
      lambda i: (lambda v, c=jnp.asarray(vals[i]), t=jnp.asarray(
          vals[i][0] + 5.0): jnp.where(t > 0, v * 0.37, v * c) * 0.59),
      # a changed literal, a power of two when the entry is made, then not
      lambda i: (lambda v, c=jnp.asarray(vals[i]), lr=(0.3, 0.5, 0.7)[i]:
                 v + c * lr),
      # read alike, and shared: a PRNG key's extended dtype among them
      lambda i: (lambda v, c=jnp.asarray(vals[i]): v * c + jax.random.key_data(
          jax.random.split(jax.random.key(7))[1])[0].astype(v.dtype)),
  ]

  def run():
    return [_bits(jax.jit(make(i))(x)) for make in makers for i in range(3)]

  want = stock_off(run)
  jcc.enable(closure_key=closure_key)
  for _ in range(2):
    assert run() == want
  assert jcc.stats()["verify_mismatches"] == 0
  tier_a = jcc.stats()["tier_a"]
  assert not [r for r in tier_a["refused"] if "cannot read" in r]
  assert tier_a["hits"] > 0 or closure_key   # the last row shares


@counts_side_effects
@pytest.mark.parametrize("closure_key", [False, True])
def test_a_literal_its_dtype_cannot_hold_warns_as_stock_at_every_call(
    closure_key):
  """``1e300`` as a float32 literal: JAX's lowering warns of its overflow
  at every lowering; such a jaxpr is not shared (and the package makes no
  warning of its own)."""
  def make(c):
    return lambda x: jax.lax.add(x, c)

  def run():
    with warnings.catch_warnings(record=True) as rec:
      warnings.simplefilter("always")
      outs = [jax.jit(make(c))(jnp.float32(1.0)) for c in (1e300, 2e300, 1e300)]
    return [str(o) for o in outs], [(w.category, os.path.basename(w.filename))
                                   for w in rec]

  want = stock_off(run)
  assert want[1]   # stock warns
  jcc.enable(closure_key=closure_key)
  for _ in range(2):
    assert run() == want


@counts_side_effects
@pytest.mark.parametrize("closure_key", [False, True])
@pytest.mark.parametrize("where", ["numpy global", "numpy cell", "jax cell"])
def test_captured_constants_are_warned_of_at_every_call_as_stock(closure_key,
                                                                 where):
  """With ``jax_captured_constants_warn_bytes`` below a function's
  closed-over arrays, stock's lowering of each new function object warns
  of them: neither tier shares what would skip that warning (tier A's
  lowering, the closure key's entry, its trace lookup, a closure-free
  function's shared object)."""
  arrays = {"numpy": np.ones(1000, np.float32),
            "jax": jnp.ones(1000, jnp.float32) * 2}
  kind = where.split()[0]

  def make():
    w = arrays[kind]
    if where == "numpy global":
      return lambda x: x + _WARNED_GLOBAL
    return lambda x: x + w

  def run():
    with warnings.catch_warnings(record=True) as rec:
      warnings.simplefilter("always")
      outs = [jax.jit(make())(jnp.float32(i)) for i in range(3)]
    return ([np.asarray(o) for o in outs],
            [str(w.message)[:60] for w in rec if "constant" in str(w.message)])

  with jax.captured_constants_warn_bytes(1000) if hasattr(
      jax, "captured_constants_warn_bytes") else _warn_bytes(1000):
    want = stock_off(run)
    assert len(want[1]) == 3
    jcc.enable(closure_key=closure_key)
    for _ in range(2):
      got = run()
      assert got[1] == want[1]
      for g, w in zip(got[0], want[0]):
        np.testing.assert_array_equal(g, w)


@counts_side_effects
@pytest.mark.parametrize("lowered_by", ["update", "context", "block"])
def test_constants_are_warned_of_once_the_threshold_is_lowered(lowered_by):
  """What stock does when ``jax_captured_constants_warn_bytes`` is lowered
  after answers were stored (by ``jax.config.update``, a context manager
  updating it, or the option's own thread-local block): each new object's
  lowering warns of its constants, at every step; so do the cache's."""
  table = np.arange(1000.0, dtype=np.float32)

  def run():
    counts = []
    for step in range(8):
      s = (1.0, 2.0)[step % 2]
      with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with (_warn_bytes(1000) if step >= 3 and lowered_by == "context"
              else _local_warn_bytes(1000)
              if step >= 3 and lowered_by == "block"
              else contextlib.nullcontext()):
          if step == 3 and lowered_by == "update":
            jax.config.update("jax_captured_constants_warn_bytes", 1000)
          out = jax.jit(lambda v: v + table * s)(jnp.ones(1000))
      counts.append((float(out[1]), sum("constants were captured"
                                        in str(w.message) for w in rec)))
    return counts

  saved = jax.config.jax_captured_constants_warn_bytes
  try:
    want = stock_off(run)
    assert [n for _, n in want] == [0, 0, 0, 1, 1, 1, 1, 1]
    jax.config.update("jax_captured_constants_warn_bytes", saved)
    jcc.enable()
    for _ in range(2):
      assert run() == want
      jax.config.update("jax_captured_constants_warn_bytes", saved)
  finally:
    jax.config.update("jax_captured_constants_warn_bytes", saved)


@counts_side_effects
@pytest.mark.parametrize("route", ["jit", "grad", "static", "partial",
                                   "stock_jit"])
def test_a_lowered_threshold_warns_as_stock_on_every_route(route):
  """The same as above through every route a fresh function takes: a
  re-created closure, a ``jax.grad`` of one, a function passed as a static
  argument, a ``functools.partial``, stock's own ``jax.jit`` object of a
  fresh closure (the trace lookup); with the threshold lowered inside a
  block, and back up after it. (An eager loop's stock passes its body's
  constants as operands and warns of none.)"""
  table = np.arange(1000.0, dtype=np.float32)
  apply = jax.jit(lambda f, v: f(v), static_argnums=0)

  def call(s):
    if route == "jit":
      return jax.jit(lambda v: v + table * s)(jnp.ones(1000))
    if route == "grad":
      return jax.jit(jax.grad(lambda v: jnp.sum(v * table * s)))(
          jnp.ones(1000))
    if route == "static":
      return apply(lambda v: v + table * s, jnp.ones(1000))
    if route == "stock_jit":
      return STOCK_JIT(lambda v: v + table * s)(jnp.ones(1000))
    return jax.jit(functools.partial(lambda t, v: v + t * s, table))(
        jnp.ones(1000))

  def run():
    nonlocal apply
    apply = jax.jit(lambda f, v: f(v), static_argnums=0)
    counts = []
    for step in range(10):
      s = (1.0, 2.0)[step % 2]
      with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with (_warn_bytes(1000) if 3 <= step < 7
              else contextlib.nullcontext()):
          out = call(s)
      counts.append((float(out[1]), sum("constants were captured"
                                        in str(w.message) for w in rec)))
    return counts

  want = stock_off(run)
  assert sum(n for _, n in want) >= 4, want
  jcc.enable()
  for _ in range(2):
    assert run() == want


@counts_side_effects
@pytest.mark.parametrize("route", ["closure_free", "closure", "lower"])
def test_a_threshold_of_zero_warns_of_no_constants_as_stock(route):
  """At a threshold of 0 stock's lowering of every new object warns, even
  of no constants at all: an entry, or a closure-free function's canonical
  stock object, made while it was higher answers no new object then."""
  w = jnp.ones(3)

  def call():
    if route == "closure_free":
      return jax.jit(lambda v: v * 2.0)(jnp.ones(3))
    if route == "closure":
      return jax.jit(lambda v: v * w)(jnp.ones(3))
    return jax.jit(lambda v: v * 2.0).lower(jnp.ones(3)).compile()(jnp.ones(3))

  def run():
    counts = []
    for step in range(8):
      with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with _warn_bytes(0) if 3 <= step < 6 else contextlib.nullcontext():
          out = call()
      counts.append((float(out[0]), sum("constants were captured"
                                        in str(x.message) for x in rec)))
    return counts

  want = stock_off(run)
  assert [n for _, n in want] == [0, 0, 0, 1, 1, 1, 0, 0], want
  jcc.enable()
  for _ in range(2):
    assert run() == want


_WARNED_GLOBAL = np.ones(1000, np.float32)


def _local_warn_bytes(n):
  """The option's own block (thread-local), as ``jax.config``'s states are
  context managers."""
  from jax_closure_cache._compat import lowering as compat_lowering
  return compat_lowering.WARN_BYTES(n)


@counts_side_effects
@pytest.mark.parametrize("threshold", [-2, 0])
def test_a_lowered_threshold_warns_each_new_object_and_traces_it_once(
    threshold, capsys):
  """A stored entry, its threshold lowered since (to 0, or to -2: any
  negative value but -1 warns at every lowering): each new object is
  stock's, traced once (its trace-time print once, as stock's), warned of
  once, through a function passed as a static argument (whose trace is not
  replayed from layer two)."""
  table = np.arange(4.0, dtype=np.float32)

  def make(s):
    def f(v, k):
      print("traced", k)
      return v + table * s * k
    return f

  def run():
    counts = []
    for step in range(6):
      with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with (_warn_bytes(threshold) if step >= 3
              else contextlib.nullcontext()):
          out = jax.jit(make((1.0, 2.0)[step % 2]), static_argnums=1)(
              jnp.ones(4), 2)
      counts.append((float(out[1]), sum("constants were captured"
                                        in str(w.message) for w in rec),
                     capsys.readouterr().out.count("traced")))
    return counts

  want = stock_off(run)
  assert [w for _, w, _ in want] == [0, 0, 0, 1, 1, 1], want
  jcc.enable()
  for _ in range(2):
    got = run()
    assert got[3:] == want[3:]
    assert [v for v, _, _ in got] == [v for v, _, _ in want]


@contextlib.contextmanager
def _warn_bytes(n):
  saved = jax.config.jax_captured_constants_warn_bytes
  jax.config.update("jax_captured_constants_warn_bytes", n)
  try:
    yield
  finally:
    jax.config.update("jax_captured_constants_warn_bytes", saved)


def test_outputs_keep_the_sharding_stock_names_on_a_one_device_mesh():
  """pjit names an output's sharding after the first argument's mesh
  sharding it is equivalent to (``P('x')`` on a one-device mesh, where a
  replicated one is equivalent too); a shared lowering's first arguments
  are its constants and changed literals, so tier A does not share where
  an argument or output has a mesh sharding: the spec is stock's."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  x = jax.device_put(jnp.ones(4), NamedSharding(mesh, PartitionSpec("x")))

  def run():
    outs = []
    for v in (1.0, 2.0, 3.0):
      w = jnp.full(4, v)
      outs.append(jax.jit(lambda a: a * v)(x))
      outs.append(jax.jit(lambda a: a * w)(x))
    return [(o.sharding, np.asarray(o).tobytes()) for o in outs]

  want = stock_off(run)
  jcc.enable(closure_key=False)
  for _ in range(2):
    assert run() == want



@needs_trace_lookup
def test_remat3_checkpoints_are_keyed_by_their_state():
  """Under ``jax_remat3`` a checkpoint is a hijax primitive object per
  trace (``VJPHiPrimitive`` on jax 0.10, ``HiPrim`` on 0.11), keyed by
  its class and whole state, never by its own ``__eq__`` (which compares
  the jaxpr it holds by identity): the trace lookup's shared answers and
  tier A's lowerings of re-created checkpointed closures are stock's in
  verify mode, where a key by ``__eq__`` made every shared trace a
  mismatch."""
  saved = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  try:
    def step(i):
      x = jnp.full((5,), float(i + 1))

      @functools.partial(jax.checkpoint,
                         policy=jax.checkpoint_policies.checkpoint_dots)
      def f(w):
        return jax.lax.cond(x.sum() > 0, lambda x: jnp.sin(jnp.dot(x, w)),
                            lambda x: x, x)
      w = jnp.ones((5, 5))
      return [np.asarray(STOCK_JIT(f)(w)),
              np.asarray(STOCK_JIT(jax.grad(lambda w: f(w).sum()))(w))]

    want = stock_off(lambda: [step(i % 3) for i in range(6)])
    jcc.enable(verify=True)
    got = [step(i % 3) for i in range(6)]
    for g, w in zip(got, want):
      for a, b in zip(g, w):
        np.testing.assert_array_equal(a, b)
    stats = jcc.stats()
    assert stats["shared_traces"] > 0 and stats["verified"] > 0
    assert stats["verify_mismatches"] == 0
  finally:
    jax.config.update("jax_remat3", saved)


@needs_trace_lookup
@counts_side_effects
@pytest.mark.skipif(not hasattr(jax.config, "jax_custom_vjp3"),
                    reason="a release without hijax custom_vjp")
def test_hijax_custom_vjp_rules_run_as_stock_and_verify_agrees():
  """Under ``jax_custom_vjp3`` a ``custom_vjp`` application is a hijax
  primitive holding its primal function's ``stages.Traced``, a fwd wrapper
  made by the trace and the user's ``bwd``. JAX runs those rules when it
  differentiates a trace holding the primitive, so such a trace is never
  shared: a re-made ``custom_vjp`` whose ``bwd`` logs at trace time logs
  to its own list, as stock's does (a shared trace ran the first object's
  ``bwd``), and verify mode has no shared trace to report (it reported
  every shared checkpoint of one ``custom_vjp`` as a mismatch, reading
  the per-trace wrapper by identity)."""
  saved = jax.config.jax_remat3, jax.config.jax_custom_vjp3
  jax.config.update("jax_remat3", True)
  jax.config.update("jax_custom_vjp3", True)
  try:
    def rules(scale, log):
      sin = jax.custom_vjp(lambda _, x: scale * jnp.sin(x),
                           nondiff_argnums=(0,))

      def fwd(_, x):
        return scale * jnp.sin(x), checkpoint_name(jnp.cos(x), "cos")

      def bwd(_, cos_x, g):
        log.append(scale)   # a trace-time write: each object's own list
        return (scale * cos_x * g,)
      sin.defvjp(fwd, bwd)
      return sin

    shared = rules(1.0, [])

    def step(i):
      policy = jax.checkpoint_policies.save_only_these_names("cos")
      x = jnp.arange(3.0) + i
      log = []
      out = []
      for sin in (shared, rules(float(i % 2 + 2), log)):
        f = jax.remat(functools.partial(sin, "hi"), policy=policy)
        y, f_vjp = jax.vjp(f, x)
        out += [np.asarray(y), np.asarray(f_vjp(jnp.ones(3))[0]),
                np.asarray(jax.grad(STOCK_JIT(lambda v: f(v).sum()))(x))]
      return out, log

    want = stock_off(lambda: [step(i % 2) for i in range(6)])
    for verify in (False, True):   # the logs, then verify's comparison
      jcc.disable()
      jcc.enable(verify=verify)
      got = [step(i % 2) for i in range(6)]
      for (g, g_log), (w, w_log) in zip(got, want):
        assert verify or g_log == w_log
        for a, b in zip(g, w):
          np.testing.assert_array_equal(a, b)
    assert jcc.stats()["verify_mismatches"] == 0
  finally:
    jax.config.update("jax_remat3", saved[0])
    jax.config.update("jax_custom_vjp3", saved[1])


def test_a_class_given_jaxs_module_name_is_not_taken_for_jaxs():
  """Which parameter values are jax's own (kept by value, never searched
  for the user's callables) is decided by where the class is defined: a
  user class whose ``__module__`` names a module of jax's is the user's;
  jax's own classes, C types and Python classes alike, are jax's."""
  from jax._src import core
  from jax_closure_cache._compat import lowering as _compat

  class Spoofed:
    pass
  Spoofed.__module__ = "jax._src.core"
  assert not _compat.defined_by_jax(Spoofed)
  for cls in (core.ShapedArray, jax.sharding.NamedSharding, jax.Array,
              type(jnp.ones(1)), type(jax.devices()[0])):
    assert _compat.defined_by_jax(cls), cls


def _momentum_step(batch, lr, beta, mask, floor):
  """A training step re-made per call, closing over a batch (large: an
  argument of the shared executable) and over small constants stock's
  module computes with by value: jax scalars chained with the gradient
  (``(1 - beta) * g``, ``lr * m``), a mask, a floor of zeros or NaN."""
  def loss(p):
    return jnp.sum((p * batch - 1.0) ** 2)

  @jax.jit
  def update(p, m):
    g = jnp.where(mask, jax.grad(loss)(p), 0.0)
    m = beta * m + (1 - beta) * g
    return jnp.maximum(p - lr * m, floor), m
  return update


def test_small_constants_stock_reads_by_value_are_baked_and_keyed_by_bytes():
  """Tier A bakes a small constant stock's module computes with by value
  (as stock bakes it) and keys the lowering by its bytes, where it refused
  such a call before: a training step over jax-scalar hyperparameters
  compiles once for a run of steps, bit for bit stock's; a schedule that
  changes a baked scalar each step, a NumPy constant changed in place and
  a NaN or zeros floor are each stock's too."""
  rng = np.random.default_rng(5)
  batches = [jnp.asarray(rng.standard_normal(256), jnp.float32)
             for _ in range(6)]
  mask = jnp.asarray(np.arange(256) % 3 != 0)
  floors = {"zeros": jnp.zeros(4), "nan": jnp.asarray([jnp.nan] * 4)}
  host = np.array([0.9], np.float32)   # (read at each call's trace)

  def run(schedule=False, floor="zeros"):
    p, m, out = jnp.linspace(-1.0, 1.0, 256), jnp.zeros(256), []
    for i, batch in enumerate(batches):
      lr = jnp.float32(0.05 / (i + 1) if schedule else 0.05)
      host[0] = 0.9 if i < 3 else 0.8
      beta = jnp.asarray(host[0])
      step = _momentum_step(batch, lr, beta, mask,
                            floors[floor][:1].reshape(()))
      p, m = step(p, m)
      out.append(_bits((p, m)))
    return out

  for args in ((False, "zeros"), (True, "zeros"), (False, "nan")):
    want = stock_off(run, *args)
    jcc.clear()
    jcc.enable(closure_key=False, verify=True)
    with jtu.count_jit_compilation_cache_miss() as compiles:
      got = run(*args)
    stats = tier_a_stats()
    jcc.disable()
    assert got == want, args
    assert jcc.stats()["verify_mismatches"] == 0
    assert not any("by its value" in r for r in stats["refused"]), stats
    # two values of beta: two executables, each met twice (the first
    # meeting is stock's lowering), of stock's six
    assert stats["baked"] == 2 and stats["hits"] == 2, (args, stats)
    assert compiles() == 4, args
  replay_in_both_modes(run, clear=True)


def _bits(tree):
  return [(a.dtype, a.weak_type, np.asarray(a).tobytes())
          for a in jax.tree_util.tree_leaves(tree)]
