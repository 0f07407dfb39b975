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
