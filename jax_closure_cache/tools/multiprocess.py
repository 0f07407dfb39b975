"""Two local JAX processes through ``jax.distributed``: a training-step loop
whose closure over globally sharded params is re-created every step.

``run_pair(mode)`` starts two processes of this module on 127.0.0.1 (a free
port, 4 CPU devices each, gloo collectives), each bounded by ``timeout``
seconds and killed on failure, and returns both processes' JSON reports:

* ``mode="check"``: per step, compile counts of the cached step, and whether
  its loss and local shards of the new params equal the hand-hoisted step's
  (which passes the params as arguments); also what stock ``jax.jit`` of the
  same closure does (it raises: a closure over an array spanning other
  processes' devices is not allowed).
* ``mode="bench"``: median µs per step of the cached and the hoisted step
  (alternating), after warm-up.

This is also how to run on a multi-host cluster: the same code, with
``coordinator_address`` the first host's address and one process per host.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

STEPS = 6


def package_parent() -> str:
  """The directory this package was imported from: a child started there
  with ``-m`` imports the same copy (``-m`` puts its working directory
  first), so a parent run from a source tree and one run from an installed
  copy (whose C entrance the source tree lacks) each measure their own."""
  return os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_pair(mode: str = "check", timeout: float = 240.0) -> list[dict]:
  """Run the two processes; raise RuntimeError with their output on failure."""
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  env.pop("JAX_CLOSURE_CACHE", None)
  procs = [subprocess.Popen(
      [sys.executable, "-m", "jax_closure_cache.tools.multiprocess", mode,
       str(port), str(pid)], env=env, cwd=package_parent(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for pid in range(2)]
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=timeout))
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    raise RuntimeError(f"the two processes did not finish in {timeout} s")
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  if any(p.returncode for p in procs):
    raise RuntimeError("\n".join(f"process {i} exit {p.returncode}:\n{o}\n{e}"
                                 for i, (p, (o, e)) in enumerate(zip(procs, outs))))
  return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _worker(mode: str, port: int, pid: int) -> dict:
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                             num_processes=2, process_id=pid)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jax_closure_cache import _compat
  from jax_closure_cache.front import entrance

  mesh = jax.make_mesh((8,), ("data",))
  sharding = NamedSharding(mesh, P("data"))

  def global_array(values):
    local = np.asarray(values, np.float32)[4 * pid:4 * pid + 4]
    return jax.make_array_from_process_local_data(sharding, local, (8,))

  x = global_array(np.linspace(0.5, 1.5, 8))

  def loss(p, v):
    return jnp.sum((p * v - 1.0) ** 2)

  def step_math(p, v):
    return loss(p, v), p - 0.1 * jax.grad(loss)(p, v)

  def cached_step(params):
    # the closure over the params is re-created every step
    return entrance.jit(lambda v: step_math(params, v))(x)

  hoisted = jax.jit(step_math)

  def local(a):
    return [np.asarray(s.data) for s in a.addressable_shards]

  if mode == "bench":
    params = global_array(np.ones(8))
    return _timed(jax, cached_step, hoisted, params, x,
                  lambda p: _stock_error(jax, lambda v: step_math(p, v), x))

  report = {"compiles": [], "equal": [], "process_count": jax.process_count(),
            "device_count": jax.device_count()}
  params = params_h = global_array(np.ones(8))
  for _ in range(STEPS):
    with _compat.count_compiles() as compiles:
      value, params = cached_step(params)
      jax.block_until_ready(params)
    report["compiles"].append(compiles())
    value_h, params_h = hoisted(params_h, x)
    report["equal"].append(
        bool(np.allclose(local(value), local(value_h), rtol=1e-6))
        and all(np.allclose(a, b, rtol=1e-6)
                for a, b in zip(local(params), local(params_h)))
        and params.sharding == params_h.sharding)
  report["stock_error"] = _stock_error(jax, lambda v: step_math(params, v), x)
  return report


def _timed(jax, cached_step, hoisted, params, x, stock_error) -> dict:
  """Median microseconds per step of the cached and hoisted steps, after
  three warm-up steps each, and stock's error for the cached closure."""
  params_c = params_h = params
  for _ in range(3):
    _, params_c = cached_step(params_c)
    _, params_h = hoisted(params_h, x)
  cache_t, hoisted_t = [], []
  for _ in range(200):
    t = time.perf_counter()
    jax.block_until_ready(cached_step(params_c))
    cache_t.append(time.perf_counter() - t)
    t = time.perf_counter()
    jax.block_until_ready(hoisted(params_h, x))
    hoisted_t.append(time.perf_counter() - t)
  return {"cache_us": statistics.median(cache_t) * 1e6,
          "hoisted_us": statistics.median(hoisted_t) * 1e6,
          "stock_error": stock_error(params_c)}


def _stock_error(jax, fun, x) -> str | None:
  try:
    jax.block_until_ready(jax.jit(fun)(x))
  except Exception as e:   # what stock says about this closure
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"
  return None


if __name__ == "__main__":
  out = _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
  print(json.dumps(out), flush=True)
  sys.exit(0)
