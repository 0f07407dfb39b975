"""Shared fixtures: every test starts with an empty cache and stock jax.jit."""

import contextlib

import jax
import pytest
from jax._src import test_util as jtu

import jax_closure_cache as jcc

STOCK_JIT = jax.jit


@pytest.fixture(autouse=True)
def fresh_cache():
  jcc.disable()
  jcc.clear()
  yield
  jcc.disable()
  jcc.clear()
  assert jax.jit is STOCK_JIT


@contextlib.contextmanager
def counting():
  """Yields a dict filled on exit with JAX's own trace and compile counts."""
  counts = {}
  with jtu.count_jit_tracing_cache_miss() as traces, \
       jtu.count_jit_compilation_cache_miss() as compiles:
    yield counts
  counts["traces"] = traces()
  counts["compiles"] = compiles()
