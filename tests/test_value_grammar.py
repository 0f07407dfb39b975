"""The differential fuzzer over a grammar of Python values
(``value_grammar.py``): programs whose re-created closures reach atoms
(``1``, ``1.0``, ``True``, ``-0.0``, NaN, huge ints, strings, ...),
containers in different orders, dataclasses, enums, pytrees with state
outside their flatten, static and plain objects changed in place, class
attributes, NumPy and jax arrays, functions and runtime callbacks, through
cells, globals, defaults, partials, bound methods, class attributes, pytree
data and static arguments, called under ``jit``, ``grad``, ``vmap``,
``checkpoint``, a ``custom_jvp`` made in the closure, eager control flow and
a long-lived jitted function's static argument.

Each program runs once with stock ``jax.jit`` and twice with the cache in
verify mode, on fresh function objects every step. It fails if a result
(dtype, weak type, shape, sharding, value bit for bit but for ``rtol=1e-6``
where a Python float is drawn), an exception's type, a runtime callback's
log or a trace-time log differs from stock's, or if verify mode counted a
mismatch (a hit whose closure key shared a trace it should not have:
verify then answers with stock's result, so the mismatch is reported on
its own). ``--grammar-examples N`` (default 30; CI runs 60) and
``--grammar-seed S`` (default 0) set the budget; larger budgets and other
seeds still find the open classes listed in the contract's known limits; a failure names each failing program and
prints the first one, and a shrunk copy of it, with the line that replays
it.
"""

import faulthandler
import os
import time
import types

import pytest

import value_grammar

#: Seconds one program may take (about 1 s each on a 2-core CPU VM) before
#: the watchdog dumps every thread's stack and ends the process: a hang in
#: C (a corrupted OrderedDict iterated by ``stats()``, seen) holds the GIL,
#: so nothing short of ``faulthandler`` can report it.
PROGRAM_TIMEOUT_S = 120


def _runner(seed: int, index: int):
  """``check`` of program ``index``, in a frame named after it, so the
  watchdog's stack dump says which program hung."""
  def run():
    return value_grammar.check(value_grammar.generate(seed, index))
  code = run.__code__.replace(co_name=f"value_grammar_program_{index}"
                                      f"_of_seed_{seed}")
  return types.FunctionType(code, run.__globals__, code.co_name, None,
                            run.__closure__)


def _line(verdict) -> str:
  p = verdict.program
  kinds = ", ".join(f"{s.kind} via {s.carrier}" for s in p.slots)
  return (f"  program {p.index}: {'+'.join(verdict.categories())}; forms "
          f"{p.forms}; {kinds}")


def test_cache_agrees_with_stock_on_value_grammar_programs(request, capfd):
  n = request.config.getoption("--grammar-examples")
  seed = request.config.getoption("--grammar-seed")
  if not n:
    pytest.skip("--grammar-examples 0")
  with capfd.disabled():   # the terminal's stderr, for the watchdog
    watchdog = os.fdopen(os.dup(2), "w")
  start = time.perf_counter()
  failures = []
  try:
    for index in range(n):
      faulthandler.dump_traceback_later(PROGRAM_TIMEOUT_S, exit=True,
                                        file=watchdog)
      verdict = _runner(seed, index)()
      if verdict.failed:
        failures.append(verdict)
    elapsed = time.perf_counter() - start
    if not failures:
      return
    first = failures[0]
    faulthandler.dump_traceback_later(PROGRAM_TIMEOUT_S * 8, exit=True,
                                      file=watchdog)
    smaller = value_grammar.shrink(first, budget=24)
  finally:
    faulthandler.cancel_dump_traceback_later()
    watchdog.close()
  differ = [v for v in failures if v.diffs]
  mismatched = [v for v in failures if v.verify_mismatches]
  replay = (f'cd tests && python -c "import value_grammar as g; '
            f'print(g.check(g.generate({seed}, {{I}})))"')
  lines = [
      f"{len(failures)} of {n} value-grammar programs (seed {seed}, "
      f"{elapsed:.0f} s) failed: {len(differ)} differ from stock "
      f"(results, exceptions or side effects), {len(mismatched)} had verify "
      "mismatches (the closure key shared a trace; verify answered with "
      "stock's result).",
      "Failing programs:",
      *[_line(v) for v in failures[:40]],
      *(["  ..."] if len(failures) > 40 else []),
      "",
      "The first failing program:",
      first.report(),
      "",
      "Shrunk:" if smaller is not first else "(it did not shrink)",
      *([smaller.report()] if smaller is not first else []),
      "",
      f"Replay program I: {replay}, or pytest --grammar-seed {seed} "
      f"--grammar-examples {first.program.index + 1}",
  ]
  pytest.fail("\n".join(lines), pytrace=False)


def test_every_ten_programs_meet_the_focused_classes():
  """Any ten consecutive programs hold a dict whose insertion order changes
  between steps and a schedule whose later step makes the trace's Python
  arithmetic raise (under ``jit`` or ``grad``, no trace-time log): the
  classes a short budget would otherwise rarely meet."""
  for seed in (0, 1, 7):
    for start in range(0, 60, 10):
      programs = [value_grammar.generate(seed, i)
                  for i in range(start, start + 10)]
      slots = [(p, s) for p in programs for s in p.slots]
      assert any(s.kind == "dict" and len(
          {tuple(k for k, _ in spec[1]) for spec in s.specs}) > 1
                 for _, s in slots), (seed, start)
      assert any(
          (s.kind == "lr" and 0.0 in s.specs[1:]
           or s.kind == "count" and 2500 in s.specs[1:])
          and p.forms in (["jit"], ["grad"]) and not p.trace_log
          for p, s in slots), (seed, start)
