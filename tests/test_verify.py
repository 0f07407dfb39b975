"""Verify mode: every hit is also answered as stock would answer it and
compared (``front/verify.py`` for the closure key's hits, tier A's in
``lowering/shared.py``); the oracle the other tests run under."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import cache
from conftest import (STOCK_JIT, assert_like_stock, needs_trace_lookup,
                      replay_in_both_modes, stock_off, ticker)


def make(w):
  return lambda x: jnp.tanh(x @ w)


@pytest.mark.parametrize("rerun", [0, 1])
def test_closure_key_hits_are_checked_against_stocks_trace(rerun):
  del rerun
  jcc.enable(verify=True)
  x = jnp.ones((3, 3))
  for i in range(6):
    f = make(jnp.eye(3) * (i % 2 + 1))
    assert_like_stock(jax.jit(f)(x), f, x, rtol=1e-6)
  s = jcc.stats()
  assert s["hits"] >= 3 and s["verified"] >= 3, s
  assert s["verify_mismatches"] == 0


@pytest.mark.closure_cache_expects_mismatches
def test_a_stale_hit_is_caught_and_answered_by_stock():
  """A value the key does not see (a wrapper rule that leaves it out) makes
  the stored trace stale: verify mode traces as stock, finds the literal
  differs, and returns stock's result; the code's later functions are
  stock's, so the entry is not stored again to be caught again."""
  x = jnp.ones(2)
  with ticker() as t:
    jcc.enable(verify=True)
    outs = [jax.jit(lambda v: v * t.tick())(x) for _ in range(8)]
  got = [float(o[0]) for o in outs]
  # stock traces every fresh object: each reads the next tick
  assert got == sorted(set(got)) and len(got) == 8, got
  assert jcc.stats()["verify_mismatches"] == 1
  assert jcc.stats()["fallback_reasons"].get("unliftable", 0) >= 4


@needs_trace_lookup
@pytest.mark.closure_cache_expects_mismatches
def test_a_stale_shared_trace_is_caught_and_answered_by_stock():
  """The trace lookup's answers are checked too: stock's own ``jax.jit``
  objects of re-created closures share a trace by the closure key, which
  a value it does not see makes stale; verify mode traces each as stock,
  returns stock's trace on the mismatch, and the code's later functions
  are traced as usual (never checked, nor caught, again)."""
  from jax_closure_cache.key import values

  class Hidden:   # keyed by its type alone: a wrapper rule's mistake
    def __init__(self, value):
      self.value = value

  values.register_wrapper(Hidden, lambda h: ((), None), lambda s, inner: s)
  x = jnp.ones(2)
  try:
    jcc.enable(verify=True)
    outs = []
    for i in range(8):
      h = Hidden(float(i))
      outs.append(STOCK_JIT(lambda v: v * h.value)(x))
  finally:
    values.unregister_wrapper(Hidden)
  got = [float(o[0]) for o in outs]
  assert got == [float(i) for i in range(8)], got
  assert jcc.stats()["verify_mismatches"] == 1


@needs_trace_lookup
def test_verify_mode_runs_a_body_once_per_object_as_stock():
  """Verify mode checks the trace lookup's stored answers, not the one a
  call has just traced lifted (that call ran the body already): every
  function object's body runs once, as stock's trace runs it."""
  import sys
  x = jnp.ones(3)

  def make(w):
    def f(v):
      return v * w
    return f

  def run():
    runs = []
    code = make(None).__code__

    def profile(frame, event, arg):   # counts the body's runs unseen
      if event == "call" and frame.f_code is code:
        runs.append(1)
    for i in range(6):
      f = make(jnp.full((3,), float(i)))
      sys.setprofile(profile)
      try:
        STOCK_JIT(f)(x)
      finally:
        sys.setprofile(None)
    return len(runs)

  want = stock_off(run)
  jcc.enable(verify=True)
  assert run() == want == 6
  assert jcc.stats()["verified"] > 0


def test_verify_mode_costs_nothing_when_off():
  """Off, the generated hit has no verify line and no check runs."""
  from jax_closure_cache.front import generated
  assert "VERIFIED" not in generated.hit_source(False)
  assert "VERIFIED" in generated.hit_source(True)
  jcc.enable(verify=False)
  x = jnp.ones((3, 3))
  for i in range(5):
    jax.jit(make(jnp.eye(3) * 2))(x)
  assert jcc.stats()["verified"] == 0


def test_enable_and_enabled_set_and_restore_verify():
  cache.set_verify(False)   # (the suite may run with JAX_CLOSURE_CACHE_VERIFY=1)
  assert not cache.verifying()
  with jcc.enabled(verify=True):
    assert cache.verifying()
  assert not cache.verifying()
  jcc.enable(verify=True)
  assert cache.verifying()
  jcc.enable(verify=False)
  assert not cache.verifying()


def test_exceptions_in_verify_mode_are_stocks():
  jcc.enable(verify=True)

  def run(k):
    w = jnp.ones(3) * k
    return jax.jit(lambda x: x[:k] + w[:k])(jnp.ones(3))

  for k in (1, 2, 1, 2):
    np.testing.assert_array_equal(run(k), stock_off(run, k))
  with pytest.raises(TypeError):
    jax.jit(lambda x: x.reshape(-7, 5))(jnp.ones(3))


def test_verifying_in_threads_leaves_jaxs_test_counters_working():
  """The oracle mutes JAX's test events in its own thread only: threads
  verifying at once once left JAX's one listener swapped out for good, and
  every later ``count_jit_compilation_cache_miss`` read 0."""
  import threading
  from jax._src import test_util as jtu
  from conftest import counting
  barrier = threading.Barrier(8)

  def work(k):
    barrier.wait()
    for i in range(150):
      w = jnp.full(3, float(k * 1000 + i))
      jcc.jit(lambda v: v * w)(jnp.ones(3))

  with jcc.enabled(verify=True):
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
    assert cache.stats()["verified"] > 0
  s, x = jnp.float32(7.5), jnp.ones(2)
  jax.jit(lambda v: v - s)(x)   # jnp's own jitted helpers traced once
  with counting() as c:
    out = jax.jit(lambda v: v - s)(x)   # stock's, a new structure
  assert (c["traces"], c["compiles"]) == (1, 1), c
  np.testing.assert_array_equal(out, -6.5 * np.ones(2, np.float32))
  with jtu.count_jit_tracing_cache_miss() as traces:
    jax.jit(lambda v: v - s)(x)
  assert traces() == 1


def _nested_while_jaxprs():
  """Stock's jaxpr of a jit holding a while loop over two constants, and
  two others: the same loop with its constants (operands and body inputs
  together) in the other order, and one whose body alone takes them in the
  other order (a different computation)."""
  from jax_closure_cache._compat import lowering as compat

  def f(x, a, b):
    return jax.jit(lambda y: jax.lax.while_loop(
        lambda c: c.sum() < 10.0, lambda c: c * a + b, y))(x)
  stock = jax.make_jaxpr(f)(jnp.ones(3), jnp.ones(3), jnp.ones(3))
  outer = stock.jaxpr.eqns[0]
  inner = outer.params["jaxpr"]
  loop = inner.jaxpr.eqns[0]
  body = compat.with_inputs_in_order(loop.params["body_jaxpr"], [1, 0, 2])
  ops = loop.invars

  def rebuilt(invars):
    eqn = loop.replace(invars=invars, params=dict(loop.params,
                                                  body_jaxpr=body))
    open_inner = inner.jaxpr.replace(eqns=[eqn])
    new_inner = (open_inner if compat.MERGED_JAXPR
                 else compat.ClosedJaxpr(open_inner, inner.consts))
    top = stock.jaxpr.replace(eqns=[outer.replace(
        params=dict(outer.params, jaxpr=new_inner))])
    return top if compat.MERGED_JAXPR else compat.ClosedJaxpr(top, [])
  return stock, rebuilt([ops[1], ops[0], ops[2]]), rebuilt(list(ops))


def test_the_oracle_allows_a_loops_constants_reordered_inside_a_nested_jaxpr():
  """A lifted leaf orders a loop's constants otherwise than stock's trace,
  also where the loop is inside a nested jaxpr (a ``custom_vjp_call``'s, a
  nested jit's): the same computation. The body alone permuted is not."""
  from jax_closure_cache.lowering import compare
  stock, reordered, body_only = _nested_while_jaxprs()
  assert compare.first_difference(stock, stock, []) is None
  assert compare.first_difference(stock, reordered, []) is None
  assert compare.first_difference(stock, body_only, []) == (
      "equation 0 (jit): its parameters differ")


def test_tier_as_oracle_reads_a_lowered_module_by_what_it_computes():
  """Tier A's verify check compares a shared lowering with the jaxpr's own
  by ``module_form``: two private copies of one nested function (the
  lowering makes one per jaxpr object, so two for two objects of equal
  structure) read as the one function they compute, which the value-
  grammar fuzzer met as a false report; a nested function computing
  something else, or a different top level, still reads as different."""
  from jax_closure_cache.lowering.shared import module_form

  def make(scale):
    return lambda v: jnp.sin(v) * scale   # a new function object each time

  def lowered(*inner):
    return STOCK_JIT(lambda v: sum(STOCK_JIT(g)(v) for g in inner)).lower(
        jnp.ones(3)).as_text()

  one = make(2.0)
  twice_one, two_copies = lowered(one, one), lowered(one, make(2.0))
  assert twice_one != two_copies   # the lowering's own view
  assert module_form(twice_one) == module_form(two_copies)
  assert module_form(lowered(one, make(3.0))) != module_form(two_copies)
  assert module_form(lowered(one)) != module_form(twice_one)


def test_the_lift_numpy_default_changed_between_calls_verifies():
  """``enable(lift_numpy=...)`` switched between calls (entries made under
  one setting met under the other), on every route a closed-over NumPy
  array takes: jit, eager ``fori_loop`` and ``cond``, and a ``cond`` and
  a ``scan`` body inside a jitted closure, and a closure-free function
  reading a global array. The results are stock's and verify mode finds
  no mismatch."""
  def run():
    out = []
    for lift in (True, False, True, False):
      with (jcc.enabled(verify=cache.verifying(), lift_numpy=lift)
            if jcc.is_enabled() else contextlib.nullcontext()):
        out += calls()
    return [np.asarray(o).tobytes() for o in out]

  def calls():
    out = []
    for i in range(3):
      a = np.arange(3.0, dtype=np.float32) + (i % 2)
      x = jnp.ones(3)
      out.append(jax.jit(lambda v: v * a)(x))
      out.append(jax.lax.fori_loop(0, 2, lambda k, v: v * a, x))
      out.append(jax.lax.cond(True, lambda v: v + a, lambda v: v, x))
      out.append(jax.jit(lambda v: jax.lax.cond(
          v[0] > 0, lambda u: u * a, lambda u: u, v))(x))
      out.append(jax.jit(lambda v: jax.lax.scan(
          lambda c, _: (c * a, None), v, length=2)[0])(x))
      out.append(jax.jit(_times_global)(x))
    return out

  before = jcc.stats()["verify_mismatches"]
  replay_in_both_modes(run, clear=True)
  assert jcc.stats()["verify_mismatches"] == before


_GLOBAL_ARRAY = np.arange(3.0, dtype=np.float32)


def _times_global(v):
  return v * _GLOBAL_ARRAY


def test_a_trace_shared_over_references_is_verified_without_a_mismatch():
  """Fresh closures over the same mutable references (``jax.new_ref``),
  reading and writing one closed over and one passed: stock's values and
  the references' final states in both modes, and verify mode finds the
  hits' traces the same as stock's (an effect tied to an input, a
  reference's read or write, is compared by the input it is tied to, not
  by the jaxpr's own variable)."""
  def run():
    a, b = jax.new_ref(jnp.ones(3)), jax.new_ref(jnp.ones(3))
    out = []
    for i in range(3):
      def f(r):
        r[...] = r[...] + 1.0
        b[...] = b[...] * 2.0
        return r[...] + b[...]
      out.append(np.asarray(jax.jit(f)(a)).tolist())
      out.append(np.asarray(jax.jit(lambda r: r[...] * 3.0)(b)).tolist())
    out.append((np.asarray(a[...]).tolist(), np.asarray(b[...]).tolist()))
    return out

  before = jcc.stats()["verify_mismatches"]
  replay_in_both_modes(run, clear=True)
  assert jcc.stats()["verify_mismatches"] == before
