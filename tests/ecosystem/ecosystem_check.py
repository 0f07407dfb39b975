"""What every ecosystem test does with a library's training sequence.

A *sequence* is ``make_sequence() -> step``, where ``step(i)`` runs step
``i`` the way the library's users write it (a fresh loss, a fresh step
function, a fresh ``jax.jit``/``filter_jit``/``nnx.jit`` every step), threads
its own state to the next step, and returns what step ``i`` produced.
``make_sequence`` starts from the same initial state every time, so stock
and the cache run the same steps.

:func:`check_against_stock` runs it once with stock (the cache off), then
twice with ``jax_closure_cache.enable(verify=True)``, compares every step of
both runs with stock's (pytree structure, dtype, weak type, sharding,
values), and checks that no call from the third on compiles (JAX's own
counters). It returns the per-call counts and ``stats()``, from which each
test asserts what its tier does.

This module imports none of the libraries: each test file skips with
``pytest.importorskip`` where its library is not installed.
"""

from __future__ import annotations

import jax

import jax_closure_cache as jcc
from conftest import counting, same_as_stock, stock_off

STEPS = 6


def run(make_sequence, steps: int = STEPS):
  """(outputs, per-call counts) of one sequence of fresh function objects."""
  step = make_sequence()
  outs, counts = [], []
  for i in range(steps):
    with counting() as c:
      out = jax.block_until_ready(step(i))
    outs.append(out)
    counts.append(c)
  return outs, counts


def check_against_stock(make_sequence, steps: int = STEPS,
                        rtol: float = 0.0, first_free_call: int = 2):
  """Stock once, then the cache (verify mode) twice; every step compared.
  Calls ``first_free_call`` on (0-based) of each run must not compile: the
  target is 2 (the third call).

  Returns ``(stock_counts, [run1_counts, run2_counts], stats)``.
  """
  want, stock_counts = stock_off(run, make_sequence, steps)
  # What the cache removes: stock compiles on every call of a fresh object.
  assert all(c["compiles"] >= 1 for c in stock_counts), stock_counts
  jcc.clear()   # the stock run's structures are not the cache's to count
  jcc.enable(verify=True)
  runs = []
  for r in range(2):
    got, counts = run(make_sequence, steps)
    for i, (g, w) in enumerate(zip(got, want)):
      same_as_stock(g, w, rtol, where=f"run {r + 1}, step {i}")
    # the first meeting of a structure is stock's own compile, the second
    # compiles the shared executable: from the third call on, none
    assert compiles(counts)[first_free_call:] == [0] * (
        steps - first_free_call), (f"run {r + 1}", counts)
    runs.append(counts)
  s = jcc.stats()
  # shown with ``pytest -s`` (or -rP): what each test found
  print(f"\nstock compiles {compiles(stock_counts)}; cache compiles "
        f"{compiles(runs[0])} {compiles(runs[1])}; cache traces "
        f"{traces(runs[0])} {traces(runs[1])}; tier B hits {s['hits']}, "
        f"fallbacks {s['fallback_reasons']}, retraces {s['retraces']}; "
        f"tier A {s['tier_a']}; verified {s['verified']}, mismatches "
        f"{s['verify_mismatches']}")
  assert s["verify_mismatches"] == 0, s
  assert s["verified"] > 0, s   # verify mode checked the hits
  return stock_counts, runs, s


def traces(counts) -> list[int]:
  return [c["traces"] for c in counts]


def compiles(counts) -> list[int]:
  return [c["compiles"] for c in counts]


def assert_tier_a_answers(s, steps: int = STEPS):
  """Every call from the third on of both runs was a tier A hit (stock's
  trace, the shared executable) and tier B never skipped a trace."""
  assert s["hits"] == 0, s
  # run 1: call 1 is stock's own, call 2 compiles the shared executable
  # (or, with no constants to pass, uses call 1's own lowering while it
  # lives), calls 3.. hit it; run 2: every call hits it
  assert s["tier_a"]["compiles"] <= 1, s
  assert s["tier_a"]["compiles"] + s["tier_a"]["hits"] == 2 * steps - 1, s
