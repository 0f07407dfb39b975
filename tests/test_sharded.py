"""Closures over sharded arrays (8 host devices) and over global arrays
spanning two processes (jax.distributed on 127.0.0.1). Both run in
subprocesses bounded by timeouts: the device count and the distributed
runtime must be set before jax initialises."""

import os
import subprocess
import sys

import pytest

from jax_closure_cache.tools import multiprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def test_sharded_closures_on_eight_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("JAX_CLOSURE_CACHE", None)
  out = subprocess.run([sys.executable, os.path.join(HERE, "sharded_worker.py")],
                       capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stdout + out.stderr
  for what in ("(data, model)-sharded weight", "replicated weight",
               "weight over both axes", "user in_shardings",
               "one in_sharding for every argument", "under set_mesh",
               "shard_map body", "while_loop", "Auto mesh",
               "uncommitted argument"):
    assert f"ok {what}" in out.stdout, (what, out.stdout)


# Output that means this platform cannot start two JAX processes, as opposed
# to a failure of the cache.
_CANNOT_START = ("gloo", "Unable to initialize backend", "DEADLINE_EXCEEDED",
                 "Address already in use")


def test_two_processes_close_over_global_arrays_as_stock():
  """A closure over params spanning both processes' devices, re-created
  every step: the cache keeps such an array by identity, so every step
  raises stock's error (stock refuses to close over it)."""
  try:
    reports = multiprocess.run_pair(timeout=240)
  except RuntimeError as e:
    text = str(e)
    if "Traceback" in text and any(s in text for s in _CANNOT_START) \
        and "jax_closure_cache/closure" not in text:
      pytest.skip("this platform cannot start two jax.distributed CPU "
                  f"processes on 127.0.0.1: {text.splitlines()[-1]}")
    raise
  assert len(reports) == 2
  for report in reports:   # each process
    assert report["process_count"] == 2 and report["device_count"] == 8
    assert report["hoisted_ran"], report
    assert report["cache_errors"] == report["stock_errors"], report
    assert all(e and "non-addressable" in e for e in report["stock_errors"])
