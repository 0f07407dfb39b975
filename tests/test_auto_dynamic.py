"""Auto-dynamic Python scalars (an opt-in): a closed-over (or global) int or float that
keeps changing is passed as a weakly typed argument after its first change,
so a schedule compiles at most twice in all; a value needed concretely stays
static. Results are compared with stock jax.jit on a fresh function object
(dtypes and weak types exactly, values to the last ulp allowed by README
rule 2); a key that ignored the value would give a previous step's answer."""

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_closure_cache as jcc
import pytest
from conftest import assert_like_stock, counting, stock_off


@pytest.fixture(autouse=True)
def auto_dynamic_on():
  """Auto-dynamic scalars are an opt-in (tier A shares the executable of a
  changing float by default); this module tests the opt-in. The conftest
  fixture restores the default after each test."""
  from jax_closure_cache.front import options as jit_options
  jit_options.set_auto_dynamic_default(True)


def schedule(steps):
  return [0.1 * 0.9 ** step for step in range(steps)]


def test_learning_rate_schedule_compiles_at_most_twice():
  x = jnp.linspace(-1.0, 1.0, 4)
  make = lambda lr: (lambda p: p - lr * jnp.tanh(p))
  with counting() as c:
    outs = [jcc.jit(make(lr))(x) for lr in schedule(12)]
  assert c["compiles"] <= 2
  for lr, out in zip(schedule(12), outs):
    assert_like_stock(out, make(lr), x, rtol=1e-6)
  assert jcc.stats()["hits"] == 10


def test_global_schedule_of_a_closure_free_function():
  ns = {"jnp": jnp}
  exec("def step(p):\n  return p - LR * jnp.tanh(p)\n", ns)
  x = jnp.linspace(-1.0, 1.0, 4)
  fresh = lambda: type(ns["step"])(ns["step"].__code__, ns)
  outs = []
  with counting() as c:
    for lr in schedule(10):
      ns["LR"] = lr
      outs.append(jcc.jit(fresh())(x))
  assert c["compiles"] <= 2
  for lr, out in zip(schedule(10), outs):
    ns["LR"] = lr
    assert_like_stock(out, fresh(), x, rtol=1e-6)


def test_int_counter_keeps_weak_int_semantics():
  x = jnp.arange(3, dtype=jnp.int32)
  make = lambda k: (lambda v: v + k)
  with counting() as c:
    outs = [jcc.jit(make(k))(x) for k in range(6)]
  assert c["compiles"] <= 2
  for k, out in enumerate(outs):
    assert_like_stock(out, make(k), x)   # int32, weak type as stock


def test_bool_is_never_dynamic():
  x = jnp.ones(2)
  make = lambda b: (lambda v: v * 2 if b else v)
  for b in (True, False, True, False):
    assert_like_stock(jcc.jit(make(b))(x), make(b), x)


def test_concrete_use_stays_static_with_stock_results(monkeypatch, caplog):
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  x = jnp.ones(3)
  make = lambda n: (lambda p: p * jnp.arange(n).sum())
  for n in (2, 3, 4, 5, 4):
    assert_like_stock(jcc.jit(make(n))(x), make(n), x)
  # verification (one, before anything compiles) keeps n static: no lifted
  # trace fails, so no stock retry is needed; 3, 4 and 5, each a key met
  # once, are stock's (4, met again, compiles its entry)
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 3}
  assert jcc.stats()["misses"] == 2
  assert jcc.stats()["auto_dynamic"]["verifications"] == 1
  text = " ".join(r.getMessage() for r in caplog.records)
  assert "it stays static (keyed by value)" in text
  assert "ConcretizationTypeError" in text


def test_a_key_met_once_is_compared_with_by_the_next_miss():
  """A key met once (stock's) is the state the next miss of its code is
  compared with: after a static cell changed, a float that then changes
  becomes dynamic, one executable for every later value."""
  x = jnp.ones(3)

  def make(tag, s):
    return lambda v: v * s if tag == "a" else v - s
  seq = [("a", 1.0), ("b", 1.0)] + [("b", float(i)) for i in range(2, 8)]
  compiles = []
  for tag, s in seq:
    with counting() as c:
      out = jcc.jit(make(tag, s))(x)
    compiles.append(c["compiles"])
    assert_like_stock(out, make(tag, s), x)
  # ("a", 1.0) is the first object's; ("b", 1.0) a key met once; 2.0
  # differs from it in s alone: verified, one shared entry from then on
  assert compiles == [1, 1, 1, 0, 0, 0, 0, 0]
  assert jcc.stats()["auto_dynamic"]["verified"] == 1
  assert jcc.stats()["fallback_reasons"] == {"key_met_once": 1}


def test_auto_dynamic_off_keys_scalars_by_value():
  x = jnp.ones(2)
  make = lambda s: jcc.jit(lambda v: v * s, auto_dynamic=False)
  for s in (1.0, 2.0, 3.0):
    make(s)(x)
  with counting() as c:
    out = make(4.0)(x)
  assert c["compiles"] == 1
  np.testing.assert_array_equal(out, jnp.full(2, 4.0))


def test_auto_dynamic_off_from_environment():
  code = ("import jax.numpy as jnp, jax_closure_cache as j\n"
          "from jax._src import test_util as jtu\n"
          "x = jnp.ones(2)\n"
          "with jtu.count_jit_compilation_cache_miss() as c:\n"
          "  for s in (1.0, 2.0, 3.0, 4.0):\n"
          "    j.jit((lambda s: (lambda v: v * s))(s))(x)\n"
          "  n = c()\n"
          "print(n)\n")
  env = dict(os.environ, JAX_CLOSURE_CACHE_AUTO_DYNAMIC="0")
  out = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert int(out.stdout.split()[-1]) == 4


def test_enable_auto_dynamic_false_and_enabled_restores():
  from jax_closure_cache.front import options as jit_options
  assert jit_options.auto_dynamic_default() is True   # this module's opt-in
  with jcc.enabled(auto_dynamic=False):
    assert jit_options.auto_dynamic_default() is False
  assert jit_options.auto_dynamic_default() is True


def test_auto_dynamic_is_an_opt_in():
  from jax_closure_cache import settings
  assert settings.AUTO_DYNAMIC.default is False


def test_a_cell_the_function_assigns_is_never_dynamic():
  """JAX's test_rank_promotion_forces_retrace: a function re-created in a
  loop assigns its nonlocal trace counter, which the user resets between
  objects. The assignment must reach the user's cell, so the counter is
  keyed by value, never passed as an argument."""
  num_traces = 0
  for i in range(3):
    num_traces = 0

    @jcc.jit
    def f(x):
      nonlocal num_traces
      num_traces += 1
      return x + x
    x = jnp.zeros((2, 2))
    f(x)
    # a function assigning a closed-over variable has no closure key: each
    # object traces as stock's and bumps the user's cell once
    # (docs/contract.md, rule 12)
    assert num_traces == 1
    f(x)
    assert num_traces == 1


def test_a_counter_the_trace_bumps_never_becomes_dynamic():
  """JAX's test_dot_precision_forces_retrace: the body bumps a nonlocal
  counter at trace time. The counter changes between calls because of the
  trace (a miss's or a hit's), not the user, so it stays static and every
  retrace (here forced by matmul-precision contexts) reaches the user's own
  cell, as with stock."""
  n = 0

  def g(x):
    nonlocal n
    n += 1
    return jnp.dot(x, x)
  f = lambda x: jcc.lax.cond(True, g, g, x)
  x = jnp.zeros((2, 2))
  f(x)
  f(x)
  assert n == 1
  with jax.default_matmul_precision("tensorfloat32"):
    f(x)   # a hit that traces again
    f(x)
  assert n == 2
  with jax.default_matmul_precision("float32"):
    f(x)   # a new context traces again, reaching the user's n
  assert n == 3


# -- verification (issue 19): traces that would compute something else -------

def _stock(fun, *args):
  """Stock jit of ``fun`` with the cache off."""
  return stock_off(lambda: jax.jit(fun)(*args))


def _exactly(got, want):
  assert got.dtype == want.dtype and got.weak_type == want.weak_type
  np.testing.assert_array_equal(got, want)


def test_a_type_test_on_the_scalar_keeps_it_static():
  """``isinstance(n, int)`` is False for a tracer: traced as an argument
  the function would divide where stock multiplies."""
  jcc.enable()
  x = jnp.arange(3.0) + 0.5
  for _ in range(2):
    for n in (1, 2, 3, 4):
      f = lambda v: v * n if isinstance(n, int) else v / n
      _exactly(jax.jit(f)(x), _stock(f, x))
  assert jcc.stats()["auto_dynamic"]["rejected"] >= 1


def test_integer_pow_stays_integer_pow():
  """``x ** n`` is ``integer_pow`` for a Python int and ``pow`` for a tracer:
  results must be stock's bit for bit."""
  jcc.enable()
  x = jnp.arange(3.0) + 0.5
  for _ in range(2):
    for n in (1, 2, 3, 4):
      f = lambda v: (v - 2.3) ** n
      _exactly(jax.jit(f)(x), _stock(f, x))


def test_fori_loop_bound_keeps_stock_gradients():
  """A Python-int ``fori_loop`` bound lowers to ``scan`` (reverse-mode
  works); a traced one to ``while_loop`` (it raises). The gradient of a
  re-created closure over the bound is stock's."""
  jcc.enable()
  x = jnp.arange(3.0) + 0.5
  for n in (1, 2, 3, 4, 3):
    def f(v):
      return jax.lax.fori_loop(0, n, lambda i, c: c * 1.5, v).sum()
    got = jax.grad(jax.jit(f))(x)
    jcc.disable()
    want = jax.grad(jax.jit(f))(x)
    jcc.enable()
    _exactly(got, want)


def test_mask_is_applied_only_to_its_own_structure():
  """A config tuple with an optional member: position 3 is a dict's float
  in one structure and a tuple's int in another; replayed, every value is
  stock's (a mask by position would serve ``b = 1.0`` the result of 2.0)."""
  jcc.enable()
  x = jnp.arange(3.0)
  w = jnp.ones(3)

  def make(cfg):
    def f(v):
      w, b, act, extra, ks = cfg
      y = (jnp.tanh if act == "tanh" else jnp.sin)(v * w + b)
      if extra is not None:
        y = y + extra["z"] * extra["k"]
      for k in ks:
        y = y + k
      return y
    return f
  z = jnp.full(3, 0.5)
  seq = [(w, 2.0, "tanh", None, (1, 2)), (w, 1.0, "tanh", None, (1, 2)),
         (w, 1.0, "sin", {"z": z, "k": 2.0}, (1, 2)),
         (w, 1.0, "sin", {"z": z, "k": -2.0}, (1, 2)),
         (w, 1.0, "sin", None, (1, 5)), (w, 2.0, "sin", None, (1, 2))]
  for _ in range(2):
    for cfg in seq:
      np.testing.assert_allclose(jax.jit(make(cfg))(x), _stock(make(cfg), x),
                                 rtol=1e-6)


def test_a_function_reached_through_two_paths_reads_one_value():
  jcc.enable()

  def make(w, c):
    inner = lambda y: y * w + c
    mid = lambda y: inner(y) * 2.0
    return lambda v: mid(v) + inner(v)
  seq = [(jnp.ones(3), 1.0), (jnp.arange(3.0), 1.0), (jnp.ones(3), 2.0),
         (jnp.ones(4), 1.0)]
  for _ in range(2):
    for w, c in seq:
      x = jnp.ones(w.shape)
      _exactly(jax.jit(make(w, c))(x), _stock(make(w, c), x))


def test_schedules_still_compile_at_most_twice():
  """Verified once, then one executable: ``v - lr * v ** 2`` and
  ``v * (lr * 0.5)`` (Python folds ``lr * 0.5`` at trace time, which the
  verification accounts for), a temperature and a step counter."""
  jcc.enable()
  x = jnp.linspace(-1.0, 1.0, 4)
  forms = [lambda lr: (lambda v: v - lr * v ** 2),
           lambda lr: (lambda v: v * (lr * 0.5)),
           lambda t: (lambda v: jax.nn.softmax(v / t)),
           lambda k: (lambda v: v + k)]
  for form in forms:
    values = (schedule(12) if form is not forms[3] else list(range(12)))
    with counting() as c:
      outs = [jax.jit(form(v))(x) for v in values]
    assert c["compiles"] <= 2, (form, c)
    for v, out in zip(values, outs):
      assert_like_stock(out, form(v), x, rtol=1e-6)
  assert jcc.stats()["auto_dynamic"]["verifications"] == 4
