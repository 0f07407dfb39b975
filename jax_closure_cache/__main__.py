"""Command line: ``python -m jax_closure_cache bench [--json FILE]``."""

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
  args = parser.parse_args(argv)

  if args.command == "bench":
    from jax_closure_cache import bench as bench_mod
    rows = bench_mod.run(calls=args.calls, rounds=args.rounds)
    print(f"Machine: {bench_mod.machine()}")
    print(bench_mod.format_table(rows))
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"machine": bench_mod.machine(), "rows": rows}, f, indent=2)
    return 0
  return 2


if __name__ == "__main__":
  sys.exit(main())
