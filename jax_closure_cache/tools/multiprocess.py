"""Two local JAX processes through ``jax.distributed``: a training-step loop
whose closure over globally sharded params is re-created every step.

``run_pair()`` starts two processes of this module on 127.0.0.1 (a free
port, 4 CPU devices each, gloo collectives), each bounded by ``timeout``
seconds and killed on failure, and returns both processes' JSON reports:
per step, what the cached step raises, beside what stock ``jax.jit`` of
the same closure raises (a closure over an array spanning other processes'
devices is not allowed; the cache keeps such an array by identity, so
stock's trace raises stock's error), and whether the hand-hoisted step
(which passes the params as arguments) runs.

This is also how to run on a multi-host cluster: the same code, with
``coordinator_address`` the first host's address and one process per host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

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


def run_pair(timeout: float = 240.0) -> list[dict]:
  """Run the two processes; raise RuntimeError with their output on failure."""
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  env.pop("JAX_CLOSURE_CACHE", None)
  procs = [subprocess.Popen(
      [sys.executable, "-m", "jax_closure_cache.tools.multiprocess",
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


def _worker(port: int, pid: int) -> dict:
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                             num_processes=2, process_id=pid)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

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

  hoisted = jax.jit(step_math)
  report = {"cache_errors": [], "stock_errors": [],
            "process_count": jax.process_count(),
            "device_count": jax.device_count()}
  params = global_array(np.ones(8))
  for _ in range(STEPS):
    # the closure over the params is re-created every step
    report["cache_errors"].append(
        _error(jax, entrance.jit(lambda v: step_math(params, v)), x))
    report["stock_errors"].append(
        _error(jax, jax.jit(lambda v: step_math(params, v)), x))
    _, params = hoisted(params, x)
  report["hoisted_ran"] = bool(params.sharding == sharding)
  return report


def _error(jax, jitted, x) -> str | None:
  try:
    jax.block_until_ready(jitted(x))
  except Exception as e:   # what this jitted closure says
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"
  return None


if __name__ == "__main__":
  out = _worker(int(sys.argv[1]), int(sys.argv[2]))
  print(json.dumps(out), flush=True)
  sys.exit(0)
