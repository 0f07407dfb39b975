"""Never stale for a fresh function: a hit only where a retrace would read
the same values, including attribute chains the code reads from modules and
classes and the globals read by the module-level helpers it reaches.

Each case re-creates the function, changes what it reads, and compares with
stock jax.jit on a fresh object (cache off); a key that ignored the value
would return the previous answer and fail."""

import jax
import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
import helper_module
from helper_module import scaled, twice_scaled
from conftest import assert_like_stock, counting


class Table:
  W = jnp.full(2, 2.0)
  scale = 2.0


class Cfg:
  table = {"scale": 2.0}


def _restore(module, name):
  value = getattr(module, name)
  return lambda: setattr(module, name, value)


from jax._src import api as _jax_api   # noqa: E402  (its globals, patched)

_ORIGINAL_VJP = _jax_api.vjp


def _doubled_vjp(*args, **kwargs):
  """jax's vjp with every cotangent doubled: a replacement of a global that
  jax's own grad reads (a test's monkeypatch)."""
  out = _ORIGINAL_VJP(*args, **kwargs)
  pullback = out[1]
  return (out[0], lambda ct: tuple(2.0 * g for g in pullback(ct)), *out[2:])


CASES = {
    "class attribute array": (lambda: (lambda v: v * Table.W),
                              lambda: setattr(Table, "W", jnp.full(2, 5.0)),
                              _restore(Table, "W")),
    "class attribute float": (lambda: (lambda v: v * Table.scale),
                              lambda: setattr(Table, "scale", 3.0),
                              _restore(Table, "scale")),
    "dict on a class, mutated": (
        lambda: (lambda v: v * Cfg.table["scale"]),
        lambda: Cfg.table.__setitem__("scale", 3.0),
        lambda: Cfg.table.__setitem__("scale", 2.0)),
    "module attribute array": (lambda: (lambda v: v * helper_module.W),
                               lambda: setattr(helper_module, "W", jnp.full(2, 7.0)),
                               _restore(helper_module, "W")),
    "helper's global": (lambda: (lambda v: scaled(v) + 1.0),
                        lambda: setattr(helper_module, "SCALE", 3.0),
                        _restore(helper_module, "SCALE")),
    "helper of a helper": (lambda: (lambda v: twice_scaled(v) + 1.0),
                           lambda: setattr(helper_module, "SCALE", 4.0),
                           _restore(helper_module, "SCALE")),
    "helper through the module": (
        lambda: (lambda v: helper_module.scaled(v) + 1.0),
        lambda: setattr(helper_module, "SCALE", 5.0),
        _restore(helper_module, "SCALE")),
    # a global of jax's own code (kept by identity, not walked) replaced
    "jax's own global, replaced": (
        lambda: jax.grad(lambda v: jnp.sum(v * v * Table.scale)),
        lambda: setattr(_jax_api, "vjp", _doubled_vjp),
        lambda: setattr(_jax_api, "vjp", _ORIGINAL_VJP)),
}


@pytest.mark.parametrize("case", CASES)
def test_recreated_function_sees_what_changed(case):
  make, change, restore = CASES[case]
  x = jnp.ones(2)
  try:
    for _ in range(3):   # stock's object, the shared entry, a hit
      assert_like_stock(jcc.jit(make())(x), make(), x)
    change()
    assert_like_stock(jcc.jit(make())(x), make(), x)
    assert_like_stock(jcc.jit(make())(x), make(), x)
    # back as it was: the first entry's again (a module's dict has changed
    # twice since its checks last held, and holds what they compare with)
    restore()
    for _ in range(2):
      assert_like_stock(jcc.jit(make())(x), make(), x)
    change()   # and changed once more, after those hits
    assert_like_stock(jcc.jit(make())(x), make(), x)
  finally:
    restore()


def _scaled_vjp(*args, **kwargs):
  """jax's vjp with every cotangent scaled by ``Table.scale``."""
  out = _ORIGINAL_VJP(*args, **kwargs)
  pullback = out[1]
  return (out[0], lambda ct: tuple(Table.scale * g for g in pullback(ct)),
          *out[2:])


def test_a_global_of_jaxs_replaced_by_jaxs_wrapper_around_a_users_function():
  """A global of jax's own code is kept by identity only where its cells
  hold jax's own constants: replaced by jax's traceback wrapper around a
  user's function (a monkeypatch), that function and what it reads are
  walked, so a later change to its state is seen as stock sees it."""
  from jax._src import traceback_util
  make = lambda: jax.grad(lambda v: jnp.sum(v * v))
  x = jnp.ones(2)
  try:
    _jax_api.vjp = traceback_util.api_boundary(_scaled_vjp)
    for _ in range(3):   # stock's object, the shared entry, a hit
      assert_like_stock(jcc.jit(make())(x), make(), x)
    Table.scale = 3.0
    for _ in range(2):
      assert_like_stock(jcc.jit(make())(x), make(), x)
  finally:
    _jax_api.vjp = _ORIGINAL_VJP
    Table.scale = 2.0


def test_helper_global_array_is_lifted_not_baked():
  """An array a module-level helper reads is a lifted leaf: a new value
  hits the same executable and gives the new answer."""
  x = jnp.ones(2)
  from helper_module import scaled_by_w
  make = lambda: (lambda v: scaled_by_w(v) * 1.0)
  restore = _restore(helper_module, "W")
  try:
    # (arrays of several values: one of one value is stock's in a chain)
    helper_module.W = jnp.asarray([3.0, 3.5], jnp.float32)
    for _ in range(2):
      jcc.jit(make())(x)
    helper_module.W = jnp.asarray([9.0, 9.5], jnp.float32)   # same type
    with counting() as c:
      out = jcc.jit(make())(x)
    assert c["compiles"] == 0
    assert_like_stock(out, make(), x)
  finally:
    restore()


def test_function_budget_bound_is_explained(monkeypatch, caplog):
  import logging
  from jax_closure_cache.key import closure
  monkeypatch.setattr(closure, "FUNCTION_BUDGET", 1)
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  x = jnp.ones(2)
  make = lambda: (lambda v: twice_scaled(v) + 1.0)
  for _ in range(3):
    assert_like_stock(jcc.jit(make())(x), make(), x)
  assert jcc.stats()["fallback_reasons"].get("function_budget", 0) >= 1
  assert any("more than 1 functions" in r.getMessage() for r in caplog.records)


# a global table larger than the key's budget (a vocabulary)
_TABLE = {f"token{k}": k for k in range(6000)}


def test_a_global_table_past_the_budget_goes_to_tier_a():
  """A code reading one entry of a global dict of more values than the
  key's budget is not keyed by the whole table (whose walk and matcher
  made a miss take seconds and a hit hundreds of milliseconds): the walk
  stops before flattening it, the call traces as stock's does and tier A
  shares the executable, with stock's results while the table changes."""
  x = jnp.ones(3)

  def make(i):
    w = jnp.full(3, float(i + 2))   # (never all 1.0: x * 1 is XLA's)

    def f(v):
      return jnp.sin(v * w) + _TABLE["token1"]
    return f
  jcc.enable()
  for i in range(6):
    if i == 4:
      _TABLE["token1"] = 7   # read afresh: each call traces
    assert_like_stock(jax.jit(make(i))(x), make(i), x)
  _TABLE["token1"] = 1
  assert jcc.stats()["fallback_reasons"].get("budget", 0) >= 4
  # a structure's first meeting and its shared lowering compile, then the
  # calls share it (the changed table entry is a lifted literal)
  assert jcc.stats()["tier_a"]["hits"] >= 3
