"""Checks of closures over sharded arrays on 8 host devices.

Run as a subprocess by test_sharded.py (the device count must be set before
jax initialises). Every fresh closure closes over a new value; each result is
compared with stock ``jax.jit`` (the cache is never enabled here: ``jcc.jit``
and ``jcc.lax`` are called explicitly) on a fresh function object, values and
sharding and commitment, and the cache compiles no more often (JAX's own
counters).
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax._src import test_util as jtu  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_closure_cache as jcc  # noqa: E402
from jax_closure_cache import lax as cached_lax  # noqa: E402


def same(got, want, what):
  """Stock's values, sharding and commitment."""
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6,
                             err_msg=what)
  assert got.sharding == want.sharding, (what, got.sharding, want.sharding)
  assert got.committed == want.committed, (what, got.committed)


def compiles(call):
  with jtu.count_jit_compilation_cache_miss() as c:
    out = call()
  return out, c()


def check_fresh(what, make, values, args, jit_options=None):
  """``jcc.jit(make(v))(*args)`` for each value: every result is stock's
  (sharding and commitment included: stock bakes a closed-over committed
  array, and the cache keeps it by identity), compiling no more often."""
  options = jit_options or {}
  for i, v in enumerate(values):
    out, n = compiles(lambda: jcc.jit(make(v), **options)(*args))
    want, m = compiles(lambda: jax.jit(make(v), **options)(*args))
    same(out, want, f"{what} call {i}")
    assert n <= m, (what, i, n, m)
  print("ok", what)


def main():
  assert jax.device_count() == 8, jax.devices()
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  x = put(jnp.ones((8, 8)), P("data", None))
  tanh_mm = lambda w: (lambda v: jnp.tanh(v @ w))

  ws = [put(jnp.eye(8) * (i + 1.0), P(None, "model")) for i in range(5)]
  check_fresh("(data, model)-sharded weight", tanh_mm, ws, (x,))
  check_fresh("replicated weight", tanh_mm,
              [put(jnp.eye(8) * (i + 1.0), P()) for i in range(5)], (x,))
  check_fresh("weight over both axes", tanh_mm,
              [put(jnp.eye(8) * (i + 1.0), P(("data", "model"))) for i in
               range(5)], (x,))
  check_fresh("user in_shardings", tanh_mm, ws, (x,),
              {"in_shardings": (NamedSharding(mesh, P("data", None)),),
               "out_shardings": NamedSharding(mesh, P("data", None))})

  check_fresh("one in_sharding for every argument", tanh_mm, ws, (x,),
              {"in_shardings": NamedSharding(mesh, P("data", None))})

  # On a mesh of Auto axes too, stock bakes the array as an unsharded
  # constant, and so does the cache.
  auto = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  xa = jax.device_put(jnp.ones((8, 8)), NamedSharding(auto, P("data", None)))
  auto_ws = [jax.device_put(jnp.eye(8) * (i + 1.0),
                            NamedSharding(auto, P(None, "model")))
             for i in range(4)]
  check_fresh("Auto mesh", tanh_mm, auto_ws, (xa,))
  # An uncommitted argument: stock's result is on the default device,
  # uncommitted, whatever the closed-over array's sharding.
  check_fresh("uncommitted argument", tanh_mm, auto_ws, (jnp.ones((8, 8)),))

  # A single-device array committed to device 1 stays stock's: lifting it
  # would commit the result to that device. Each is met twice (fresh
  # closures over the same array): a key met once is stock's anyway; met
  # again, the array kept by identity keeps it stock's.
  ones = [jax.device_put(jnp.ones(4) * i, jax.devices()[1]) for i in range(3)]
  for v in ones:
    for _ in range(2):
      got = jcc.jit(lambda u: u + v)(jnp.ones(4))
      same(got, jax.jit(lambda u: u + v)(jnp.ones(4)), "single-device")
  assert jcc.stats()["fallback_reasons"].get("array_by_identity", 0) >= 2

  # A mesh of Explicit axes, no argument and no mesh context: stock's trace
  # of a closure over such an array raises (the device assignment is not
  # the mesh's); a committed array is never lifted, so the cache's trace
  # raises too, for every object (each met twice). Under the mesh, both
  # answer alike.
  explicit = jax.make_mesh((4, 2), ("data", "model"),
                           axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  explicit_ws = [jax.device_put(jnp.eye(8) * (i + 1.0),
                                NamedSharding(explicit, P(None, "model")))
                 for i in range(3)]
  for v in explicit_ws:
    for _ in range(2):
      raised = []
      for jit in (jcc.jit, jax.jit):
        try:
          jit(lambda: v * 2.0)()
        except Exception as e:   # noqa: BLE001 -- compared with stock's
          raised.append((type(e), str(e)))
        else:
          raised.append(None)
      assert raised[0] is not None and raised[0] == raised[1], raised
  with jax.set_mesh(explicit):
    check_fresh("Explicit mesh, under set_mesh", lambda w: (lambda: w * 2.0),
                explicit_ws, ())

  # An ambient mesh: stock keys it, and so does the shared entry.
  with jax.set_mesh(mesh):
    check_fresh("under set_mesh", tanh_mm, ws, (x,))

  # shard_map inside a re-created closure.
  def smap(w):
    def f(v):
      return jax.shard_map(lambda a, b: a @ b, mesh=mesh,
                           in_specs=(P("data", None), P(None, "model")),
                           out_specs=P("data", "model"))(v, w)
    return f
  check_fresh("shard_map body", smap, ws, (x,))

  # Eager while_loop whose body closes over sharded params.
  def loop(lax, w):
    return lax.while_loop(lambda c: c[0] < 3,
                          lambda c: (c[0] + 1, jnp.tanh(c[1] * w)), (0, x))[1]
  row_sharded = [put(jnp.full((8, 8), i + 1.0), P("data", None))
                 for i in range(5)]
  for i, w in enumerate(row_sharded):
    out, n = compiles(lambda: loop(cached_lax, w))
    want, m = compiles(lambda: loop(jax.lax, w))
    same(out, want, f"while_loop call {i}")
    assert n <= m, ("while_loop", i, n, m)
  print("ok while_loop")
  print("all ok", jcc.stats()["hits"])


if __name__ == "__main__":
  sys.exit(main())
