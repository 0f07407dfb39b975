"""The cache never extends an array's life: for every route by which a
closure can reach an array, the arrays of five re-created closures are freed
once the user drops them (stock's own object, the shared entry, hits)."""

import functools
import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
from conftest import counting, stock_off


class Model:
  def __init__(self, w):
    self.w = w

  def apply(self, x):
    return x * self.w[0]


def _mul(w, x):
  return x * w[0]


def by_cell(w):
  return jcc.jit(lambda x: x * w[0])


def by_default(w):
  def f(x, w=w):
    return x * w[0]
  return jcc.jit(f)


def by_kwdefault(w):
  def f(x, *, w=w):
    return x * w[0]
  return jcc.jit(f)


def by_partial(w):
  return jcc.jit(functools.partial(_mul, w))


def by_dict_in_cell(w):
  d = {"w": w}
  return jcc.jit(lambda x: x * d["w"][0])


def by_nested_function(w):
  inner = lambda x: x * w[0]
  return jcc.jit(lambda x: inner(x) + 1)


def by_control_flow_body(w):
  return lambda x: jcc.lax.fori_loop(0, 2, lambda i, c: c + w[0], x)


def by_control_flow_operand(w):
  return lambda x: jcc.lax.fori_loop(
      0, 2, lambda i, c: (c[0] + c[1][0], c[1]), (x, w))[0]


def by_bound_self(w):   # the object is rebuilt as a copy holding the tracer
  return jcc.jit(Model(w).apply)


def by_object_attribute(w):
  m = Model(w)
  return jcc.jit(lambda x: x * m.w[0])


class Slotted:   # no __dict__ to copy: kept by identity, its array guarded
  __slots__ = ("w", "__weakref__")

  def __init__(self, w):
    self.w = w


def by_slotted_object(w):
  s = Slotted(w)
  return jcc.jit(lambda x: x * s.w[0])


def by_committed_array(w):
  import jax
  w = jax.device_put(w, jax.devices()[0])
  return jcc.jit(lambda x: x * w[0])


HITTING = [by_cell, by_default, by_kwdefault, by_partial, by_dict_in_cell,
           by_nested_function, by_control_flow_body, by_control_flow_operand,
           by_bound_self, by_object_attribute]
STOCKS = [by_slotted_object, by_committed_array]


@pytest.mark.parametrize("route", HITTING + STOCKS, ids=lambda r: r.__name__)
def test_arrays_are_freed_when_the_user_drops_them(route):
  x = jnp.ones(4)
  refs = []
  for i in range(5):
    v = i + 2.0   # (not 0 or 1: stock's module folds x + 0 and x * 1)
    w = jnp.full(1 << 16, v)
    refs.append(weakref.ref(w))
    f = route(w)
    out = f(x)
    assert float(out[0]) in (1.0 * v, 1.0 + v, 1.0 + 2 * v, 1.0 * v + 1.0)
    f(x)
    del w, f, out
  gc.collect()
  assert [r() for r in refs] == [None] * 5
  s = jcc.stats()
  if route in HITTING:
    assert s["hits"] >= 3   # the test is about a cache that is used
  else:   # kept by identity: never shared between function objects
    assert s["hits"] == 0


def _raises_for_two_elements(w):
  def f(x):
    if x.shape[0] == 2:
      raise ValueError("two elements")
    return x * w[0]
  return f


def test_arrays_are_freed_after_a_hit_whose_new_signature_raises():
  """A hit passes its function to the entry for the call (``Entry.caller``)
  and clears it after, also when the trace of a new signature raises: the
  entries hold none of the functions, and their arrays are freed."""
  from jax_closure_cache.front import entries
  x, two = jnp.ones(4), jnp.ones(2)
  refs = []
  for i in range(6):
    w = jnp.full(1 << 16, float(i))
    refs.append(weakref.ref(w))
    assert float(jcc.jit(_raises_for_two_elements(w))(x)[0]) == float(i)
    with pytest.raises(ValueError, match="two elements"):
      jcc.jit(_raises_for_two_elements(w))(two)
    del w
  gc.collect()
  assert [r() for r in refs] == [None] * 6
  assert jcc.stats()["hits"] >= 3
  stored = list(entries.entries._data.values())
  assert stored and all(e.caller is None and e.walk is None
                        for e in stored)


def _payload_step(i, launch):
  payload = bytes(1 << 20) + str(i).encode()   # 1 MB, read at trace time
  return float(launch(lambda y: y + len(payload) % 7)(jnp.arange(4.0)).sum())


@pytest.mark.parametrize("route", ["jit", "fori_loop"])
def test_values_of_keys_met_once_are_not_kept(route):
  """A re-created closure holding a value its key holds by value (here a
  fresh 1 MB ``bytes`` per call, so every key is met once) keeps no more
  than a few recent keys' values: the trace lookup stores an answer only
  for a key met again, and the explanations keep the last few keys whole
  (their hashes for the rest). Before, forty calls kept forty payloads."""
  import tracemalloc
  launch = {"jit": jcc.jit,
            "fori_loop": lambda f: (lambda v: jcc.lax.fori_loop(
                0, 1, lambda i, c: f(c), v))}[route]
  jcc.enable()
  gc.collect()
  tracemalloc.start()
  try:
    before = tracemalloc.get_traced_memory()[0]
    for i in range(40):
      _payload_step(i, launch)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
  finally:
    tracemalloc.stop()
  assert kept < 12 << 20, kept   # at most 2 * RECENT_KEYS payloads, and slack


_STEP_SCALE = 1.0


def test_a_closure_free_functions_keys_met_once_keep_no_stock_object(
    monkeypatch):
  """A closure-free function reading a global that changes each step has
  a new key each step: each key's first object is stock's own, and no
  canonical stock object (with its executable and the function it holds)
  is kept for it. Before, every step's object was kept."""
  jcc.enable()
  x = jnp.ones(4)
  refs = []
  for step in range(30):
    monkeypatch.setitem(globals(), "_STEP_SCALE", 1.0 + step)
    f = lambda v: v * _STEP_SCALE
    refs.append(weakref.ref(f))
    jcc.jit(f)(x)
    del f
  gc.collect()
  assert sum(r() is not None for r in refs) <= 1   # (the last, at most)


def _local_class_step(i: int, closed_over: bool):
  """A class made afresh (its attribute alternating between two values,
  so keys repeat by value), used by a re-created jitted function: through
  a cell, or as an instance's class. Returns a weak reference to it."""
  class Local:
    data = bytes([i % 2]) * 1024

  if closed_over:
    f = lambda x: x + float(Local.data[0])
  else:
    held = Local()
    f = lambda x: x + float(held.data[0])
  jcc.jit(f)(jnp.float32(1.0))
  return weakref.ref(Local)


@pytest.mark.parametrize("closed_over", [True, False],
                         ids=["the class", "an instance"])
def test_classes_made_per_call_die_with_their_functions(closed_over):
  """A stored key holds a class it walked by identity (its id, the class
  an anchor the store holds weakly), so classes made per call die with
  their functions, as under stock, and their entries with them. Before,
  a stored key held the class itself: 26 of 120 were kept."""
  jcc.enable()
  refs = [_local_class_step(i, closed_over) for i in range(60)]
  gc.collect()
  assert sum(r() is not None for r in refs) == 0


def test_a_long_lived_object_keeps_no_copy_of_a_large_numpy_constant():
  """Fresh lambdas over a new 2 MiB NumPy array each step, given as the
  static argument of a long-lived jitted function: stock's object keeps
  each lambda (and its array) and an executable baking the array. A shared
  executable takes each array as an argument, a copy that pjit's fast path
  keeps as long as stock's object lives: over 1 MiB of NumPy constants the
  lowering is stock's, so no more device arrays stay alive than with stock.
  Below it (a 64 KiB array), the executable is still shared (each copy,
  kept in place of stock's executable of the object, costs less than it)."""
  import numpy as np
  x = jnp.ones((512,), jnp.float32)

  def run(rows, steps=6):
    apply = jax.jit(lambda f, v: f(v), static_argnums=0)
    outs = []
    before = len(jax.live_arrays())
    with counting() as counts:
      for i in range(steps):
        w = np.full((rows, 512), float(i), np.float32)
        outs.append(float(apply(lambda v: (w @ v).sum(), x)))
        del w
    gc.collect()
    return outs, len(jax.live_arrays()) - before, counts["compiles"]

  big = stock_off(run, 1024)
  small = stock_off(run, 32)
  for verify in (False, True):
    jcc.clear()
    jcc.enable(verify=verify)
    try:
      got = run(1024)
      assert got[:2] == big[:2], (got, big)   # values, arrays kept alive
      got = run(32)
      assert got[0] == small[0], (got, small)
      assert got[2] < small[2], (got, small)   # shared (tier A)
    finally:
      jcc.disable()
