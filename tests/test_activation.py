"""enable/disable/enabled, the environment flag and the start-up hook."""

import os
import subprocess
import sys
import sysconfig
import threading

import jax
import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import _compat
from conftest import ROUTING_PROBE, STOCK_JIT


def test_enable_disable_restore_exact_original():
  jcc.enable()
  jcc.enable()   # idempotent
  assert jcc.is_enabled()
  assert jax.jit is jcc.jit   # the fast front
  jcc.disable()
  jcc.disable()
  assert jax.jit is STOCK_JIT and not jcc.is_enabled()


def test_enable_switches_tiers_while_on():
  """``enable(closure_key=...)`` while the cache is on switches the tiers
  installed (as at start-up by ``JAX_CLOSURE_CACHE=1``, then tier A alone
  asked for): it is never silently ignored; without the keyword a second
  ``enable()`` keeps what is installed."""
  w = jnp.arange(4.0) + 0.5

  def calls():
    jcc.clear()
    for _ in range(3):
      jax.jit(lambda x: x * w + 1.0)(jnp.ones(4))
    stats = jcc.stats()
    return stats["hits"], stats["tier_a"]["hits"]
  try:
    jcc.enable()
    assert calls()[0] >= 1
    jcc.enable(closure_key=False)
    assert jcc.is_enabled() and jax.jit is STOCK_JIT   # tier A alone
    tier_b, tier_a = calls()
    assert tier_b == 0 and tier_a >= 1
    jcc.enable()   # keeps tier A alone
    assert jax.jit is STOCK_JIT
    jcc.enable(closure_key=True)
    assert jax.jit is jcc.jit and calls()[0] >= 1
  finally:
    jcc.disable()
  assert jax.jit is STOCK_JIT and not jcc.is_enabled()


def test_disable_leaves_jaxs_tracer_and_error_classes_as_they_were():
  """The concreteness watch patches JAX's tracer class, its jaxpr tracer
  and its conversion errors: ``disable()`` puts back each class's own
  namespace exactly, and defines nothing on a class that only inherited
  it."""
  from jax._src import core
  from jax._src.interpreters import partial_eval as pe
  classes = [core.Tracer, pe.DynamicJaxprTracer,
             *_compat.trace.VALUE_ERRORS]
  before = [dict(vars(c)) for c in classes]
  device_get = jax.device_get
  jcc.enable()
  assert any(dict(vars(c)) != b for c, b in zip(classes, before))
  jcc.disable()
  for c, b in zip(classes, before):
    now = dict(vars(c))
    assert now.keys() == b.keys(), c
    assert all(now[k] is b[k] for k in b), c
  assert jax.device_get is device_get


def test_outside_a_lifted_trace_tracers_answer_as_stocks():
  """With the cache on and no lifted trace running, a tracer's answers to
  what it lacks (``hasattr(t, "sharding")``, a missing attribute, its
  ``repr``, ``jax.device_get``) are stock's, and nothing is reported."""
  def probe(x):
    found = (hasattr(x, "sharding"), hasattr(x, "device"),
             hasattr(x, "no_such_attribute"), repr(x),
             jax.device_get(x) is x)
    seen.append(found)
    return x * 2.0
  seen = []
  jcc.disable()
  STOCK_JIT(probe)(jnp.ones(2))
  jcc.enable()
  jax.jit(probe)(jnp.ones(2, jnp.int32))   # each call traces: a new signature
  STOCK_JIT(probe)(jnp.ones(3))
  assert len(seen) == 3, seen
  for found in seen[1:]:
    assert found[:3] == seen[0][:3] and found[4] == seen[0][4], seen
    assert found[3].split("(")[0] == seen[0][3].split("(")[0], seen
  assert "asks_lifted_value" not in jcc.stats()["fallback_reasons"]


def test_enabled_restores_previous_state_even_nested():
  with jcc.enabled():
    assert jcc.is_enabled()
    with jcc.enabled():
      assert jcc.is_enabled()
    assert jcc.is_enabled()   # the outer block is still on
  assert not jcc.is_enabled() and jax.jit is STOCK_JIT
  jcc.enable()
  with jcc.enabled(lift_numpy=True):
    pass
  assert jcc.is_enabled()   # inside enable(): stays enabled


def test_enable_is_thread_safe():
  def flip():
    for _ in range(200):
      jcc.enable()
      jcc.disable()
  threads = [threading.Thread(target=flip) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert jax.jit is STOCK_JIT


def run_python(code, value):
  env = dict(os.environ)
  env.pop("JAX_CLOSURE_CACHE", None)
  if value is not None:
    env["JAX_CLOSURE_CACHE"] = value
  return subprocess.run([sys.executable, "-c", code], env=env,
                        capture_output=True, text=True, timeout=300)


IMPORT_THEN_JAX = "import jax_closure_cache\nfrom jax import jit\n" + ROUTING_PROBE


@pytest.mark.parametrize("value,patched", [
    ("1", True), ("TRUE", True), ("yes", True), ("on", True),
    (None, False), ("", False), ("0", False), ("false", False), ("no", False),
    ("off", False)])
def test_env_flag_values(value, patched):
  out = run_python(IMPORT_THEN_JAX, value)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == str(patched)
  assert "Warning" not in out.stderr


def test_env_flag_garbage_warns_and_stays_stock():
  out = run_python(IMPORT_THEN_JAX, "maybe")
  assert out.returncode == 0 and out.stdout.strip() == "False"
  assert out.stderr.count("JAX_CLOSURE_CACHE='maybe'") == 1


HOOK_CHECK = ("import sys\n"
              "print('jax' in sys.modules)\n"
              "from jax import jit   # a library binding jit at import time\n"
              + ROUTING_PROBE)


def installed_hook():
  path = os.path.join(sysconfig.get_paths()["purelib"],
                      "jax_closure_cache_startup.pth")
  return os.path.exists(path)


@pytest.mark.skipif(not installed_hook(), reason="package not pip-installed")
def test_startup_hook_patches_before_user_code_without_importing_jax():
  out = run_python(HOOK_CHECK, "1")
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["False", "True"]
  off = run_python("import sys; print('jax_closure_cache' in sys.modules)", None)
  assert off.stdout.strip() == "False"


@pytest.mark.parametrize("first", ["jax_closure_cache.front.wrapper",
                                   "jax_closure_cache.lax",
                                   "jax_closure_cache.control_flow.launchers"])
def test_env_activation_when_the_first_import_is_a_submodule(first):
  """The submodule imports jax mid-import, so enabling waits; the first use
  of jax.jit finishes it, and disable() still restores stock's object."""
  code = (f"import {first}\n"
          "import jax\n"
          "original = jax.jit.__wrapped__\n"
          "from jax import jit\n"
          + ROUTING_PROBE +
          "jcc.disable()\n"
          "print(jax.jit is original)\n")
  out = run_python(code, "1")
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["True", "True"]
