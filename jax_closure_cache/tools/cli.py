"""Command line.

``python -m jax_closure_cache bench [--full] [--plot FILE.png] [--json FILE] [--only jit|control-flow|tier-a|hit-path|ecosystem|scale|upstream|memory] [--match A,B]``
  times stock jit, the cache and hand-hoisted jit.
``python -m jax_closure_cache run SCRIPT [ARGS...]``
  runs SCRIPT with the cache on, then prints what the cache did.
``python -m jax_closure_cache doctor``
  checks versions, patch points, the start-up hook; exit 1 on a mismatch.
``python -m jax_closure_cache patch apply|check|revert [--target DIR]``
  the upstream pull requests on the installed jax or a copy (patch_tool).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys


def _parser() -> argparse.ArgumentParser:
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
  bench.add_argument("--match", default="", metavar="A,B",
                     help="only workloads whose name (jit table) or key (control-flow "
                     "table: decode, minimize, scan, fori, odeint, cg, gpt2; "
                     "hit-path table: nested-def, global-def, grad, value-and-grad, "
                     "partial, static-lambda, vmap, scan, fori, cg, "
                     "long-lived; "
                     "ecosystem table: library or idiom, e.g. optax, linen) "
                     "contains A or B")
  bench.add_argument("--full", action="store_true",
                     help="every row of every table (README's full "
                     "tables; about 12 minutes on 2 cores). Without it, and "
                     "without --only, a quick headline set (under 2 minutes)")
  bench.add_argument("--plot", metavar="FILE.png",
                     help="also draw per-call time over seed 001's loop "
                     "(stock, cache, hoisted) and cache/baseline per row "
                     "(pip install '.[plot]')")
  bench.add_argument("--only", choices=("jit", "control-flow", "tier-a",
                                        "hit-path", "ecosystem", "scale",
                                        "upstream", "memory"),
                     help="run one of the tables (hit-path: a hit against "
                     "the hoisted call plus the user's own wrappers' "
                     "construction, one row per re-created-function "
                     "pattern; ecosystem: optax, "
                     "equinox, flax and dm-haiku idioms, pip install "
                     "'.[ecosystem]'; scale: sharded and "
                     "two-process rows, each in its own processes; upstream: "
                     "the pull requests with their option off against pristine jax; "
                     "memory: what never-repeating keys keep alive)")
  sub.add_parser("doctor", help="check jax versions, patch points, the "
                 "start-up hook and whether the cache is active")
  patch = sub.add_parser(
      "patch", help="apply, check or revert the upstream pull requests on a "
      "jax copy (exit 0 done/applied, 1 nothing to do/not applied, "
      "2 conflicting, 3 not a release they are cut for)")
  patch.add_argument("action", choices=("apply", "check", "revert"))
  patch.add_argument("--target", metavar="DIR", default=None,
                     help="folder containing jax/ (default: the installed jax)")
  run = sub.add_parser(
      "run", help="run a script with the cache on and summarise at exit")
  run.add_argument("script")
  run.add_argument("args", nargs=argparse.REMAINDER)
  return parser


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  if args.command == "run":
    return _run_script(args.script, args.args)
  if args.command == "doctor":
    from jax_closure_cache.tools import doctor
    return doctor.main(startup_hook_path())
  if args.command == "patch":
    return _patch(args)
  if args.command == "bench":
    return _bench(args)
  return 2


def _patch(args) -> int:
  from jax_closure_cache.tools import patch_tool
  target = args.target or patch_tool.default_target()
  action = {"apply": patch_tool.apply, "check": patch_tool.status,
            "revert": patch_tool.revert}[args.action]
  try:
    code, message = action(target)
  except patch_tool.PatchError as e:
    code, message = e.code, str(e)
  print(message)
  return code


def _bench(args) -> int:
  from jax_closure_cache.tools import bench as bench_mod
  from jax_closure_cache.tools import bench_control_flow, bench_workloads
  report = {"machine": bench_mod.machine()}
  print(f"Machine: {report['machine']}")
  quick = not args.full and args.only is None and not args.match
  if quick:
    print("Quick headline set (--full for every table)")
  if args.only in (None, "jit"):
    match = tuple(m for m in args.match.split(",") if m)
    rows = bench_mod.run(calls=args.calls, rounds=args.rounds,
                         match=bench_workloads.QUICK if quick else match)
    report["jit"] = rows
    print("\njit on re-created closures\n")
    print(bench_mod.format_table(rows))
  if args.only in (None, "control-flow"):
    match = (["decode"] if quick else
             [m for m in args.match.split(",") if m])
    rows, skipped = bench_control_flow.run(
        [k for k in bench_control_flow.WORKLOADS if any(m in k for m in match)]
        if match else None)
    report["control_flow"] = rows
    report["skipped"] = skipped
    print("\nEager control flow with fresh closures\n")
    print(bench_control_flow.format_table(rows))
    for line in skipped:
      print(f"skipped: {line}")
  if args.only in (None, "tier-a"):
    from jax_closure_cache.tools import bench_tier_a
    rows = bench_tier_a.run()
    report["tier_a"] = rows
    print("\nTier A: library-shaped workloads, a fresh function per call "
          "(stock's trace, the shared executable)\n")
    print(bench_tier_a.format_table(rows))
  if args.only in (None, "hit-path"):
    from jax_closure_cache.tools import bench_hit_path
    match = [m for m in args.match.split(",") if m]
    names = (bench_hit_path.QUICK if quick else
             [k for k in bench_hit_path.ROWS if any(m in k for m in match)]
             if match else None)
    rows = bench_hit_path.run(names, calls=args.calls, rounds=args.rounds)
    report["hit_path"] = rows
    print("\nThe hit path: a re-created function with the cache against the "
          "hoisted call plus the construction of the user's own wrappers "
          "(per call, interleaved blocks)\n")
    print(bench_hit_path.format_table(rows))
  if args.only == "ecosystem":
    from jax_closure_cache.tools import bench_ecosystem
    rows, skipped = bench_ecosystem.run(
        match=[m for m in args.match.split(",") if m], rounds=args.rounds)
    report["ecosystem"] = rows
    report["ecosystem_skipped"] = skipped
    print("\nReal libraries' fresh-closure idioms: median per call of calls "
          "3-6 (target: stock / cache >= 5x)\n")
    if rows:
      print(bench_ecosystem.format_table(rows))
    for line in skipped:
      print(f"skipped: {line}")
  if args.only == "scale" or (args.only is None and not quick):
    from jax_closure_cache.tools import bench_scale
    rows = bench_scale.run()
    report["scale"] = rows
    print("\nScaling out: closures over sharded arrays (kept by identity, "
          "as stock bakes them)\n")
    print(bench_scale.format_table(rows))
  if args.only == "upstream" or (args.only is None and not quick):
    from jax_closure_cache.tools import bench_upstream
    if _compat_carries_pull_requests():
      print("\nupstream: skipped (the installed jax carries the pull "
            "requests)")
    else:
      rows = bench_upstream.run()
      report["upstream"] = rows
      print("\nThe upstream pull requests with their option off, against "
            "pristine jax\n")
      print(bench_upstream.table(rows))
  if args.only == "memory" or (args.only is None and not quick):
    from jax_closure_cache.tools import bench_memory
    rows = bench_memory.run()
    report["memory"] = rows
    print(f"\nA new Python float in the closure each step "
          f"({bench_memory.STEPS} steps, one process per way)\n")
    print(bench_memory.format_table(rows))
  if args.plot:
    from jax_closure_cache.tools import bench_plot
    bench_plot.write(args.plot, report)
    print(f"\nwrote {args.plot}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  return 0


def _compat_carries_pull_requests() -> bool:
  from jax_closure_cache import _compat
  return _compat.jax_carries_pull_requests()


def startup_hook_path() -> str | None:
  """Where the installed start-up hook is, if it is installed."""
  import os
  import site
  import sysconfig
  dirs = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
  for d in dirs:
    path = os.path.join(d, "jax_closure_cache_startup.pth")
    if os.path.exists(path):
      return path
  return None


def _run_script(script: str, script_args: list[str]) -> int:
  import jax_closure_cache
  jax_closure_cache.enable()
  sys.argv = [script, *script_args]
  code = 0
  try:
    runpy.run_path(script, run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    print(format_summary(), file=sys.stderr)
  return code


def format_summary(top: int = 10) -> str:
  from jax_closure_cache import diagnostics
  s = diagnostics.summary(top)
  reasons = ", ".join(f"{r}: {n}" for r, n in sorted(s["fallback_reasons"].items()))
  lines = [
      "",
      f"jax_closure_cache: {s['hits']} hits, {s['misses']} misses, "
      f"{s['fallbacks']} fallbacks" + (f" ({reasons})" if reasons else ""),
      f"trace+compile time avoided: {s['seconds_avoided']:.3f} s "
      "(each hit times its entry's first-miss trace+compile time)",
  ]
  if s["locations"]:
    lines.append(f"{'hits':>8} {'misses':>7} {'fallbacks':>9} {'avoided s':>10}  location")
    for row in s["locations"]:
      lines.append(f"{row['hits']:>8} {row['misses']:>7} "
                   f"{sum(row['fallbacks'].values()):>9} "
                   f"{row['seconds_avoided']:>10.3f}  {row['location']}")
  return "\n".join(lines)

