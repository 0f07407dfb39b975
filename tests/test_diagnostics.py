"""Explanations of misses and fallbacks, the storm guard, monitoring events
and the `run` summary."""

import functools
import logging
import os
import subprocess
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
from conftest import Unkeyable, needs_trace_lookup, stock_off, ticker


@pytest.fixture
def explain(monkeypatch, caplog):
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  return caplog


def messages(caplog):
  return [r.getMessage() for r in caplog.records if r.name == "jax_closure_cache"]


def test_miss_names_the_changed_cell(explain):
  """The changed cell is named when its key is met once (stock answers) and
  when it is met again (the miss that compiles its entry)."""
  def make(scale):
    return lambda x: x * scale
  x = jnp.ones(2)
  jcc.jit(make(2.0))(x)
  jcc.jit(make(3.0))(x)   # a key met once
  once = messages(explain)[-1]
  jcc.jit(make(3.0))(x)   # met again: the miss
  again = messages(explain)[-1]
  assert "fallback" in once and "key is new" in once, once
  assert "closure-cache miss" in again, again
  for text in (once, again):
    assert "cell 'scale' changed: 2.0 -> 3.0 (static float)" in text, text
    assert "test_diagnostics.py" in text   # file:line of the function


def test_miss_names_a_changed_default(explain):
  def make(n):
    def f(x, n=n):
      return x + n
    return f
  jcc.jit(make(3))(jnp.ones(2))
  jcc.jit(make(4))(jnp.ones(2))
  assert "default 'n' changed: 3 -> 4 (static int)" in messages(explain)[-1]


def test_retrace_names_the_global_array_that_changed(explain):
  ns = {}
  exec("def f(x):\n  return x @ W\n", ns)
  ns["W"] = jnp.eye(4)
  fresh = lambda: types.FunctionType(ns["f"].__code__, ns)   # a re-created def
  jcc.jit(fresh())(jnp.ones(4))   # stock's object
  jcc.jit(fresh())(jnp.ones(4))   # the shared entry
  ns["W"] = jnp.eye(8)
  jcc.jit(fresh())(jnp.ones(8))
  assert any("global 'W' changed: float32[4,4] -> float32[8,8]" in m
             for m in messages(explain))


def test_under_jaxs_own_explain_option_the_warnings_are_stocks(caplog,
                                                               monkeypatch):
  """JAX's ``jax_explain_cache_misses`` alone: the cache explains at INFO,
  and the WARNING lines are JAX's own, as many as stock logs where every
  call traces (closure-free functions re-made per call, and a closure's
  first object), as JAX's api_test counts them. (Their text may differ:
  JAX names the frame that traced, which can be the cache's.)"""
  monkeypatch.delenv("JAX_CLOSURE_CACHE_EXPLAIN", raising=False)

  def run():
    caplog.clear()
    with jax.explain_cache_misses(True), caplog.at_level(logging.INFO):
      for _ in range(2):
        jax.jit(lambda x: 2 * x)(3)
      jax.jit((lambda s: (lambda x: x * s))(2.0))(jnp.ones(2))
    return [(r.name, "never seen function" in r.getMessage())
            for r in caplog.records if r.levelno >= logging.WARNING]

  want = stock_off(run)
  assert want == [("jax._src.interpreters.partial_eval", True)] * 3, want
  jcc.enable()
  assert run() == want
  info = [r for r in caplog.records if r.name == "jax_closure_cache"]
  assert info and all(r.levelno == logging.INFO for r in info)
  assert any("closure-cache miss" in r.getMessage() for r in info)


def test_jit_of_a_generator_function_raises_stocks_error_at_once():
  """Stock's ``jit()`` refuses a generator function when it is called, a
  closure's too: so does the cache's, before any call."""
  def make(a):
    def gen(x):
      yield x + a
    return gen

  def gen_free(x):
    yield x

  jcc.enable()
  for fun in (make(1), make(2), gen_free, functools.partial(gen_free)):
    with pytest.raises(TypeError, match="got a generator function"):
      jax.jit(fun)
    with pytest.raises(TypeError, match="got a generator function"):
      jax.jit(fun, static_argnums=0)
    with pytest.raises(TypeError, match="got a generator function"):
      jcc.jit(fun)


def test_fallback_names_the_cell(explain):
  cfg = Unkeyable(2)
  jcc.jit(lambda x: x + cfg.n)(jnp.ones(2))
  assert "cell 'cfg' holds an unhashable Unkeyable" in messages(explain)[-1]

  def outer(x):
    return jcc.jit(lambda y: y * x)(1.0)
  jax.jvp(outer, (2.0,), (1.0,))
  assert any("cell 'x' holds a tracer" in m for m in messages(explain))


def test_nothing_is_logged_when_off(caplog, monkeypatch):
  monkeypatch.delenv("JAX_CLOSURE_CACHE_EXPLAIN", raising=False)
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  for s in (1.0, 2.0):
    jcc.jit((lambda s: (lambda x: x * s))(s))(jnp.ones(2))
  assert messages(caplog) == []


@pytest.fixture
def storms(caplog):
  """Storm threshold 3 for the test; yields a function listing the storm
  records logged so far."""
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  old = jcc.storm_threshold()
  jcc.set_storm_threshold(3)
  yield lambda: [r for r in caplog.records if "distinct closure keys" in r.getMessage()]
  jcc.set_storm_threshold(old)


def test_storm_guard_logs_once_at_the_users_line_naming_the_culprit(storms):
  def make(step):
    return lambda x: x * step
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # a -W error suite must not fail
    for i in range(8):   # a new value, so a new key, each time
      jcc.jit(make(0.1 * i))(jnp.ones(2))
  found = storms()
  assert len(found) == 1
  text = found[0].getMessage()
  assert "cell 'step' keeps changing" in text and "argument" in text
  assert found[0].levelno == logging.WARNING
  assert found[0].pathname == __file__   # the user's file, not ours
  assert found[0].lineno == make.__code__.co_firstlineno + 1


_STORM_GLOBAL = 0.0


def test_a_storm_of_a_closure_free_function_names_the_global(storms):
  """A closure-free function re-made while a global it reads changes: a
  key met twice is its canonical object's (``(options, key, *context)``),
  and the storm still names the global (it failed to unpack that key).
  The function is one tier A does not share, so each value is met once
  more by stock."""
  global _STORM_GLOBAL
  jcc.enable()
  try:
    for value in (0.05, 0.15, 0.15, 0.25, 0.35, 0.45, 0.55):
      _STORM_GLOBAL = value   # (met twice: a canonical object's key)

      def f(x):
        return jax.lax.lgamma(x + _STORM_GLOBAL)
      jax.jit(f)(jnp.ones(2))
  finally:
    jcc.disable()
  text = storms()[0].getMessage()
  assert "global '_STORM_GLOBAL' keeps changing" in text, text


def test_a_storm_of_changing_static_arguments_names_them(storms):
  """A re-created function whose static argument changes every call: the
  values sit in the binder's cell (``key/names.BINDER_VALUES_CELL``), and
  the message names them as the static arguments, not as that cell."""
  from jax_closure_cache.front import static_args
  from jax_closure_cache.key import names
  for binder in (static_args._binder, static_args._binder_of_one):
    inner = next(c for c in binder.__code__.co_consts
                 if hasattr(c, "co_freevars"))
    assert names.BINDER_VALUES_CELL in inner.co_freevars

  def make():
    def f(x, n):
      return x * n
    return f
  for i in range(8):
    jcc.jit(make(), static_argnums=1)(jnp.ones(2), i)
  text = storms()[0].getMessage()
  assert "its static arguments keep changing" in text, text
  assert f"cell {names.BINDER_VALUES_CELL!r}" not in text, text


def test_storm_guard_counts_per_user_function_not_per_launcher(storms):
  """Twelve different loop bodies, each compiled once, are no storm, although
  they share the launcher's code."""
  ns = {}
  exec("".join(f"def body{i}(i, c):\n  return c + {i}\n" for i in range(12)), ns)
  for i in range(12):
    jcc.lax.fori_loop(0, 3, ns[f"body{i}"], jnp.float32(0))
  assert storms() == []


def test_storm_message_prints_dtypes_readably(storms):
  def make(dt):
    return lambda x: x.astype(dt)
  for dt in (jnp.float32, jnp.int32, jnp.float16, jnp.int8, jnp.uint8):
    jcc.jit(make(dt))(jnp.ones(2))
  text = storms()[0].getMessage()
  assert "object at 0x" not in text, text
  assert sum(n in text for n in ("float32", "int32", "float16", "int8", "uint8")) >= 2


def test_storm_threshold_from_environment():
  code = ("import jax_closure_cache as jcc;"
          "print(jcc.storm_threshold())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env=dict(os.environ,
                                           JAX_CLOSURE_CACHE_STORM_THRESHOLD="5"))
  assert out.stdout.strip() == "5", out.stderr


def test_monitoring_events_reach_jax_listeners():
  events = []
  def listener(event, **kwargs):
    if event.startswith("/jax_closure_cache/"):
      events.append((event, kwargs))
  jax.monitoring.register_event_listener(listener)
  try:
    make = lambda a: (lambda x: x * a)
    jcc.jit(make(jnp.full(2, 2.0)))(jnp.ones(2))   # stock's object
    jcc.jit(make(jnp.full(2, 2.0)))(jnp.ones(2))   # the shared entry
    jcc.jit(make(jnp.full(2, 3.0)))(jnp.ones(2))
    jcc.jit((lambda u: (lambda x: x * u.n))(Unkeyable(1)))(jnp.ones(2))
  finally:
    jax.monitoring.unregister_event_listener(listener)
  assert [e for e, _ in events] == ["/jax_closure_cache/miss",
                                    "/jax_closure_cache/miss",
                                    "/jax_closure_cache/hit",
                                    "/jax_closure_cache/fallback"]
  assert events[3][1] == {"reason": "unhashable"}


def test_run_command_summarises(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(
      "import sys\n"
      "import jax, jax.numpy as jnp\n"
      "def step(w, x):\n"
      "  return jax.jit(lambda x: x @ w)(x)\n"
      "for i in range(5):\n"
      "  step(jnp.eye(2) * i, jnp.ones(2))\n"
      "print('args', sys.argv[1:])\n")
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache", "run",
                        str(script), "--lr", "1"], capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert "args ['--lr', '1']" in out.stdout
  assert "3 hits, 2 misses, 0 fallbacks" in out.stderr
  assert "trace+compile time avoided:" in out.stderr
  assert "train.py:4" in out.stderr


def test_run_reports_time_avoided_for_a_closure_free_inner_function(tmp_path):
  """Seed 001's script: the inner function has no closure, so its first
  object is stock's own and its second gets the code's canonical stock
  object, which compiles inside stock; JAX's duration events give that
  compile's cost to the entry, which the third call hits."""
  script = tmp_path / "seed.py"
  script.write_text(
      "import jax, jax.numpy as jnp\n"
      "def outer(a):\n"
      "  def inner(x):\n"
      "    return x * 2\n"
      "  return jax.jit(inner)(a)\n"
      "a = jnp.ones((3, 4))\n"
      "for _ in range(3):\n"
      "  outer(a)\n")
  out = subprocess.run([sys.executable, "-m", "jax_closure_cache", "run",
                        str(script)], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr
  assert "1 hits, 2 misses" in out.stderr
  avoided = float(out.stderr.split("trace+compile time avoided:")[1].split()[0])
  assert avoided > 0.0, out.stderr


def test_a_function_in_an_arguments_static_part_is_explained(explain):
  """A fresh function in a pytree's aux data: JAX's caches compare it by
  ``==``, so the closure key leaves the call to stock, and the explanation
  says which node holds it."""
  import dataclasses

  @jax.tree_util.register_dataclass
  @dataclasses.dataclass
  class S:
    x: jax.Array
    fn: object = dataclasses.field(metadata=dict(static=True))

  w = jnp.ones(2)
  make = lambda: jcc.jit(lambda s: s.fn(s.x) * w)
  make()(S(jnp.ones(2), lambda v: v + 1))
  make()(S(jnp.ones(2), lambda v: v + 1))
  make()(S(jnp.ones(2), lambda v: v + 2))
  assert jcc.stats()["fallback_reasons"] == {"argument_node_data": 2}
  text = " ".join(messages(explain))
  assert "an argument's S node holds data JAX's cache compares by ==" in text


def test_second_object_of_a_code_is_explained_as_by_design(explain):
  """The second object of a code with the first one's contents is the
  designed second miss (the first was stock's), not an eviction."""
  x = jnp.ones(2)
  w = jnp.full(2, 2.0)   # (not ones: stock's module folds v * 1)
  make = lambda w: (lambda v: v * w)
  jcc.jit(make(w))(x)
  jcc.jit(make(w))(x)
  text = messages(explain)[-1]
  assert "first function object of this code, which stock jit traced" in text
  assert "evicted" not in text


def test_an_uncovered_capture_without_roots_says_so_plainly(explain):
  """An array made at trace time from something the key does not cover (a
  ticker a wrapper rule hides: two traces make different values; a clock,
  which this test read before, now has no key at all), with no object kept
  by identity: the explanation says there was nowhere to look, without a
  double negative."""
  x = jnp.ones(2)
  with ticker() as ticks:
    def make(w):
      def f(v):
        with jax.ensure_compile_time_eval():
          t = jnp.asarray(ticks.tick())
        return v * w + t * 0.0
      return f
    for i in range(3):
      jcc.jit(make(jnp.full(2, float(i))))(x)
  text = " ".join(messages(explain))
  assert "not found under no object" not in text
  assert "keeps no object by identity to look for them under" in text


@needs_trace_lookup   # the module remembers keys as JAX's lookup finds them
def test_jax_and_the_front_name_a_closure_difference_alike(explain):
  """One miss explanation: the closure key module's ``explain_miss`` (what
  JAX's ``pe.explain`` prints with the series) asks the walk in use for the
  first difference, and the package's walk answers with the names its own
  log uses, so both say ``cell 'scale' changed: 2 -> 3``."""
  from jax_closure_cache.lookup import closure_cache
  jcc.enable()   # the package's walk in use, and JAX's lookup patched

  def make(scale):
    return lambda v: v * scale
  x = jnp.ones(2)
  for scale in (2, 3):   # one code, so the module remembers the first key
    fun = make(scale)
    jax_says = closure_cache.explain_miss(fun)
    jcc.jit(fun)(x)
  assert "its closure differs at cell 'scale' changed: 2 -> 3" in jax_says
  assert any("cell 'scale' changed: 2 -> 3" in m for m in messages(explain))


def test_an_explanation_that_fails_is_a_sentence_not_an_error(monkeypatch):
  """Explanations never raise into the call they explain."""
  from jax_closure_cache import explain
  from jax_closure_cache.key import names

  def broken(*args, **kwargs):
    raise ValueError("a key shape the namer does not know")

  monkeypatch.setattr(names, "named_parts", broken)
  monkeypatch.setattr(explain, "differences", broken)
  out = explain.explain_miss(None, ((), ("k",)), [((), ("j",))])
  assert out == ["(this explanation failed: ValueError: a key shape the "
                 "namer does not know)"]


def test_a_canonical_objects_miss_is_explained(explain):
  """A closure-free lambda made per call: its code's first object is
  stock's, the second is answered by a canonical stock object, whose key
  also holds the captured-constants threshold and the PRNG options; its
  miss is explained like any other, and a change of those named."""
  jcc.enable()
  x = jnp.ones(2)
  for _ in range(2):
    jcc.jit(lambda a: a * 2.0)(x)
  text = " ".join(messages(explain))
  assert "closure-cache miss for " in text
  assert "explanation failed" not in text
  assert "threshold" not in text
  from jax_closure_cache import explain as explain_module
  old = ((), ("k",), 64, "threefry")
  assert explain_module.explain_miss(None, ((), ("k",), 128, "threefry"),
                                     [old])[0].startswith(
      "the captured-constants threshold or the PRNG options changed")
