"""``bench --only hit-path``: its rows, its quick subset, and a smoke run (no
timing asserted)."""

import json
import subprocess
import sys

import pytest

from jax_closure_cache import _compat, patching
from jax_closure_cache.tools import bench_hit_path
from jax_closure_cache.tools import cli

PATTERNS = ("nested-def", "global-def", "grad", "value-and-grad", "partial",
            "static-lambda", "vmap", "scan", "fori", "cg", "long-lived")


def test_rows_and_quick_set():
  assert tuple(bench_hit_path.ROWS) == PATTERNS
  assert set(bench_hit_path.QUICK) == {"grad", "partial", "vmap", "scan"}
  args = cli._parser().parse_args(["bench", "--only", "hit-path"])
  assert args.only == "hit-path"


def test_hit_path_smoke(tmp_path):
  out_file = tmp_path / "bench.json"
  out = subprocess.run(
      [sys.executable, "-m", "jax_closure_cache", "bench", "--only",
       "hit-path", "--calls", "3", "--rounds", "1", "--match",
       "nested-def,partial,long-lived", "--json", str(out_file)],
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  assert "cache / (baseline + construction)" in out.stdout
  report = json.loads(out_file.read_text())
  rows = {r["key"]: r for r in report["hit_path"]}
  assert set(rows) == {"nested-def", "partial", "long-lived"}
  for r in rows.values():
    assert r["max_abs_diff_vs_stock"] == 0.0
    assert r["cache_traces"] == 0 and r["cache_compiles"] == 0
    assert r["cache_calls"] == 3
  assert rows["long-lived"]["baseline"] == "stock"
  assert rows["long-lived"]["construction_us"] is None
  assert rows["nested-def"]["baseline"] == "hoisted"
  # a re-created nested def hits through the inline matcher every call
  assert rows["nested-def"]["paths"]["fast_hits"] == 3


@pytest.mark.parametrize("key", sorted(set(bench_hit_path.ROWS)
                                       - {"long-lived"}))
def test_every_re_created_pattern_hits_through_a_matcher(key, monkeypatch):
  """Each pattern's hits take its code's generated front, never a new walk
  of the function nor the generic path's matcher: a library class the
  walk stopped taking for a library's (a dataclass of jax's whose methods
  ``dataclasses`` compiled from a string, as ``vmap``'s axis data is)
  sent every hit of that row down the slow path, and fronts dropped on
  leaving ``check()``'s ``enabled()`` block sent them all down the generic
  one. Counted with the package's own path counts and the generic hit's
  calls, no timing; the answers are stock's."""
  from jax_closure_cache.front import wrapper
  generic = []
  hit = wrapper._hit

  def counted(*args):
    generic.append(1)
    return hit(*args)
  row = bench_hit_path.ROWS[key]()
  assert bench_hit_path.check(row) == 0.0
  with patching.enabled():
    for i in range(6):   # a code's first object, a compile, first hits
      row.cached(i)
    monkeypatch.setattr(wrapper, "_hit", counted)
    before = bench_hit_path.path_counts()
    with _compat.count_traces() as traces, _compat.count_compiles() as compiles:
      for i in range(6, 12):
        row.cached(i)
    paths = bench_hit_path.counts_since(bench_hit_path.path_counts(), before)
  assert (traces(), compiles()) == (0, 0)
  assert paths["fast_hits"] == 6, paths
  assert not generic, f"{len(generic)} of 6 hits took the generic path"
