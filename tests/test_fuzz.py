"""The differential fuzzer: small programs that re-create closures over
nested configurations (optional members, Python scalars, strings, booleans,
NumPy and jax arrays, plain objects), through shared sub-closures, static
function arguments given to two different jitted functions, nested jits,
``jax.grad``, partials and defaults (arrays of one type in cells and
defaults at once), eager control flow, a long-lived slotted object changed
in place, a NumPy generator drawn from at trace time, and library wrappers' shapes (callable objects, bound methods in
a pytree's node data, functions nested in static tuples, jaxprs passed
statically, constants made under ``ensure_compile_time_eval``) and a trace
that raises the user's error for a new shape on a hit, and ``.trace``,
``.lower``, ``.compile`` and ``.eval_shape`` after calls; each sequence
runs twice (the replay hits), with the cache and with stock jit on fresh
objects, and every result, exception type, dtype, weak type and shape must
agree. CI runs ``--fuzz-examples`` programs (default 200) from a fixed seed;
each failure it found is a named regression test
(``test_wrong_answers.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis import seed as hypothesis_seed

import jax_closure_cache as jcc
import fuzz_programs

# One configuration: values from small pools, so sequences repeat keys
# (hits) and change a member or two at a time (misses).
CHOICE = st.fixed_dictionaries({
    "w": st.tuples(st.sampled_from(["jax", "jax", "numpy"]),
                   st.sampled_from([1.0, -0.5, 2.0])),
    "b": st.sampled_from([1.0, 2.0, 0.5, 1, 2, 3]),
    "act": st.sampled_from(["sin", "tanh", "id"]),
    "extra": st.sampled_from([None, (1.0, 2.0), (0.5, -2.0), (1.0, 3)]),
    "ks": st.sampled_from([(), (1,), (2,), (1, 2), (1, 5), (3, 1)]),
    "flag": st.booleans(),
    "box": st.sampled_from([None, None, (2.0, 1.0), (3.0, 1.0), (2, 0.5)]),
})
MEMBERS = ["w", "b", "act", "extra", "ks", "flag", "box"]
LOOPS = frozenset({"fori", "while_loop", "scan", "cells_and_defaults"})


@st.composite
def programs(draw):
  feature = draw(st.sampled_from(sorted(fuzz_programs.FEATURES)))
  sequence = [draw(CHOICE)]
  for _ in range(draw(st.integers(2, 5))):
    changed = draw(st.sets(st.sampled_from(MEMBERS), min_size=1, max_size=2))
    new = draw(CHOICE)
    sequence.append({k: (new[k] if k in changed else v)
                     for k, v in sequence[-1].items()})
  return feature, sequence


def _same(got, want, where):
  if isinstance(want, type) or isinstance(got, type):
    assert got is want, (where, got, want)
    return
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree, where
  for g, w in zip(got_leaves, want_leaves):
    assert (g.shape, g.dtype, g.weak_type) == (w.shape, w.dtype, w.weak_type), \
        (where, g, w)
    assert g.sharding == w.sharding, where
    # rtol: XLA may fold a baked array into the arithmetic (docs/contract.md,
    # rule 2); in eager loops the difference compounds per iteration (rule 13)
    rtol = 2e-5 if where[0] in LOOPS else 2e-6
    np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, equal_nan=True,
                               err_msg=str(where))


def check_program(feature, choices, x) -> None:
  """The program with stock jit (cache off, fresh objects) and with the
  cache, both passes; every outcome the same."""
  jcc.clear()
  jcc.disable()
  want = fuzz_programs.run(feature, choices, x)
  jcc.enable()
  try:
    got = fuzz_programs.run(feature, choices, x)
  finally:
    jcc.disable()
  for step, (g, w) in enumerate(zip(got, want)):
    _same(g, w, (feature, step, choices[step % len(choices)]))


def test_cache_agrees_with_stock_on_generated_programs(request):
  n = request.config.getoption("--fuzz-examples")
  if n == 0:
    pytest.skip("--fuzz-examples 0")
  x = jnp.array([0.3, -1.2], jnp.float32)

  @hypothesis_seed(request.config.getoption("--fuzz-seed"))
  @settings(max_examples=n, deadline=None, database=None, derandomize=False,
            suppress_health_check=list(HealthCheck))
  @given(programs())
  def run(program):
    check_program(*program, x)
  run()
