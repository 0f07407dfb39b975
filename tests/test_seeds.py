"""The two user reports in ../shared/seeds, run verbatim (imports added)."""

import jax
import jax.numpy as np
import numpy as onp

from jax._src import test_util as jtu

import jax_closure_cache as jcc


def test_seed_000_nested_jit_traces_f_once(capsys):
  with jcc.enabled():
    x = onp.random.rand(1024).astype(onp.float32)
    x = jax.device_put(x)

    def f(x):
        print('f x', x)
        return np.square(x)

    def g(f, x):
        print('g f', f)
        print('g x', x)
        return f(x)

    def h(f, x):
        print('h f', f)
        print('h x', x)
        return f(x)

    f = jax.jit(f)
    g = jax.jit(g, static_argnums=(0,))
    h = jax.jit(h, static_argnums=(0,))

    f(x)  # will trigger compilation of f
    f(x)  # reuse cache
    print('')
    g(f, x)  # will trigger compilation of g and another compilation of f
    g(f, x)  # reuse cache
    print('')
    h(f, x)  # will trigger compilation of h, but uses cached f
    h(f, x)  # reuse cache
  out = capsys.readouterr().out
  assert out.count("f x") == 1
  assert out.count("g f") == 1 and out.count("h f") == 1


def _closure_form_of_seed_000():
  """Seed 000 with ``f`` closing over a new array each call (re-created,
  jitted, and passed statically to re-created jitted ``g`` and ``h``), its
  prints left out (a trace-time print is an effect every trace has):
  outputs, and each call's trace count per function from JAX's own trace
  duration event."""
  x = jax.device_put(onp.random.RandomState(0).rand(64).astype(onp.float32))

  def make(w):
    def f(x):
      return np.square(x) * w
    return f

  def g(f, x):
    return f(x)

  def h(f, x):
    return f(x) + 1.0

  names = []

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_trace_duration":
      names.append(kwargs.get("fun_name"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  outs, traces = [], []
  try:
    for i in range(3):
      f = jax.jit(make(np.asarray(float(i + 1))))
      gj = jax.jit(g, static_argnums=(0,))
      hj = jax.jit(h, static_argnums=(0,))
      del names[:]
      outs += [f(x), gj(f, x), gj(f, x), hj(f, x), hj(f, x)]
      traces.append({n: names.count(n) for n in "fgh"})
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return outs, traces


def test_seed_000_closure_form_traces_f_at_most_twice(monkeypatch):
  """Stock traces ``f`` on each of the three calls; the cache, twice (the
  code's first object, then the shared entry), with stock's results, and
  with explanations on (they once crashed naming a pytree node's parts)."""
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  want, stock_traces = _closure_form_of_seed_000()
  assert [t["f"] for t in stock_traces] == [1, 1, 1]
  with jcc.enabled(verify=True):
    got, traces = _closure_form_of_seed_000()
    assert jcc.stats()["verify_mismatches"] == 0
  for a, b in zip(got, want):
    onp.testing.assert_array_equal(a, b)
    assert a.dtype == b.dtype and a.weak_type == b.weak_type
  assert sum(t["f"] for t in traces) <= 2, traces
  assert traces[-1]["f"] == 0 and traces[-1]["g"] == 0, traces


def test_seed_001_outer_inner_compiles_once(capsys):
  with jcc.enabled():
    import jax
    import jax.numpy as jnp


    def outer(a: jax.Array):
        def inner(x: jax.Array):
            print("compiling")
            return x * 2
        # print(f"id(inner) = {id(inner)}")
        # print(f"hash(inner) = {hash(inner)}")
        jitted_inner = jax.jit(inner)
        return jitted_inner(a)

    a = jax.random.normal(jax.random.key(0), (3, 4))
    with jtu.count_jit_compilation_cache_miss() as compiles:
      for _ in range(5):
        outer(a)
  # The print is a trace-time effect, which stock's trace has on every call
  # (each ``inner`` is a new function object): the closure key refuses to
  # skip it, and tier A shares the executable after each trace. The first
  # call is stock's own; the first ``inner`` is gone by the second call, so
  # that one compiles the shared executable, which every later call reuses.
  assert compiles() == 2
  assert capsys.readouterr().out.count("compiling") == 5
  jcc.clear()
  with jtu.count_jit_compilation_cache_miss() as compiles:
    outer(a)
    outer(a)   # stock, for contrast: compiles every call
  assert compiles() == 2
  assert capsys.readouterr().out.count("compiling") == 2
