"""jaxtyping as its users write it: an outer ``@jaxtyped`` function binds a
dimension from one argument, and a closure re-made each step checks another
array against it at trace time (``isinstance(x, Float[Array, "b d"])``).
The check reads jaxtyping's dimension memo, the calling thread's state no
key holds: a code reading jaxtyping's classes is never answered from a
stored trace (``fallback_reasons``: ``drawn_state``), so each step's check
runs, and raises, as stock's."""

import jax
import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
from conftest import stock_off

jaxtyping = pytest.importorskip("jaxtyping")
Array, Float, jaxtyped = jaxtyping.Array, jaxtyping.Float, jaxtyping.jaxtyped


@jaxtyped(typechecker=None)
def _train_step(w, x, y, mask):
  assert isinstance(mask, Float[Array, "b"])   # binds b from the mask

  def loss(w):   # re-made every step
    assert isinstance(x, Float[Array, "b d"]), "x does not match the batch"
    return jnp.mean((x @ w - y) ** 2)
  return jax.jit(loss)(w)


def _steps():
  w, x, y = jnp.ones(3), jnp.ones((4, 3)), jnp.full(4, 0.5)
  outs = []
  for i in range(6):
    mask = jnp.ones(5 if i in (2, 3) else 4)   # steps 2, 3: b is 5, not 4
    try:
      outs.append(float(_train_step(w, x, y, mask)))
    except AssertionError as e:
      outs.append(("AssertionError", str(e).splitlines()[0]))
  return outs


def test_a_dimension_bound_by_an_outer_jaxtyped_function_is_checked_each_step():
  want = stock_off(_steps)
  assert want[2] == ("AssertionError", "x does not match the batch")
  jcc.enable(verify=True)
  for _ in range(2):
    assert _steps() == want
  stats = jcc.stats()
  assert stats["verify_mismatches"] == 0
  assert stats["fallback_reasons"].get("drawn_state", 0) > 0
