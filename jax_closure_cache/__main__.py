"""Command line: ``python -m jax_closure_cache bench [--json FILE] [--only ...]``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_closure_cache")
  sub = parser.add_subparsers(dest="command", required=True)
  bench = sub.add_parser(
      "bench", help="time stock jit, the cache and hand-hoisted jit")
  bench.add_argument("--json", metavar="FILE",
                     help="also write the figures to FILE as JSON")
  bench.add_argument("--calls", type=int, default=2000,
                     help="timed calls per path and round (default 2000)")
  bench.add_argument("--rounds", type=int, default=3,
                     help="alternating rounds; best median kept (default 3)")
  bench.add_argument("--only", choices=("jit", "control-flow"),
                     help="run one of the two tables")
  args = parser.parse_args(argv)

  if args.command == "bench":
    from jax_closure_cache import bench as bench_mod
    from jax_closure_cache import bench_control_flow
    report = {"machine": bench_mod.machine()}
    print(f"Machine: {report['machine']}")
    if args.only in (None, "jit"):
      rows = bench_mod.run(calls=args.calls, rounds=args.rounds)
      report["jit"] = rows
      print("\njit on re-created closures\n")
      print(bench_mod.format_table(rows))
    if args.only in (None, "control-flow"):
      rows, skipped = bench_control_flow.run()
      report["control_flow"] = rows
      report["skipped"] = skipped
      print("\nEager control flow with fresh closures\n")
      print(bench_control_flow.format_table(rows))
      for line in skipped:
        print(f"skipped: {line}")
    if args.json:
      with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    return 0
  return 2


if __name__ == "__main__":
  sys.exit(main())
