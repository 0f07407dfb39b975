"""The contract's safety rules: what is lifted, what is baked, what falls back,
and that no cache hit ever returns a stale or wrong result."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache.key import closure
from conftest import warm, STOCK_JIT, Unkeyable, assert_like_stock, counting
import helper_module


def test_numpy_is_baked_by_default_and_keyed_by_bytes():
  def make(w):
    return lambda x: x + np.sum(w - 1e8)   # numpy at trace time, in float64
  x = jnp.zeros(2)
  w = np.full(3, 1e8 + 0.5)
  np.testing.assert_array_equal(jcc.jit(make(w))(x), STOCK_JIT(make(w))(x))
  jcc.jit(make(w))(x)   # the second object compiles the shared entry
  with counting() as c:
    jcc.jit(make(w.copy()))(x)   # equal bytes, other object: a hit
  assert c["compiles"] == 0
  w2 = np.full(3, 1e8 + 2.5)
  assert_like_stock(jcc.jit(make(w2))(x), make(w2), x)


def test_lift_numpy_opt_in_avoids_recompiles():
  def make(w):
    return lambda x: x @ w
  x = jnp.ones(3, dtype=jnp.float32)
  w1, w2 = np.eye(3, dtype=np.float32), 2 * np.eye(3, dtype=np.float32)
  warm(lambda: jcc.jit(make(w1), lift_numpy=True)(x))
  with counting() as c:
    out = jcc.jit(make(w2), lift_numpy=True)(x)
  assert c["compiles"] == 0
  np.testing.assert_array_equal(out, STOCK_JIT(make(w2))(x))


def test_committed_array_keeps_stock_placement():
  dev = jax.devices()[0]
  def make(w):
    return lambda x: x + w
  x = jnp.ones(2)
  w = jax.device_put(jnp.full(2, 3.0), dev)
  got, want = jcc.jit(make(w))(x), STOCK_JIT(make(w))(x)
  assert got.committed == want.committed
  np.testing.assert_array_equal(got, want)
  w2 = jax.device_put(jnp.full(2, 4.0), dev)   # identity-keyed: a new entry
  assert_like_stock(jcc.jit(make(w2))(x), make(w2), x)


class EqOnlyConfig:
  """Defines __eq__ alone, so it is unhashable, as many config classes are."""

  def __init__(self, depth, act):
    self.depth, self.act = depth, act

  def __eq__(self, other):
    return vars(self) == vars(other)


def test_plain_object_keyed_by_attributes():
  def make(cfg):
    def f(x):
      for _ in range(cfg.depth):
        x = x * 2 if cfg.act == "double" else x + 1
      return x
    return f
  x = jnp.ones(2)
  warm(lambda: jcc.jit(make(EqOnlyConfig(2, "double")))(x))
  with counting() as c:
    out = jcc.jit(make(EqOnlyConfig(2, "double")))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make(EqOnlyConfig(2, "double")), x)
  cfg = EqOnlyConfig(3, "add")
  assert_like_stock(jcc.jit(make(cfg))(x), make(cfg), x)


class Model:
  def __init__(self, params):
    self.params = params

  def make_step(self):
    def step(x):
      return jnp.tanh(x @ self.params["w"])
    return step


def test_model_params_reassigned_uses_new_weights():
  x = jnp.ones((2, 2))
  model = Model({"w": jnp.eye(2)})
  assert_like_stock(jcc.jit(model.make_step())(x), model.make_step(), x)
  model.params = {"w": 3 * jnp.eye(2)}
  assert_like_stock(jcc.jit(model.make_step())(x), model.make_step(), x)
  np.testing.assert_allclose(jcc.jit(model.make_step())(x), jnp.tanh(3 * x))


class BigModel:
  """More attributes than the object budget: it could only be kept by
  identity, where a change to ``a0`` would go unseen."""

  def __init__(self, w):
    for i in range(closure.OBJECT_VALUES_BUDGET + 1):
      setattr(self, f"a{i}", i + 1)
    self.w = w

  def make_step(self):
    return lambda x: x @ self.w * self.a0


def test_an_object_past_the_budget_is_stocks():
  """Fresh closures over an object too large to key by its attributes are
  stock's (fallback ``object_budget``): a change to an array or a scalar
  attribute is seen, as stock sees it, replayed."""
  x = jnp.ones(2)
  m = BigModel(jnp.eye(2))
  for _ in range(2):
    for step in range(4):
      if step == 2:
        m.w = 2 * jnp.eye(2)
      if step == 3:
        m.a0 = 5
      assert_like_stock(jcc.jit(m.make_step())(x), m.make_step(), x)
    np.testing.assert_array_equal(jcc.jit(m.make_step())(x), 10 * x)
    m.w, m.a0 = jnp.eye(2), 1
  assert jcc.stats()["entries"] == 0
  assert jcc.stats()["fallback_reasons"]["object_budget"] >= 8


def test_guard_catches_helper_global_array():
  x = jnp.ones(2)
  helper_module.W = jnp.full(2, 1.0)
  w5 = jnp.full(2, 5.0)
  def make(s):
    return lambda x: helper_module.scaled_by_w(x) * s
  assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)
  helper_module.W = w5
  assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)
  helper_module.W = jnp.full(2, 1.0)


def test_tracer_in_closure_falls_back():
  def outer(w):
    inner = jcc.jit(lambda x: x * w)
    return jnp.sum(inner(jnp.ones(2)))
  assert jax.grad(outer)(3.0) == 2.0
  assert jcc.stats()["fallback_reasons"].get("tracer", 0) >= 1


def test_sets_key_by_contents():
  def make(s):
    return lambda x: x + len(s)
  x = jnp.ones(2)
  warm(lambda: jcc.jit(make({1, 2}))(x))
  with counting() as c:
    out = jcc.jit(make({2, 1}))(x)
  assert c["compiles"] == 0
  assert_like_stock(out, make({2, 1}), x)
  assert_like_stock(jcc.jit(make({1, 2, 3}))(x), make({1, 2, 3}), x)


def test_unhashable_non_pytree_falls_back():
  s = Unkeyable(2)
  fun = lambda x: x + s.n
  assert_like_stock(jcc.jit(fun)(jnp.ones(2)), fun, jnp.ones(2))
  assert jcc.stats()["fallback_reasons"] == {"unhashable": 1}


def test_concrete_use_of_lifted_array_retries_stock_once():
  def make(n):
    return lambda x: x[:n]   # n must be concrete: lifted, it is a tracer
  x = jnp.arange(5.0)
  n = jnp.array(3)
  assert_like_stock(jcc.jit(make(n))(x), make(n), x)   # stock's object
  assert jcc.stats()["fallback_reasons"] == {}
  assert_like_stock(jcc.jit(make(n))(x), make(n), x)   # lifting fails
  assert jcc.stats()["fallback_reasons"] == {"trace_error": 1}
  with counting() as c:
    jcc.jit(make(n))(x)
  assert jcc.stats()["fallback_reasons"] == {"trace_error": 1, "unliftable": 1}


def test_user_error_is_stock_error():
  def make(w):
    def f(x):
      raise ValueError(f"bad input {x.shape}")
    return f
  with pytest.raises(ValueError) as stock_err:
    STOCK_JIT(make(jnp.ones(2)))(jnp.ones(3))
  with pytest.raises(ValueError) as ours:
    jcc.jit(make(jnp.ones(2)))(jnp.ones(3))
  assert str(ours.value) == str(stock_err.value)


def test_disable_jit_is_honoured():
  seen = []
  def make(w):
    def f(x):
      seen.append(type(x))
      return x + w
    return f
  with jax.disable_jit():
    out = jcc.jit(make(jnp.ones(2)))(jnp.ones(2))
    jcc.jit(make(jnp.ones(2)))(jnp.ones(2))
  assert len(seen) == 2 and not issubclass(seen[0], jax.core.Tracer)
  np.testing.assert_array_equal(out, jnp.full(2, 2.0))
  # with a shared entry stored, a fresh closure still runs eagerly
  warm(lambda: jcc.jit(make(jnp.ones(2)))(jnp.ones(2)))
  seen.clear()
  w5 = jnp.full(2, 5.0)
  with jax.disable_jit():
    out = jcc.jit(make(w5))(jnp.ones(2))
  assert seen and not any(issubclass(t, jax.core.Tracer) for t in seen)
  np.testing.assert_array_equal(out, jnp.full(2, 6.0))


def test_no_closed_over_array_is_kept_alive():
  x = jnp.ones(4)
  refs = []
  for i in range(4):
    w = jnp.full(4, i + 2.0)   # (not 0 or 1: x * 1 is folded by stock)
    refs.append(weakref.ref(w))
    jcc.jit((lambda w: (lambda x: x * w))(w))(x)
    del w
  gc.collect()
  assert jcc.stats()["hits"] == 2
  assert all(r() is None for r in refs)


def test_lru_capacity_bounds_entries():
  old = jcc.capacity()
  jcc.set_capacity(2)
  try:
    for s in range(5):
      jcc.jit((lambda s: (lambda x: x + s))(s))(jnp.ones(1))
    assert jcc.stats()["entries"] <= 2
  finally:
    jcc.set_capacity(old)
  with pytest.raises(ValueError):
    jcc.set_capacity(0)


def test_key_ignoring_contents_would_fail():
  # The guard against a key that ignores contents: same code, other values.
  make = lambda a: (lambda x: x * a)
  for a in (jnp.full(1, 2.0), jnp.full(1, 3.0)):
    assert_like_stock(jcc.jit(make(a))(jnp.ones(1)), make(a), jnp.ones(1))


def test_guard_on_helper_function_global_hits_then_sees_reassignment():
  from helper_module import scaled_by_w
  x = jnp.ones(2)
  # (arrays of several values: one of one value is stock's in a chain)
  w1, w5 = jnp.asarray([1.5, 1.75]), jnp.asarray([5.0, 5.25])
  helper_module.W = w1
  def make(s):
    return lambda x: scaled_by_w(x) * s
  assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)
  assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)
  with counting() as c:
    jcc.jit(make(1.0))(x)
  assert c["compiles"] == 0 and jcc.stats()["hits"] == 1
  helper_module.W = w5
  assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)
  helper_module.W = w1


import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class FrozenCfg:
  scale: float


class Mode(enum.Enum):
  ADD = 1
  MUL = 2


def test_value_hashed_objects_key_by_hash_and_equality():
  def make(cfg, mode):
    return lambda x: x + cfg.scale if mode is Mode.ADD else x * cfg.scale
  x = jnp.ones(2)
  warm(lambda: jcc.jit(make(FrozenCfg(2.0), Mode.MUL))(x))
  with counting() as c:
    out = jcc.jit(make(FrozenCfg(2.0), Mode.MUL))(x)   # equal, not identical
  assert c["compiles"] == 0
  assert_like_stock(out, make(FrozenCfg(2.0), Mode.MUL), x)
  for cfg, mode in [(FrozenCfg(3.0), Mode.MUL), (FrozenCfg(2.0), Mode.ADD)]:
    assert_like_stock(jcc.jit(make(cfg, mode))(x), make(cfg, mode), x)


def test_tracer_behind_identity_kept_object_is_never_stored():
  holder = BigModel(None)   # past the budget: kept by identity
  def outer(w):
    holder.w = w            # a tracer, reachable only through the object
    return jnp.sum(jcc.jit(holder.make_step())(jnp.ones(2)))
  g1 = jax.grad(outer)(jnp.eye(2))
  g2 = jax.grad(outer)(2 * jnp.eye(2))   # a later trace: no stale tracer
  np.testing.assert_array_equal(g1, g2)
  np.testing.assert_array_equal(g1, jnp.ones((2, 2)))
  assert jcc.stats()["entries"] == 0
  assert jcc.stats()["fallback_reasons"].get("object_budget", 0) >= 1


@pytest.mark.parametrize("use", [
    lambda x, n: x * bool(n),
    lambda x, n: x * int(n),
    lambda x, n: x * n.item(),
    lambda x, n: x + np.asarray(n),
    lambda x, n: x[:n],
], ids=["bool", "int", "item", "np.asarray", "slice"])
def test_concrete_uses_of_lifted_arrays_give_stock_results(use):
  def make(n):
    return lambda x: use(x, n)
  x = jnp.arange(5.0)
  n = jnp.array(3)
  for _ in range(2):   # the first object is stock's; the second lifts
    assert_like_stock(jcc.jit(make(n))(x), make(n), x)
  # The parametrised cases share make's code object: after the first, the
  # code is remembered as unliftable and goes to stock directly.
  reasons = jcc.stats()["fallback_reasons"]
  assert sum(reasons.values()) == 1 and set(reasons) <= {"trace_error", "unliftable"}


def test_lift_numpy_from_environment():
  import subprocess, sys, os
  code = ("import numpy as np, jax.numpy as jnp, jax_closure_cache as j\n"
          "from jax._src import test_util as jtu\n"
          "mk = lambda w: (lambda x: x @ w)\n"
          "x = jnp.ones(2)\n"
          "a, b = np.eye(2, dtype=np.float32), 2 * np.eye(2, dtype=np.float32)\n"
          "j.jit(mk(a))(x); j.jit(mk(a))(x)\n"
          "with jtu.count_jit_compilation_cache_miss() as c:\n"
          "  out = j.jit(mk(b))(x)\n"
          "print(c(), float(out[0]))\n")
  env = dict(os.environ, JAX_CLOSURE_CACHE_LIFT_NUMPY="1")
  out = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.stdout.split() == ["0", "2.0"], out.stderr


def test_flag_reset_between_calls_does_not_retrace_like_stock():
  effect = [False]

  def loop(x):
    effect[0] = True   # a trace-time side effect on closure state
    return x + 1
  f = jcc.jit(loop)
  f(jnp.ones(2))
  assert effect[0]
  effect[0] = False
  x3 = 3 * jnp.ones(2)   # same type as before: a new value, not a signature
  f(jnp.ones(2))
  f(x3)
  assert not effect[0]   # stock never retraces this function object


def test_state_a_trace_left_is_not_shared_with_fresh_closures():
  def make(start):
    c = [start]
    def f(x):
      c[0] += 1   # the trace reads, then bumps, closure state
      return x * c[0]
    return f
  x = jnp.ones(2)
  assert_like_stock(jcc.jit(make(1))(x), make(1), x)   # traced from [1], left [2]
  # A fresh closure that starts at [2] must not reuse the [1] trace.
  assert_like_stock(jcc.jit(make(2))(x), make(2), x)
