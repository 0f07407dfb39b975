"""Small programs for the differential fuzzer (``test_fuzz.py``).

A program is a feature (how closures are made and called) and a sequence of
configurations; each step re-creates the program's closures over one
configuration and calls them. Configurations are nested tuples and dicts
with optional members, Python scalars, strings, booleans, NumPy and jax
arrays and plain objects, read by module-level helpers whose behaviour
depends on the values' types (as library code's does), so a cache that keys
or lifts a value wrongly computes something else.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

ACTS = {"sin": jnp.sin, "tanh": jnp.tanh, "id": lambda v: v}


class Box:
  """A plain object holding part of a configuration."""

  def __init__(self, scale, shift):
    self.scale = scale
    self.shift = shift


class SlotBox:
  """The same, its state in ``__slots__``."""
  __slots__ = ("scale", "shift", "__weakref__")

  def __init__(self, scale, shift):
    self.scale = scale
    self.shift = shift


def evaluate(cfg, x):
  """What every program computes from its configuration."""
  w, b, act, extra, ks, flag, box = cfg
  y = x * w + b
  if isinstance(b, int):   # type-dependent dispatch, as library code does
    y = y * 2
  y = ACTS[act](y)
  if extra is not None:
    y = y + extra["z"] * extra["k"]
  for k in ks:
    y = y + k
  y = y * jnp.power(0.5 + jnp.abs(y), ks[0]) if ks else y
  if flag:
    y = -y
  if box is not None:
    y = y * box.scale + box.shift
  return y


def _closure(cfg):
  return lambda x: evaluate(cfg, x)


def _shared(cfg):
  """A sub-closure reached through two paths."""
  inner = lambda y: evaluate(cfg, y)
  mid = lambda y: inner(y) * 2.0
  return lambda x: mid(x) + inner(x)


def plain(cfg, x):
  return jax.jit(_closure(cfg))(x)


def shared_paths(cfg, x):
  return jax.jit(_shared(cfg))(x)


def nested(cfg, x):
  inner = jax.jit(_closure(cfg))
  return jax.jit(lambda v: inner(v) * 3.0 + 1.0)(x)


def static_function(cfg, x):
  fn = jax.jit(_closure(cfg))
  g = jax.jit(lambda f, v: f(v) + 1.0, static_argnums=0)
  h = jax.jit(lambda f, v: f(v) * 3.0, static_argnums=0)
  return g(fn, x), h(fn, x), h(_closure(cfg), x)


def partial_default(cfg, x):
  def f(v, cfg=cfg):
    return evaluate(cfg, v)
  return jax.jit(functools.partial(lambda c, v: evaluate(c, v), cfg))(x), \
      jax.jit(f)(x)


def cells_and_defaults(cfg, x):
  """Arrays of one type in a cell, a default and a keyword-only default at
  once (reading nothing JAX's own walk refuses, so the series' lookup keys
  it too), jitted and as an eager loop body."""
  w, b, act, extra, ks, flag, box = cfg
  scale = w + 1.0   # an array of w's type, another object

  def f(v, scale=scale, *, extra=extra):
    y = v * w + scale * b
    y = y + extra["z"] * extra["k"] if extra is not None else y
    return -y if flag else y
  return jax.jit(f)(x), jax.lax.fori_loop(0, 2, lambda i, c: f(c) * 0.5, x)


_LONG_LIVED = SlotBox(1.0, 0.0)


def object_changed_in_place(cfg, x):
  """One long-lived object whose attributes each step sets in place (a
  model whose hyperparameters change), read by fresh closures."""
  w, b, act, extra, ks, flag, box = cfg
  obj = _LONG_LIVED
  obj.scale, obj.shift = (box.scale, box.shift) if box else (1.0, 0.0)
  return jax.jit(lambda v: evaluate((w, b, act, extra, ks, flag, obj), v))(x)


# Reseeded by ``run``, so the run with stock and the one with the cache
# draw the same sequence.
_GENERATOR = [np.random.default_rng(0)]


def drawn_at_trace_time(cfg, x):
  """A fresh closure that draws from a NumPy generator while it is traced
  (a random value baked in): stock draws again for every closure."""
  rng = _GENERATOR[0]
  return jax.jit(lambda v: evaluate(cfg, v) + rng.normal())(x)


def grad_of_closure(cfg, x):
  return jax.jit(jax.grad(lambda v: evaluate(cfg, v).sum()))(x)


def fori(cfg, x):
  body = lambda i, c: c * 0.5 + evaluate(cfg, c) * 0.25
  return jax.lax.fori_loop(0, 3, body, x)


def while_loop(cfg, x):
  step = _closure(cfg)
  return jax.lax.while_loop(lambda c: c[0] < 3,
                            lambda c: (c[0] + 1, c[1] * 0.5 + step(c[1]) * 0.1),
                            (0, x))[1]


def scan(cfg, x):
  step = _closure(cfg)
  return jax.lax.scan(lambda c, _: (c * 0.5 + step(c) * 0.1, c), x,
                      None, length=2)


def cond(cfg, x):
  f = _closure(cfg)
  return jax.lax.cond(x.sum() > 0, f, lambda v: v * 2.0, x)


class Model:
  """A callable object holding a configuration (``jax.jit(Model(cfg))``)."""

  def __init__(self, cfg):
    self.cfg = cfg

  def __call__(self, x):
    return evaluate(self.cfg, x)


@jax.tree_util.register_pytree_node_class
class Holder:
  """A pytree whose node data carries a bound method of a ``Model``."""

  def __init__(self, apply):
    self.apply = apply

  def tree_flatten(self):
    return [], (self.apply,)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*aux)


def callable_object(cfg, x):
  return jax.jit(Model(cfg))(x)


def method_in_node_data(cfg, x):
  holder = Holder(Model(cfg).__call__)
  return jax.jit(lambda v: holder.apply(v) + 1.0)(x)


def nested_static(cfg, x):
  apply = jax.jit(lambda packed, v: jax.tree_util.tree_unflatten(
      *reversed(packed[0]))(v), static_argnums=0)
  leaves, treedef = jax.tree_util.tree_flatten(_closure(cfg))
  return apply(((tuple(leaves), treedef), "tag"), x)


def jaxpr_static(cfg, x):
  solve = jax.jit(lambda c, v: jax.core.eval_jaxpr(c.jaxpr, c.consts, v)[0],
                  static_argnums=0)
  return solve(jax.make_jaxpr(_closure(cfg))(x), x)


def compile_time_constant(cfg, x):
  def f(v):
    with jax.ensure_compile_time_eval():
      ok = jnp.asarray(len(cfg[4]) < 2)
    return jnp.where(ok, evaluate(cfg, v), -v)
  return jax.jit(f)(x)


def aot_after_calls(cfg, x):
  """A fresh closure called (its entry gives the trace lookup its trace),
  then another of the same configuration traced, lowered and compiled
  ahead of time, and its output shape evaluated."""
  jax.jit(_closure(cfg))(x)
  g = jax.jit(_closure(cfg))
  shape = g.eval_shape(x).shape
  return g.trace(x).lower().compile()(x), jnp.asarray(shape)


def error_for_a_new_shape(cfg, x):
  """Fresh closures over the weights and the flag alone (simple enough for
  the inline matcher): three called as usual (stock's, the entry's miss, a
  hit that gives the code its matcher), then one with a new shape, whose
  trace raises the user's error when the flag is set (an inline hit whose
  entry must trace a new signature, and fails)."""
  w, flag = cfg[0], cfg[5]

  def make():
    def f(v):
      if v.shape[0] != 2 and flag:
        raise ValueError("this configuration takes two elements")
      return jnp.sin(v * w)
    return f
  usual = [jax.jit(make())(x) for _ in range(3)]
  return usual, jax.jit(make())(jnp.concatenate([x, x]))


FEATURES = {f.__name__: f for f in (
    plain, shared_paths, nested, static_function, partial_default,
    cells_and_defaults, object_changed_in_place, drawn_at_trace_time,
    grad_of_closure, fori, while_loop, scan, cond, callable_object,
    method_in_node_data, nested_static, jaxpr_static, compile_time_constant,
    error_for_a_new_shape, aot_after_calls)}


def make_config(choice: dict):
  """A configuration from a dict of small choices (see test_fuzz)."""
  w_kind, w_value = choice["w"]
  w = (jnp.full((2,), w_value, jnp.float32) if w_kind == "jax"
       else np.full((2,), w_value, np.float32))
  extra = None
  if choice["extra"] is not None:
    z, k = choice["extra"]
    extra = {"z": jnp.full((2,), z, jnp.float32), "k": k}
  box = None if choice["box"] is None else Box(*choice["box"])
  return (w, choice["b"], choice["act"], extra, tuple(choice["ks"]),
          choice["flag"], box)


def run(feature: str, choices: list[dict], x) -> list:
  """The feature called on each configuration in turn, twice (the replay
  makes fresh objects, so a cache hits); each outcome a pytree of arrays or
  the exception's type."""
  out = []
  program = FEATURES[feature]
  _GENERATOR[0] = np.random.default_rng(0)
  for _ in range(2):
    for choice in choices:
      try:
        out.append(jax.block_until_ready(program(make_config(choice), x)))
      except Exception as e:   # noqa: BLE001: compared with stock's
        out.append(type(e))
  return out
