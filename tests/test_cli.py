"""The benchmark command runs and writes its figures (no timing asserted)."""

import json
import subprocess
import sys


def test_bench_jit_table_smoke(tmp_path):
  out_file = tmp_path / "bench.json"
  out = subprocess.run(
      [sys.executable, "-m", "jax_closure_cache", "bench", "--only", "jit",
       "--calls", "3", "--rounds", "1", "--match", "seed001,long-lived",
       "--json", str(out_file)],
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  assert "seed001 tanh(x@w) 4x4" in out.stdout and "Machine:" in out.stdout
  report = json.loads(out_file.read_text())
  assert len(report["jit"]) == 8   # two seed001 rows, six long-lived ones
  for row in report["jit"]:
    assert row["cache_compiles"] == 0 and row["cache_traces"] == 0
  baselines = {r["workload"]: r["baseline"] for r in report["jit"]}
  assert baselines["long-lived closure over 100 small arrays"] == "stock"
  assert baselines["seed001 tanh(x@w) 4x4"] == "hoisted"


def test_plot_writes_a_png(tmp_path):
  """``bench --plot``: a valid PNG of the loop and the per-row ratios."""
  import pytest
  pytest.importorskip("matplotlib")
  from jax_closure_cache.tools import bench_plot
  path = tmp_path / "bench.png"
  report = {"machine": "test", "jit": [
      {"workload": "seed001 tanh(x@w) 4x4", "cache_over_hoisted": 1.2},
      {"workload": "long-lived closure tanh(x@w) 4x4",
       "cache_over_hoisted": 1.0}]}
  bench_plot.write(str(path), report, calls=4)
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
