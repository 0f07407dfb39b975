"""What real libraries hold, in pure JAX: each pattern a closure made afresh
per call, run twice in verify mode against stock on fresh function objects,
with JAX's counters: from the third call on, nothing compiles (tier B keys
it, or tier A shares the executable after stock's trace), and every result
is stock's (dtype, weak type, value)."""

import functools
import importlib.util
import inspect
import logging
import os
import sys
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import counting, stock_off, varied

X = jnp.linspace(-1.0, 1.0, 4)
WS = [varied(4, 0.5 + 0.3 * i) for i in range(4)]   # (never all 1.0)


class OptState(NamedTuple):
  """An optimizer state's type, read as a global by the update function."""
  mu: jax.Array
  count: jax.Array


def namedtuple_update(i):
  w = WS[i % 4]

  def update(x):
    s = OptState(x * w, jnp.zeros((), jnp.int32))
    return OptState(s.mu * 0.9 + x, s.count + 1)
  return update


def with_attributes(i):
  w = WS[i % 4]

  def f(x):
    return jnp.tanh(x * w)
  f.__signature__ = inspect.signature(lambda x: None)   # a decorator's
  f.tag = "layer"
  return f


def _lazy_module():
  name = "json"   # a standard-library module, loaded lazily
  spec = importlib.util.find_spec(name)
  loader = importlib.util.LazyLoader(spec.loader)
  spec.loader = loader
  module = importlib.util.module_from_spec(spec)
  loader.exec_module(module)
  return module


LAZY = _lazy_module()


def lazy_submodule(i):
  w = WS[i % 4]

  def f(x):
    return x * w * len(LAZY.__name__)
  return f


class Logged:
  """A class whose __init__ logs through a logging.Logger."""
  log = logging.getLogger("library_patterns")

  def __init__(self, w):
    self.log.debug("made")
    self.w = w
    self.logger = self.log


def logging_object(i):
  m = Logged(WS[i % 4])
  return lambda x: jnp.sin(x) * m.w


REGISTRY = {float: 2.0, int: 3, jax.Array: 4.0}   # a registry keyed by types


def type_registry(i):
  w = WS[i % 4]

  def f(x):
    return x * w * REGISTRY[jax.Array]
  return f


def _where(path):
  return os.path.dirname(path)   # never called at trace time


def helper_calling_os(i):
  w = WS[i % 4]
  log_dir = functools.partial(_where, "/tmp/x")

  def f(x, debug=False):
    if debug:
      log_dir()
    return x + w
  return f


class Model:
  """A method jitted with static ``self`` on an object that holds another
  jitted function (the walk of ``self`` reaches a jit wrapper)."""

  def __init__(self, w):
    self.w = w
    self.act = jax.jit(jnp.tanh)

  @functools.partial(jax.jit, static_argnames="self")
  def scaled(self, x):
    return self.act(x * self.w) + 1.0


def static_self_methods(i):
  m = Model(WS[i % 4])
  return lambda x: m.scaled(x)


_DEFAULT = object()


@jax.tree_util.register_pytree_node_class
class Layer:
  """A pytree whose aux data holds a default object made afresh per
  instance and compared by identity."""

  def __init__(self, w, config=None):
    self.w = w
    self.config = config if config is not None else types.SimpleNamespace()

  def tree_flatten(self):
    return (self.w,), self.config

  @classmethod
  def tree_unflatten(cls, config, children):
    return cls(*children, config)


def fresh_aux_default(i):
  layer = Layer(WS[i % 4])
  return lambda x: x * layer.w


PATTERNS = {
    "namedtuple_class_global": namedtuple_update,
    "function_with_attributes": with_attributes,
    "lazily_loaded_module": lazy_submodule,
    "object_holding_a_logger": logging_object,
    "registry_keyed_by_types": type_registry,
    "helper_calling_os_path": helper_calling_os,
    "jitted_methods_static_self": static_self_methods,
    "pytree_aux_fresh_default": fresh_aux_default,
}


def _run(make, steps):
  outs, compiles = [], []
  for i in range(steps):
    with counting() as c:
      outs.append(jax.block_until_ready(jax.jit(make(i))(X)))
    compiles.append(c["compiles"])
  return outs, compiles


def _same(got, want):
  g_leaves, g_tree = jax.tree_util.tree_flatten(got)
  w_leaves, w_tree = jax.tree_util.tree_flatten(want)
  assert g_tree == w_tree
  for g, w in zip(g_leaves, w_leaves):
    assert (g.dtype, g.weak_type, g.shape) == (w.dtype, w.weak_type, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_library_pattern_runs_as_stock_and_compiles_nothing_from_call_3(
    pattern):
  make = PATTERNS[pattern]
  want, stock_compiles = stock_off(_run, make, 6)
  assert all(n >= 1 for n in stock_compiles), stock_compiles
  jcc.enable(verify=True)
  for run in range(2):
    got, compiles = _run(make, 6)
    for g, w in zip(got, want):
      _same(g, w)
    assert compiles[2:] == [0] * 4, (run, compiles, jcc.stats())
  s = jcc.stats()
  assert s["verify_mismatches"] == 0, s
  assert s["hits"] + s["tier_a"]["hits"] > 0, s
