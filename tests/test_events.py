"""Every outcome is counted in ``stats()`` and explained by the same call
(``events``), so the counters and the explanation log cannot drift."""

import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc

x = jnp.arange(3.0)


def _not_stored_lines(caplog):
  return [r.getMessage() for r in caplog.records
          if "entry not stored" in r.getMessage()]


def _concrete_array():
  with jax.ensure_compile_time_eval():
    return jnp.ones(3)


@pytest.mark.parametrize("reason,made_at_trace_time", [
    ("layout_changed", _concrete_array),
    ("uncacheable_after_trace", lambda: np.array([None], dtype=object))])
def test_state_changed_by_the_trace_is_counted_and_explained(
    monkeypatch, caplog, reason, made_at_trace_time):
  """A trace that puts a new value in a cell its closure reads is answered
  but not stored; stats() counts it under the reason the log names (these
  two reasons used to be logged only)."""
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  jcc.enable()

  def make(w):
    extra = [None]   # (a nonlocal assignment has no closure key at all)
    def f(v):
      out = v * w if extra[0] is None else v * w + 1.0
      extra[0] = made_at_trace_time()
      return out
    return f

  got = [jax.jit(make(jnp.full(3, s)))(x) for s in (1.0, 2.0)]
  jcc.disable()
  want = [jax.jit(make(jnp.full(3, s)))(x) for s in (1.0, 2.0)]
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  assert jcc.stats()["not_stored"] == {reason: 1}
  lines = _not_stored_lines(caplog)
  assert len(lines) == 1 and f"({reason})" in lines[0]


def test_closure_convert_fallback_is_counted_and_explained(monkeypatch, caplog):
  """closure_convert answered by stock for a reason is a counted fallback
  (it used to be silent)."""
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  jcc.enable()
  device = jax.devices()[0]
  make = lambda w: (lambda v: jnp.sin(w * v))
  outs = []
  for s in (1.0, 2.0):   # the first object is stock's; the second falls back
    w = jax.device_put(jnp.full(3, s), device)   # committed: kept by identity
    converted, hoisted = jax.closure_convert(make(w), x)
    assert hoisted == []
    outs.append(converted(x))
  np.testing.assert_allclose(outs[1], jnp.sin(2.0 * x))
  assert jcc.stats()["fallback_reasons"] == {"array_by_identity": 1}
  assert any("fallback to stock" in r.getMessage() for r in caplog.records)


PACKAGE = os.path.dirname(jcc.__file__)
# Who may move a counter of an outcome, and who may explain one.
COUNTING = re.compile(r"count_(miss|fallback|retrace|not_stored)\(|"
                      r"next\([\w.]*counters\.hits\)")
EXPLAINING = re.compile(r"diagnostics\.(hit|miss|fallback|not_stored|"
                        r"explain_retrace)\(")


@pytest.mark.parametrize("pattern,owners", [
    (COUNTING, {"events.py", "cache.py"}),
    (EXPLAINING, {"events.py"})])
def test_only_events_counts_and_explains_outcomes(pattern, owners):
  offenders = []
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if not name.endswith(".py") or name in owners:
        continue
      with open(os.path.join(folder, name)) as f:
        for n, line in enumerate(f, 1):
          if pattern.search(line.split("#")[0]):
            offenders.append(f"{name}:{n}: {line.strip()}")
  assert offenders == []


def test_hits_stay_counted_across_jax_clear_caches():
  """``jax.clear_caches()`` drops the entries and their per-location
  records, on which the fast front counts its hits; ``stats()["hits"]``
  keeps them (as it keeps misses and fallbacks) until ``jcc.clear()``."""
  x = jnp.ones(3)

  def make(w):
    return lambda v: v * w

  with jcc.enabled():
    for _ in range(6):
      jcc.jit(make(jnp.full(3, 2.0)))(x)   # stored, then front hits
    before = jcc.stats()
    assert before["hits"] >= 3
    jax.clear_caches()
    after = jcc.stats()
    assert (after["hits"], after["misses"]) == (before["hits"],
                                                before["misses"])
    assert after["entries"] == 0
    jcc.clear()
    assert jcc.stats()["hits"] == 0
