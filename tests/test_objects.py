"""Arrays inside plain objects are lifted: the trace runs on a shallow copy
of the object holding tracers; a trace that writes to that copy is refused
and answered by stock, whose trace writes to the user's object. Results and
side effects are compared with stock jax.jit on a fresh function object."""

import logging
import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_closure_cache as jcc
from conftest import (
    STOCK_JIT, assert_like_stock, counting, counts_side_effects,
    replay_in_both_modes, replay_like_stock, script_lines, stock_off, warm)


class Holder:
  pass


def holding(w, scale=1.0):
  h = Holder()
  h.w = w
  h.scale = scale
  return h


def test_array_on_an_object_attribute_is_lifted():
  x = jnp.ones(3)
  make = lambda h: (lambda v: (h.w @ v) * h.scale)
  warm(lambda: jcc.jit(make(holding(jnp.eye(3))))(x))
  for i in range(2, 5):
    h = holding(jnp.eye(3) * i)
    with counting() as c:
      out = jcc.jit(make(h))(x)
    assert c["compiles"] == 0
    assert_like_stock(out, make(h), x)
  h = holding(jnp.eye(3), scale=2.0)   # a static attribute is keyed
  assert_like_stock(jcc.jit(make(h))(x), make(h), x)


def test_state_the_first_call_fills_is_the_key_met_next():
  """An object the first call fills lazily (a cached attribute, as a mesh's)
  changes the key its code is met with next: the first object records that
  key too, so the second object, meeting it again, compiles the shared
  entry and the third hits."""
  class Config:
    def __init__(self):
      self.factor = None

    def get(self):
      if self.factor is None:
        self.factor = 3.0   # filled at first use
      return self.factor
  cfg = Config()
  x = jnp.ones(3)
  make = lambda w: (lambda v: (w @ v) * cfg.get())
  compiles = []
  for i in range(1, 5):
    w = jnp.eye(3) * i
    with counting() as c:
      out = jcc.jit(make(w))(x)
    compiles.append(c["compiles"])
    assert_like_stock(out, make(w), x)
  assert compiles == [1, 1, 0, 0]
  assert jcc.stats()["fallbacks"] == 0


def test_function_held_by_an_object_is_keyed_by_its_closure():
  class Solver:
    def __init__(self, fun):
      self.fun = fun
  x = jnp.ones(3)
  make = lambda w: (lambda v, s=Solver(lambda u: w @ u): s.fun(v) + 1.0)
  warm(lambda: jcc.jit(make(jnp.eye(3)))(x))
  for i in range(2, 4):
    w = jnp.eye(3) * i   # outside the counted block: eager ops compile too
    with counting() as c:
      out = jcc.jit(make(w))(x)
    assert c["compiles"] == 0
    np.testing.assert_array_equal(out, 1.0 + i * np.ones(3))


def test_reassigned_attribute_is_never_the_old_result():
  x = jnp.ones(2)

  class Model:
    def __init__(self, params):
      self.params = params

    def apply(self, v):
      return v * self.params["w"]
  m = Model({"w": jnp.full(2, 2.0)})
  for _ in range(2):
    jcc.jit(Model({"w": jnp.full(2, 2.0)}).apply)(x)
  m.params = {"w": jnp.full(2, 5.0)}
  assert_like_stock(jcc.jit(m.apply)(x), Model({"w": jnp.full(2, 5.0)}).apply, x)


@counts_side_effects
def test_a_trace_that_writes_to_self_writes_to_the_users_object():
  x = jnp.ones(2)

  class Counter:
    def __init__(self, w):
      self.w = w
      self.last = None
      self.traces = 0

    def step(self, v):
      self.traces += 1         # trace-time side effects on self
      self.last = v * self.w
      return self.last
  for i in range(4):
    c, s = Counter(jnp.full(2, float(i))), Counter(jnp.full(2, float(i)))
    out = jcc.jit(c.step)(x)
    want = STOCK_JIT(s.step)(x)
    np.testing.assert_array_equal(out, want)
    # stock's trace wrote to the user's object (a leaked tracer, a count);
    # a lifted trace writes to its copy, so it is refused for stock's
    assert c.traces == s.traces == 1
    assert isinstance(c.last, jax.core.Tracer)
    assert c.w is not None


@pytest.mark.parametrize("kind", ["setattr", "property", "slots"])
def test_objects_that_cannot_be_copied_keep_identity_keying(kind):
  if kind == "setattr":
    class Odd:
      def __init__(self, w):
        object.__setattr__(self, "w", w)

      def __setattr__(self, name, value):
        raise AttributeError("read-only")
  elif kind == "property":
    class Odd:
      def __init__(self, w):
        self._w = w

      @property
      def w(self):
        return self._w
  else:
    class Odd:
      __slots__ = ("w", "__weakref__")

      def __init__(self, w):
        self.w = w
  x = jnp.ones(2)
  make = lambda o: (lambda v: v * o.w)
  for i in range(3):
    o = Odd(jnp.full(2, float(i + 1)))
    assert_like_stock(jcc.jit(make(o))(x), make(o), x)
  assert jcc.stats()["hits"] == 0


def test_explanation_names_the_attribute(monkeypatch, caplog):
  monkeypatch.setenv("JAX_CLOSURE_CACHE_EXPLAIN", "1")
  caplog.set_level(logging.WARNING, logger="jax_closure_cache")
  x = jnp.ones(2)
  make = lambda h: (lambda v: v * h.scale)
  jcc.jit(make(holding(jnp.ones(2), 2.0)))(x)
  jcc.jit(make(holding(jnp.ones(2), 3.0)))(x)
  text = [r.getMessage() for r in caplog.records][-1]
  assert "cell 'h'.scale changed: 2.0 -> 3.0" in text, text


@pytest.mark.parametrize("container", ["dict", "list"])
@counts_side_effects
def test_a_trace_that_writes_to_a_closed_over_container_writes_to_the_users(
    container):
  """A dict or list holding a lifted array is rebuilt for the lifted trace;
  a trace-time write to it (a note, a counter) is the user's, as in
  stock's trace."""
  x = jnp.ones(2)

  def make(i):
    w = jnp.full(2, float(i))
    state = {"w": w, "notes": 0} if container == "dict" else [w, 0]

    def f(v):
      if container == "dict":
        state["notes"] += 1
        return v * state["w"]
      state[1] += 1
      return v * state[0]
    return f, state
  for i in range(4):
    (f, got_state), (g, want_state) = make(i), make(i)
    np.testing.assert_array_equal(jcc.jit(f)(x), STOCK_JIT(g)(x))
    assert got_state.keys() == want_state.keys() if container == "dict" else (
        len(got_state) == len(want_state))
    note = "notes" if container == "dict" else 1
    assert got_state[note] == want_state[note] == 1


# rebound by the test below: a user's function reached through a global
_REACHED = None


def _observe_trace_time_writes(route: str, via_global: bool, rounds: int = 4):
  """For ``rounds`` fresh closures over a dict holding an array (which the
  lifted trace rebuilds) and a plain list (which it does not), each written
  at trace time, called through ``route`` directly or through a global
  name: what each call returned and left in the user's objects."""
  global _REACHED
  seen = []
  for i in range(rounds):
    state, plain = {"w": jnp.full(3, float(i + 1)), "log": []}, []

    def f(v, state=state, plain=plain):
      state["log"].append("traced")
      state["n"] = state.get("n", 0) + 1
      plain.append("traced")
      return v * state["w"]
    _REACHED = f
    h = (lambda v: _REACHED(v)) if via_global else f
    x = jnp.ones(3)
    if route == "jit":
      out = jax.jit(h)(x)
    elif route == "fori_loop":
      out = jax.lax.fori_loop(0, 2, lambda k, y: h(y), x)
    elif route == "scan":
      out = jax.lax.scan(lambda c, _: (h(c), None), x, None, length=2)[0]
    elif route == "while_loop":
      out = jax.lax.while_loop(lambda c: c[0] < 2,
                               lambda c: (c[0] + 1, h(c[1])), (0, x))[1]
    elif route == "cond":
      out = jax.lax.cond(True, h, lambda y: y, x)
    else:
      converted, consts = jax.closure_convert(h, x)
      out = converted(x, *consts)
    seen.append((np.asarray(out).tolist(), list(state["log"]),
                 state.get("n"), list(plain)))
  return seen


class _Counter:
  pass


_COUNTER = _Counter()


def _bump(x):
  _COUNTER.n = _COUNTER.n + 1.0   # a trace-time write to a global object
  return x * _COUNTER.n


@counts_side_effects
def test_a_closure_free_function_whose_trace_writes_is_not_shared():
  """A closure-free function re-created per call whose trace sets an
  attribute of a global object: stock's trace of each new object makes the
  write, so the cache's shared stock object (one per closure-free code) is
  not handed to the next objects once a trace of the code wrote; the
  write happens on every call, as with stock."""
  def run():
    out = []
    for _ in range(4):
      _COUNTER.n = 0.0

      def f(x):
        return _bump(x)
      out.append((float(jax.jit(f)(jnp.float32(3.0))), _COUNTER.n))
    return out
  jcc.enable()
  want = stock_off(run)
  assert want == [(3.0, 1.0)] * 4
  assert run() == want
  assert run() == want


class _CountedReads:
  """A property whose getter counts its reads in a class attribute and
  answers from the count: a trace's write no watched place sees, but one
  the closure key covers (the class's namespace)."""
  reads = 0

  @property
  def scale(self):
    type(self).reads += 1
    return float(type(self).reads % 3)


_COUNTED = _CountedReads()


def _scaled(x):
  return x * _COUNTED.scale


@pytest.mark.parametrize("route", ["jit", "scan"])
def test_a_trace_that_changes_what_its_key_covers_is_never_shared(route):
  """Fresh functions reaching a global object whose property getter writes
  a class attribute: each stock trace runs the getter. A trace after which
  the closure key differs from the one it was looked up under is not
  stored by the front nor by JAX's trace lookup (where a closure-free
  function's answer was shared under the key taken before its trace, and
  a second run, the count reset, answered every call without running the
  getter)."""
  def run():
    _CountedReads.reads = 0
    out = []
    for _ in range(4):
      def f(x):
        return _scaled(x)
      if route == "jit":
        r = jax.jit(f)(jnp.float32(3.0))
      else:
        r = jax.lax.scan(lambda c, _: (f(c), None), jnp.float32(3.0),
                         None, length=2)[0]
      out.append((float(r), _CountedReads.reads))
    return out
  jcc.enable()
  want = stock_off(run)
  assert [n for _, n in want] == [1, 2, 3, 4]
  assert run() == want
  assert run() == want


@pytest.mark.parametrize("via_global", [False, True],
                         ids=["closure", "global"])
@pytest.mark.parametrize("route", ["jit", "fori_loop", "scan", "while_loop",
                                   "cond", "closure_convert"])
@counts_side_effects
def test_trace_time_writes_land_on_the_users_objects_on_every_route(
    route, via_global):
  """Stock traces each fresh function and its writes land on the user's
  dict and list, once per trace. A lifted trace writes to its rebuild's
  copy of the dict: it is refused (reached through a global name, a loop
  body's weak reference, or ``closure_convert`` too), what it wrote to the
  user's own list is put back, and stock's trace writes once."""
  want = _observe_trace_time_writes(route, via_global)
  jcc.enable()
  got = _observe_trace_time_writes(route, via_global)
  assert got == want
  assert want[-1][1:] == (["traced"], 1, ["traced"])


def _call_through(route: str, f, x):
  """``f(x)`` through ``jax.jit``, an eager loop over it, or its
  ``closure_convert``ed form, on a fresh function object."""
  if route == "jit":
    return jax.jit(f)(x)
  if route == "fori_loop":
    return jax.lax.fori_loop(0, 1, lambda k, y: f(y), x)
  if route == "scan":
    return jax.lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0]
  converted, consts = jax.closure_convert(f, x)
  return converted(x, *consts)


@pytest.mark.parametrize("route", ["jit", "fori_loop", "closure_convert"])
def test_a_refused_lifted_trace_keeps_nothing_alive(route):
  """A lifted trace refused for writing to its copy is left by an
  exception, which JAX's trace does not release (its constants' finalizers
  hold its frame): the package releases it, so JAX's memoized float32
  conversion of a float64 NumPy array read in that trace dies with it, and
  the array changed in place is read anew, as stock reads it (or stale,
  where stock's own cache keeps the copy)."""
  base = np.array([1.0, 9.0, 2.0, 9.0, 3.0, 9.0])
  a = base[::2]   # float64: the trace reads JAX's float32 copy of it

  def run():
    seen = []
    for values in ((1.0, 2.0, 3.0), (1.0, 2.0, 3.0), (1.0, 2.0, 3.0),
                   (1.0, 1.0, 1.0)):
      base[::2] = values
      box = {"w": jnp.ones(3), "n": 0}

      def f(x, box=box):
        box["n"] += 1   # a write to the dict the lifted trace copies
        return x * jnp.asarray(a) + box["w"]
      out = _call_through(route, f, jnp.ones(3))
      seen.append((np.asarray(out).tolist(), box["n"]))
    return seen
  want = run()
  jcc.enable()
  got = run()
  assert got == want
  # (stock's closure_convert keeps its traces in an LRU cache, and with
  # them the copy: stale in stock, and so with the cache)
  assert want[-1][0] == ([2.0, 3.0, 4.0] if route == "closure_convert"
                         else [2.0, 2.0, 2.0])


# a large global table a traced function reads (a vocabulary)
_VOCABULARY = {f"token{k}": k for k in range(20000)}


@pytest.mark.parametrize("container", ["dict", "OrderedDict", "defaultdict"])
@pytest.mark.parametrize("route", ["jit", "scan", "closure_convert"])
@counts_side_effects
def test_trace_time_writes_are_seen_past_a_large_global_and_in_dict_subclasses(
    route, container):
  """The watch walks the closure's own state before the globals the code
  reads, breadth first, so a global table of more entries than its budget
  never hides the closure's dict; and a dict subclass holding an array
  (rebuilt as a copy, as JAX flattens it) is watched by its items."""
  import collections
  make_state = {"dict": dict, "OrderedDict": collections.OrderedDict,
                "defaultdict": lambda: collections.defaultdict(int)}[container]

  def run():
    seen = []
    for i in range(4):
      state = make_state()
      state["w"] = jnp.full(3, float(i + 1))
      state["traces"] = 0

      def f(v, state=state):
        state["traces"] += 1
        return v * state["w"] + _VOCABULARY["token1"]
      out = _call_through(route, f, jnp.ones(3))
      seen.append((np.asarray(out).tolist(), state["traces"]))
    return seen
  want = run()
  jcc.enable()
  assert run() == want
  assert [traces for _, traces in want] == [1, 1, 1, 1]


class _Config(dict):
  """A dict subclass with attributes of its own (a config object)."""


@pytest.mark.parametrize("kind", ["dict", "OrderedDict", "subclass"])
def test_a_refused_trace_puts_back_order_and_a_subclass_attributes(kind):
  """What a refused lifted trace did to the user's own objects is undone
  before stock's trace runs: a key moved to the end (an OrderedDict's
  order is its pytree structure) and an attribute of a dict subclass, so
  stock's trace makes each change once."""
  import collections
  make = {"dict": dict, "OrderedDict": collections.OrderedDict,
          "subclass": _Config}[kind]

  def run():
    seen = []
    for i in range(4):
      d = make(a=1, b=2)
      if kind == "subclass":
        d.calls = 0
      state = {"w": jnp.full(2, float(i))}

      def f(x, d=d, state=state):
        k = next(iter(d))
        d[k] = d.pop(k)        # the first key moved to the end
        if kind == "subclass":
          d.calls += 1
        state["seen"] = True   # a write to the dict the lifted trace copies
        return x * state["w"]
      jax.jit(f)(jnp.ones(2))
      seen.append((list(d), getattr(d, "calls", None)))
    return seen
  want = run()
  jcc.enable()
  assert run() == want
  assert want[-1] == (["b", "a"], 1 if kind == "subclass" else None)


class _ClaimsDict:
  """An object whose ``__class__`` claims ``dict`` (a proxy, a
  ``Mock(spec=dict)``)."""
  __class__ = property(lambda self: dict)

  def __init__(self, scale):
    self.scale = scale


def test_an_object_whose_class_attribute_claims_dict_is_keyed_by_its_type():
  """The key reads an object's kind from ``type()``: one whose
  ``__class__`` claims ``dict`` made every call raise ``AttributeError``
  (its items were read as a dict's); it is a plain object, as stock
  treats it, and a changed attribute is a new key."""
  x = jnp.ones(2)

  def make(i, scale):
    w, p = jnp.asarray([i, i + 0.5], jnp.float32), _ClaimsDict(scale)
    return lambda v: v * w * p.scale
  jcc.enable()
  for i, scale in enumerate([2.0, 2.0, 2.0, 3.0, 2.0]):
    assert_like_stock(jax.jit(make(i, scale))(x), make(i, scale), x)
  assert jcc.stats()["hits"] >= 1


class _DictConfig:
  """A dict-backed config whose ``__getattr__`` raises ``KeyError`` for a
  name it does not hold."""

  def __init__(self, **values):
    self.__dict__["_values"] = values
    self.__dict__["asked"] = []

  def __getattr__(self, name):
    self.asked.append(name)
    return self._values[name]


def test_an_objects_getattr_runs_only_for_names_the_trace_reads():
  """The key never probes a user object for names its code does not read
  (a bound method's owner is read from method types only): a config whose
  ``__getattr__`` raises ``KeyError`` works as with stock, and is asked
  what stock's trace asks."""
  def run():
    out = []
    for _ in range(4):
      cfg = _DictConfig(scale=2.0)
      out.append((np.asarray(jax.jit(lambda v: v * cfg.scale)(
          jnp.ones(3))).tolist(), list(cfg.asked)))
    return out
  jcc.enable()
  want = stock_off(run)
  assert run() == want
  assert run() == want


def _reads_digits(d):
  def f(x):
    return x + len(str(d))
  return f


def _reads_hour(t):
  def f(x):
    return x + t.hour
  return f


def _reads_a_key(d):
  table = {d: 1}
  def f(x):
    return x + len(str(next(iter(table))))
  return f


def test_library_values_equal_under_eq_but_not_to_a_trace_are_distinct_keys():
  import datetime
  import decimal
  import zoneinfo
  utc, plus1 = datetime.timezone.utc, datetime.timezone(
      datetime.timedelta(hours=1))
  decimals = [decimal.Decimal(s) for s in ("1.0", "1.00", "-0", "0", "1.0")]
  times = [datetime.datetime(2020, 1, 1, 5, tzinfo=utc),
           datetime.datetime(2020, 1, 1, 6, tzinfo=plus1),
           datetime.datetime(2020, 1, 1, 5, tzinfo=zoneinfo.ZoneInfo("UTC")),
           datetime.time(5, tzinfo=utc), datetime.time(6, tzinfo=plus1),
           datetime.datetime(2020, 1, 1, 5, tzinfo=utc)]

  def run():
    return ([jax.jit(_reads_digits(d))(0) for d in decimals]
            + [jax.jit(_reads_hour(t))(0) for t in times]
            + [jax.jit(_reads_a_key(d))(0) for d in decimals])

  want = stock_off(run)
  assert [int(w) for w in want[:4]] == [3, 4, 2, 1]   # the digits differ
  jcc.enable()
  for _ in range(2):
    got = run()
    assert [int(g) for g in got] == [int(w) for w in want]
  with counting() as n:   # an exact repeat still hits
    assert int(jax.jit(_reads_hour(times[1]))(0)) == 6
  assert n["traces"] == 0
  # a Decimal's arithmetic reads the thread's context: never keyed
  assert jcc.stats()["fallback_reasons"].get("user_equality", 0) > 0


class _Zone(__import__("datetime").tzinfo):   # a user's zone: state of its own
  def __init__(self, hours):
    self.hours = hours

  def utcoffset(self, dt):
    return __import__("datetime").timedelta(hours=self.hours)


def test_a_datetime_in_a_users_time_zone_is_not_keyed_by_its_equality():
  import datetime
  zone = _Zone(1)
  t = datetime.datetime(2020, 1, 1, 5, tzinfo=zone)

  def reads_offset(x):
    return x + t.utcoffset().seconds // 3600

  jcc.enable()
  got = []
  for hours in (1, 2, 3):
    zone.hours = hours
    got.append(int(jax.jit(_copy(reads_offset))(0)))   # a fresh object
  assert got == [1, 2, 3]


def _copy(f):
  import types
  return types.FunctionType(f.__code__, f.__globals__, f.__name__,
                            f.__defaults__, f.__closure__)


@pytest.mark.parametrize("kind", ["logging_module", "warnings_module"])
@counts_side_effects
def test_trace_time_log_records_and_warnings_are_made_on_every_trace(kind):
  import warnings
  records = []

  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record.getMessage())

  log = logging.getLogger("jcc_test_trace_time")
  handler = Keep()
  log.addHandler(handler)
  log.setLevel(logging.INFO)

  def make(i):
    w = jnp.ones(3) * i
    if kind == "logging_module":
      def f(x):
        logging.getLogger("jcc_test_trace_time").info("tracing")
        return x * w
    else:
      def f(x):
        warnings.warn("tracing", stacklevel=1)
        return x * w
    return f

  def run():
    records.clear()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      outs = [jax.jit(make(i))(jnp.ones(3)) for i in range(4)]
    return outs, len(records) + len(caught)

  try:
    want, want_effects = stock_off(run)
    assert want_effects == 4
    jcc.enable()
    for _ in range(2):
      got, effects = run()
      assert effects == want_effects
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
  finally:
    log.removeHandler(handler)


APPENDED = []
append_to_global = APPENDED.append


@counts_side_effects
@pytest.mark.parametrize("where", ["global", "cell"])
def test_a_bound_method_of_a_container_called_at_trace_time_writes_every_trace(
    where):
  held = []
  add = held.append

  def make(i):
    w = jnp.ones(2) * i
    if where == "global":
      def f(x):
        append_to_global("traced")
        return x * w
    else:
      def f(x):
        add("traced")
        return x * w
    return f

  log = APPENDED if where == "global" else held

  def run():
    del log[:]
    outs = [jax.jit(make(i))(jnp.ones(2)) for i in range(4)]
    return outs, list(log)

  assert replay_like_stock(run) == ["traced"] * 4


@counts_side_effects
@pytest.mark.parametrize("who", ["itself", "a_helper"])
def test_an_attribute_a_trace_sets_on_a_function_lands_on_the_users(who):
  def make(i):
    w = jnp.ones(2) * i

    def helper(x):
      return x * w

    def f(x):
      target = f if who == "itself" else helper
      target.traced = getattr(target, "traced", 0) + 1
      return helper(x)
    return f, (f if who == "itself" else helper)

  def run():
    outs, marked = [], []
    for i in range(4):
      f, target = make(i)
      outs.append(jax.jit(f)(jnp.ones(2)))
      marked.append(getattr(target, "traced", None))
    return outs, marked

  assert replay_like_stock(run) == [1, 1, 1, 1]


def _scaled_by(v):
  def f(x):
    return x * float(v)
  return f


def _reads_layout(a):
  def f(x):
    return x + jnp.asarray(a.ravel(order="K")[:2]) + (
        0.0 if a.flags.writeable else 100.0)
  return f


def _reads_metadata(d):
  def f(x):
    return x * (d.metadata or {}).get("scale", 1.0)
  return f


def test_numpy_values_are_keyed_by_all_a_trace_can_read_of_them():
  import decimal
  # two records of equal bytes, one field each: a float32 and an int32
  record_a = np.array([(2.0,)], dtype=[("a", "f4")])[0]
  record_b = np.frombuffer(record_a.tobytes(), dtype=[("b", "i4")])[0]
  m = np.arange(6.0).reshape(2, 3)
  frozen = m.copy()
  frozen.flags.writeable = False

  def run():
    out = []
    for v in (np.timedelta64(1, "s"), np.timedelta64(1, "ms"),
              np.timedelta64(1, "s"), np.datetime64(1, "D").astype("m8[D]")):
      out.append(jax.jit(_scaled_by(v / np.timedelta64(1, "s")))(1.0))
      out.append(jax.jit(lambda x, v=v: x * float(v / np.timedelta64(1, "s")))(
          1.0))
    for r in (record_a, record_b, record_a):
      out.append(jax.jit(lambda x, r=r: x * float(r[0]))(1.0))
    for a in (m.copy(), m.copy(), np.asfortranarray(m), frozen):
      out.append(jax.jit(_reads_layout(a))(jnp.zeros(2)))
    for d in (np.dtype("f4"), np.dtype("f4"),
              np.dtype("f4", metadata={"scale": 3.0})):
      out.append(jax.jit(_reads_metadata(d))(jnp.ones(2)))
    with decimal.localcontext() as ctx:
      for prec in (28, 28, 2):
        ctx.prec = prec
        third = decimal.Decimal(2)
        out.append(jax.jit(lambda x, t=third: x * float(t / 3))(1.0))
    return out

  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    got = run()
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
      np.testing.assert_array_equal(g, w, err_msg=str(i))


class _Mode(__import__("enum").Enum):
  A = 1


def test_an_enum_members_own_attributes_are_read_afresh():
  def make():
    w = jnp.ones(2)
    m = _Mode.A

    def f(x):
      return x * w * m.scale
    return f

  def g(x, m):
    return x * m.scale

  def run():
    out = []
    for scale in (1.0, 1.0, 5.0, 5.0, 2.0):
      _Mode.A.scale = scale
      out.append(jax.jit(make())(jnp.ones(2)))
      out.append(jax.jit(_copy(g), static_argnums=1)(jnp.ones(2), _Mode.A))
    return out

  try:
    want = stock_off(run)
    jcc.enable()
    for _ in range(2):
      for g_, w in zip(run(), want):
        np.testing.assert_array_equal(g_, w)
  finally:
    del _Mode.A.scale


@counts_side_effects
def test_printing_through_library_functions_and_builtins_is_never_skipped(
    capsys):
  import builtins
  import pprint

  def make(i, how):
    w = jnp.ones(2) * i
    def f(x):
      if how == "pprint":
        pprint.pprint("tracing")
      elif how == "np.info":
        np.info(np.add)
      else:
        getattr(builtins, "print")("tracing")
      return x * w
    return f

  def run():
    counts = []
    for how in ("pprint", "np.info", "builtins"):
      for i in range(4):
        jax.jit(make(i, how))(jnp.ones(2))
        counts.append(len(capsys.readouterr().out))
    return counts

  want = stock_off(run)
  assert all(want)
  jcc.enable()
  for _ in range(2):
    assert run() == want


def _warns_in_a_helper():
  import warnings
  warnings.warn("from a helper", UserWarning, stacklevel=2)


@counts_side_effects
@pytest.mark.parametrize("route", ["jit", "scan"])
def test_warnings_a_trace_issues_are_issued_at_every_trace_where_they_point(
    route):
  import warnings

  def make(i):
    w = jnp.ones(2) * i

    def f(x):
      _warns_in_a_helper()   # attributed to this line, as stock's
      y = x.astype(jnp.float64)   # JAX's own warning (x64 off)
      np.log(np.float64(0.0))   # NumPy's RuntimeWarning, from C
      return y * w
    return f

  def call(f):
    if route == "jit":
      return jax.jit(f)(jnp.ones(2))
    return jax.lax.scan(lambda c, _: (f(c), None), jnp.ones(2), None,
                        length=2)[0]

  def run():
    shown = []
    with warnings.catch_warnings(record=True) as once:
      warnings.simplefilter("default")   # each location once
      outs = [call(make(i)) for i in range(3)]
    shown.append([(str(w.message)[:20], w.filename, w.lineno) for w in once])
    with warnings.catch_warnings(record=True) as every:
      warnings.simplefilter("always")
      outs += [call(make(i)) for i in range(4)]
    shown.append([(str(w.message)[:20], w.filename, w.lineno) for w in every])
    return outs, shown

  shown = replay_like_stock(run)
  assert len(shown[1]) == 12   # three warnings at every trace


def _warns_at_level(level):
  import warnings
  warnings.warn("at a level", UserWarning, level)


def test_warnings_issued_while_enabled_point_and_fail_as_stocks():
  """While the closure key is on, ``warnings.warn`` counts a warning a
  trace issues; a warning still names the frame stock's names (stack level
  0, 1 and 2; JAX's own stack levels past the package's frames), an
  argument error is stock's, and ``disable()`` leaves a ``warnings.warn``
  the user installed meanwhile in place."""
  import warnings

  def run():
    out = []
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for level in (0, 1, 2, -3):
        _warns_at_level(level)
      for i in range(3):   # JAX's own, from inside its trace (x64 off)
        w = jnp.ones(2) * i
        jax.jit(lambda v: v.astype(jnp.float64) * w)(jnp.ones(2))
    out.append([(os.path.basename(c.filename), c.lineno) for c in caught])
    for bad in ((), ("m", UserWarning, "a"), ("m", UserWarning, 1, None, 5)):
      with pytest.raises(TypeError) as e:
        warnings.warn(*bad)
      out.append(str(e.value))
    return out

  stock_warn = warnings.warn
  want = stock_off(run)
  jcc.enable()
  for _ in range(2):
    assert run() == want
  mine = lambda *a, **k: None
  try:
    warnings.warn = mine
    jcc.disable()
    assert warnings.warn is mine
  finally:
    warnings.warn = stock_warn


@counts_side_effects
def test_under_debug_nans_each_call_reports_as_stocks_does(capfd):
  """With ``jax_debug_nans`` on, JAX re-runs a computation that gave a NaN
  op by op, reporting as it goes, then raises: a re-created function's
  calls are stock's (a lifted entry's failure and stock's retry reported
  twice), with stock's lines and errors."""
  a = jnp.ones(2)

  def run():
    errors = []
    for _ in range(3):
      try:
        jax.jit(lambda x: jnp.log(x) * a)(-1.0)
      except FloatingPointError as e:
        errors.append(type(e).__name__)
    return errors, capfd.readouterr()

  with jax.debug_nans(True):
    want_errors, want_out = stock_off(run)
    assert want_errors and "nan" in (want_out.out + want_out.err).lower()
    jcc.enable()
    for _ in range(2):
      errors, out = run()
      assert errors == want_errors
      assert (out.out, out.err) == (want_out.out, want_out.err)


# One mode's run of the NaN-check switches (``sys.argv[1]``: stock, on or
# verify; ``sys.argv[2]``: "global" for ``jax.config.update``, "context"
# for ``jax.debug_nans``): fresh functions of each route, stored before the
# checks go on, met again with them on and off; prints each call's outcome
# and what was printed, then the cache's mismatches.
_NAN_SWITCHES = r"""
import contextlib, io, sys
import numpy as np, jax, jax.numpy as jnp
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
b = np.linspace(-1, 1, 4).astype(np.float32)

def routes(W, x, s):
  body = lambda c: jnp.tanh(c @ W + b) * jnp.sqrt(c[0, 0] + s)
  yield "fori", lambda: jax.lax.fori_loop(0, 3, lambda k, c: body(c), x)
  yield "scan", lambda: jax.lax.scan(lambda c, v: (body(c), None), x, None,
                                     length=3)[0]
  yield "while", lambda: jax.lax.while_loop(lambda c: c[0, 0] < 9.0,
                                            lambda c: body(c) + 9.0, x)
  yield "cond", lambda: jax.lax.cond(True, body, lambda c: c, x)
  yield "jit", lambda: jax.jit(lambda c: body(c) * 2.0)(x)
  yield "grad", lambda: jax.jit(jax.grad(lambda c: body(c).sum()))(x)

out = []
for i, on in enumerate([False, False, False, True, False, True, True]):
  rng = np.random.RandomState(i % 3)
  x = jnp.asarray(rng.randn(2, 4).astype(np.float32))
  W = jnp.asarray(rng.randn(4, 4).astype(np.float32))
  s = 0.3 if i % 2 else -9.0   # (a NaN at every other call)
  if sys.argv[2] == "global":
    jax.config.update("jax_debug_nans", on)
    ctx = contextlib.nullcontext()
  else:
    ctx = jax.debug_nans(on)
  for name, call in routes(W, x, s):
    printed = io.StringIO()
    with ctx, contextlib.redirect_stdout(printed):
      try:
        r = np.asarray(call())
        got = (str(r.dtype), r.tobytes().hex(), bool(np.isnan(r).any()))
      except Exception as e:
        got = (type(e).__name__, str(e).split(".")[0])
    out.append((i, name, got, printed.getvalue()))
  ctx = None
print(repr(out))
print(jcc.stats()["verify_mismatches"] if sys.argv[1] != "stock" else 0)
"""


@pytest.mark.parametrize("switch", ["global", "context"])
def test_nan_checks_switched_on_after_entries_were_stored_are_stocks(switch):
  """``jax_debug_nans`` switched on and off between calls, by
  ``jax.config.update`` and by ``jax.debug_nans``, after entries were
  stored: eager loops and ``cond`` with fresh bodies, a fresh jitted
  closure and a fresh ``jit(grad)`` give stock's values, errors and
  printed lines at every call (stock's eager loop checks each primitive
  as it runs it, so a launch is stock's while the checks are on, and so
  is each trace it makes), each mode in a process of its own."""
  import ast

  def mode(name):
    calls, mismatches = script_lines(_NAN_SWITCHES, name, switch)[-2:]
    return ast.literal_eval(calls), mismatches

  want, _ = mode("stock")
  assert any(got[0] == "FloatingPointError" for _, _, got, _ in want)
  assert any(got[-1] is True for _, _, got, _ in want)   # NaNs, unchecked
  for name in ("on", "verify"):
    got, mismatches = mode(name)
    assert mismatches == "0", name
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w][:3]


# One mode's run (``sys.argv[1]``): a long-lived jitted function made before
# the cache is on, a fresh closure-free jitted function (the cache answers
# it with a canonical stock object) and eager ``cond``/``switch`` with fresh
# bodies closing over a NumPy array (which the cache may run equation by
# equation), then NaN checks switched on globally: prints each call's
# outcome.
_NAN_HOOK = r"""
import sys
import numpy as np, jax, jax.numpy as jnp
import jax_closure_cache as jcc
held = jax.jit(lambda c: jnp.sqrt(c - 10.0))
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
b = np.linspace(-1, 1, 4).astype(np.float32)

def canon(c):
  return jnp.sqrt(c - 10.0)

out = []
for i, on in enumerate([False, False, False, True]):
  x = jnp.asarray(np.random.RandomState(i % 3).randn(2, 4).astype(np.float32))
  W = jnp.asarray(np.random.RandomState(i % 3).randn(4, 4).astype(np.float32))
  jax.config.update("jax_debug_nans", on)
  body = lambda c: jnp.tanh(c @ W + b)
  for name, call in [
      ("held", lambda: held(x)), ("canonical", lambda: jax.jit(canon)(x)),
      ("cond", lambda: jax.lax.cond(True, body, lambda c: c, x)),
      ("switch", lambda: jax.lax.switch(1, [lambda c: c, body], x))]:
    try:
      got = ("ok", bool(np.isnan(np.asarray(call())).any()))
    except Exception as e:
      got = (type(e).__name__,)
    out.append((i, name, got))
print(repr(out))
"""


def test_cached_calls_leave_jaxs_nan_checks_to_later_calls_as_stock():
  """JAX's compiled calls check for NaNs through a per-thread hook state
  that its own ``debug_nans(False)`` context leaves set to None when it
  exits: the cache runs an eager ``cond`` with a closed-over NumPy array
  equation by equation (JAX's ``jaxpr_as_fun``, which enters that
  context), and keeps the state as it was, so NaN checks switched on
  later reach a long-lived jitted function and a canonical object as in
  stock (they returned NaNs); each mode in a process of its own."""
  import ast

  def mode(name):
    return ast.literal_eval(script_lines(_NAN_HOOK, name)[-1])

  want = mode("stock")
  assert ((3, "held", ("FloatingPointError",)) in want
          and (3, "canonical", ("FloatingPointError",)) in want)
  for name in ("on", "verify"):
    assert mode(name) == want, name


class _GenericScale(__import__("typing").Generic[__import__("typing").TypeVar("T")]):
  """A user class deriving ``typing.Generic`` (written in C from Python
  3.12, with no state of an instance's)."""

  def __init__(self, scale):
    self.scale = scale


class _SlottedGenericScale(
    __import__("typing").Generic[__import__("typing").TypeVar("T")]):
  __slots__ = ("scale",)

  def __init__(self, scale):
    self.scale = scale


@pytest.mark.parametrize("kind", [_GenericScale, _SlottedGenericScale])
def test_generic_objects_are_keyed_by_their_state(kind):
  """A ``typing.Generic`` subclass (a C base from Python 3.12, holding no
  state of an instance's) is walked by its state on every Python:
  re-created closures over such an object hit the closure key from their
  third object on (the first is stock's, the second makes the shared
  entry); a changed attribute is a new key; values and gradients are
  stock's."""
  x = jnp.linspace(-1.0, 1.0, 4)
  make = lambda w, g: (lambda v: jnp.sum(jnp.tanh(v * w) * g.scale))
  made, outs = [], []
  for i in range(5):
    g, w = kind(2.0), jnp.asarray([0.5, 0.75, 1.25, 1.5]) + i
    made.append((w, g))
    outs.append((jcc.jit(make(w, g))(x), jcc.jit(jax.grad(make(w, g)))(x)))
  assert jcc.stats()["hits"] == 2 * 3, jcc.stats()
  for (w, g), (out, grad) in zip(made, outs):
    assert_like_stock(out, make(w, g), x)
    assert_like_stock(grad, jax.grad(make(w, g)), x)
  g = kind(3.0)   # a changed attribute: stock's answer, not 2.0's
  assert_like_stock(jcc.jit(make(jnp.ones(4), g))(x), make(jnp.ones(4), g), x)


def test_checkpoint_residuals_logged_after_entries_were_stored_are_stocks():
  """``jax_log_checkpoint_residuals`` switched on after entries were
  stored: stock logs, at each trace that differentiates a
  ``jax.checkpoint``, what it saves, so every fresh ``jit(grad(loss))``,
  fresh static function and eager ``scan`` body logs; a hit traces
  nothing, so while the option is on, new function objects are stock's
  (tier A still shares their executables)."""
  records = []

  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record.getMessage().split("\n")[0])

  apply = jax.jit(lambda f, v: f(v), static_argnums=0)

  def make(c):
    @jax.checkpoint
    def g(v):
      return jnp.sin(jnp.cos(v) * c)
    return lambda v: jnp.sum(g(v) * v)

  def grads(c):   # a plain closure (its key has a matcher: the front's hit)
    def loss_grad(v):
      return jax.grad(lambda u: jnp.sum(jax.checkpoint(jnp.sin)(u) * u * c))(v)
    return loss_grad

  lock = threading.Lock()

  def branching(c):   # traced each call (a lock: not keyed), its branch shared
    def outer(v):
      assert lock is not None
      return jax.lax.cond(v[0] > -1, grads(c), lambda u: u, v)
    return outer

  def run():
    out = []
    x = jnp.arange(3.0)
    for i, on in enumerate([False] * 6 + [True] * 3 + [False, True]):
      jax.config.update("jax_log_checkpoint_residuals", on)
      del records[:]
      c = 1.5 + (i % 2)
      vals = (jax.jit(jax.grad(make(c)))(x),
              jax.jit(grads(c))(x),
              jax.jit(branching(c))(x),
              # closure-free: a canonical stock object's route
              jax.jit(lambda v: jax.grad(lambda u: jnp.sum(
                  jax.checkpoint(jnp.sin)(u) * u))(v))(x),
              apply(jax.grad(make(c)), x),
              jax.lax.scan(lambda s, v: (s + grads(c)(v), v),
                           jnp.zeros(3), jnp.stack([x, x]))[0])
      out.append((on, [np.asarray(v).tobytes() for v in vals],
                  list(records)))
    return out

  logger = logging.getLogger("jax._src.ad_checkpoint")
  handler = Keep()
  logger.addHandler(handler)
  try:
    want = stock_off(run)
    assert any(on and logs for on, _, logs in want)
    replay_in_both_modes(run, clear=True)
  finally:
    logger.removeHandler(handler)
    jax.config.update("jax_log_checkpoint_residuals", False)


# One mode's run (``sys.argv[1]``: stock, on or verify): fresh functions of
# each route drawing Gumbel noise, stored under one value of
# ``jax_high_dynamic_range_gumbel`` (a state of JAX's trace context its jit
# key leaves out), met again under the other; switched by
# ``jax.config.update``, then by the state's context manager.
_GUMBEL_SWITCHES = r"""
import contextlib, sys
import numpy as np, jax, jax.numpy as jnp
from jax._src import config as jax_config
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")
noise = lambda: jax.random.gumbel(jax.random.key(2), (2,))

def routes(w):
  yield "jit", lambda: jax.jit(lambda a: a * w + noise())(jnp.zeros(2))
  yield "free", lambda: jax.jit(lambda a: a + noise())(jnp.zeros(2))
  yield "cond", lambda: jax.lax.cond(True, lambda a: a * w + noise(),
                                     lambda a: a, jnp.zeros(2))
  yield "scan", lambda: jax.lax.scan(lambda c, v: (c * w + noise(), None),
                                     jnp.zeros(2), None, length=2)[0]
  yield "grad", lambda: jax.jit(jax.grad(
      lambda a: jnp.sum(a * w * noise())))(jnp.ones(2))

out = []
for switch in ("global", "context"):
  for i, on in enumerate([False, False, True, True, False, True]):
    w = jnp.float32(1.5 + i % 2)
    if switch == "global":
      jax.config.update("jax_high_dynamic_range_gumbel", on)
      ctx = contextlib.nullcontext()
    else:
      jax.config.update("jax_high_dynamic_range_gumbel", False)
      ctx = jax_config.use_high_dynamic_range_gumbel(on)
    for name, call in routes(w):
      with ctx:
        out.append((switch, i, name, np.asarray(call()).tobytes().hex()))
print(repr(out))
print(jcc.stats()["verify_mismatches"] if sys.argv[1] != "stock" else 0)
"""


def test_a_trace_context_state_the_jit_key_leaves_out_is_stocks():
  """``jax_high_dynamic_range_gumbel`` (read by the trace, in JAX's trace
  context, left out of its jit key) switched between calls, by
  ``jax.config.update`` and by its context manager, after entries were
  stored under the other value: a fresh jitted closure, a fresh
  closure-free lambda, eager ``cond`` and ``scan`` with fresh bodies and a
  fresh ``jit(grad)`` draw stock's noise at every call, each mode in a
  process of its own."""
  import ast

  def mode(name):
    calls, mismatches = script_lines(_GUMBEL_SWITCHES, name)[-2:]
    return ast.literal_eval(calls), mismatches

  want, _ = mode("stock")
  assert len({got for *_, name, got in want if name == "free"}) == 2
  for name in ("on", "verify"):
    got, mismatches = mode(name)
    assert mismatches == "0", name
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w][:3]


# One mode's run (``sys.argv[1]``): fresh functions of each route asking
# for float64, under ``enable_x64`` twice, then without it (where JAX's
# trace warns that float64 is not available), by the context manager and by
# ``jax_explicit_x64_dtypes``: prints each call's dtype and warning count.
_X64_WARNINGS = r"""
import contextlib, sys, warnings
import numpy as np, jax, jax.numpy as jnp
import jax_closure_cache as jcc
if sys.argv[1] != "stock":
  jcc.enable(verify=sys.argv[1] == "verify")

def routes(w):
  wide = lambda a: a.astype(jnp.float64) * w
  yield "map", lambda: jax.lax.map(lambda a: wide(a), jnp.zeros(2))
  yield "cond", lambda: jax.lax.cond(True, lambda a: wide(a), wide,
                                     jnp.zeros(2))
  yield "scan", lambda: jax.lax.scan(lambda c, v: (c, wide(c)),
                                     jnp.zeros(2), None, length=2)[1]
  yield "jit", lambda: jax.jit(lambda a: wide(a))(jnp.zeros(2))
  yield "free", lambda: jax.jit(lambda a: a.astype(jnp.float64))(jnp.zeros(2))

out = []
for i, mode in enumerate(["x64", "x64", "x32", "x32", "allow", "allow",
                          "warn", "warn", "warn"]):
  w = jnp.float32(1.5 + i % 2)
  if mode in ("allow", "warn"):
    jax.config.update("jax_explicit_x64_dtypes", mode)
  ctx = jax.enable_x64(True) if mode == "x64" else contextlib.nullcontext()
  for name, call in routes(w):
    with ctx, warnings.catch_warnings(record=True) as seen:
      warnings.simplefilter("always")
      r = np.asarray(call())
    out.append((i, name, str(r.dtype), len(seen)))
print(repr(out))
print(jcc.stats()["verify_mismatches"] if sys.argv[1] != "stock" else 0)
"""


def test_a_warning_a_new_signatures_trace_issues_is_stocks():
  """A warning JAX's trace issues for a new signature only (float64 asked
  for where x64 is off), after entries were stored under x64: eager
  ``map``, ``cond`` and ``scan`` with fresh bodies, a fresh jitted closure
  and a fresh closure-free lambda issue it at every call, as stock's fresh
  objects do, and verify mode issues it once, not again with its own
  check; each mode in a process of its own."""
  import ast

  def mode(name):
    calls, mismatches = script_lines(_X64_WARNINGS, name)[-2:]
    return ast.literal_eval(calls), mismatches

  want, _ = mode("stock")
  assert sum(n for *_, n in want) >= 15
  for name in ("on", "verify"):
    got, mismatches = mode(name)
    assert mismatches == "0", name
    assert got == want, [(g, w) for g, w in zip(got, want) if g != w][:3]


def test_the_jit_key_mirror_follows_a_global_change_inside_a_block():
  """Inside one trace-only state's block (``jax_high_dynamic_range_gumbel``
  on this thread), another's global value changes
  (``jax_mutable_array_checks``, by this thread or another): the jit key
  moves, so a jitted object traces under the new value, in this thread
  and in a thread inside such a block, as a fresh object would."""
  import threading
  from jax._src import config as jax_config
  jcc.enable()
  checks = jax_config.mutable_array_checks
  saved = checks.value
  seen = []

  def make():
    return jax.jit(lambda a: (seen.append(checks.value), a + 1)[1])
  try:
    g = make()
    with jax_config.use_high_dynamic_range_gumbel(True):
      g(1.0)
      jax.config.update("jax_mutable_array_checks", not saved)
      g(1.0)
    assert seen == [saved, not saved]
    seen.clear()
    g, inside, changed = make(), threading.Event(), threading.Event()

    def in_a_block():
      with jax_config.use_high_dynamic_range_gumbel(True):
        g(2.0)
        inside.set()
        changed.wait(60)
        g(2.0)
    t = threading.Thread(target=in_a_block)
    t.start()
    inside.wait(60)
    jax.config.update("jax_mutable_array_checks", saved)
    changed.set()
    t.join(60)
    assert seen == [not saved, saved]
  finally:
    jax.config.update("jax_mutable_array_checks", saved)


_jax_config = jax.config   # as ``from jax import config`` binds it


def _settings_snapshot():
  import gc
  return (dict(jax.config.values), np.geterr(), np.get_printoptions(),
          sys.getrecursionlimit(), gc.isenabled(), sys.getswitchinterval())


def _restore_settings(saved):
  import gc
  values, err, printing, limit, collecting, interval = saved
  for name in ("jax_enable_checks", "jax_numpy_rank_promotion"):
    jax.config.update(name, values[name])
  np.seterr(**err)
  np.set_printoptions(**printing)
  sys.setrecursionlimit(limit)
  (gc.enable if collecting else gc.disable)()
  sys.setswitchinterval(interval)


def test_jax_settings_and_process_state_a_trace_reads_or_writes_are_stocks():
  """Fresh closures (a jitted one, an eager ``scan`` body, a ``jit(grad)``)
  whose traces read a JAX setting no jit key holds
  (``jax.config.jax_enable_checks``, switched between calls), or write the
  process's state (``jax.config.update``, NumPy's error handling and print
  options, the recursion limit, the garbage collector's switch, the
  thread switch interval, ``jax.clear_caches()``): every call reads and
  writes as stock's trace does, the state after each call and the values
  both. A setting of JAX's trace context
  (``jax.config.jax_enable_x64``, or through a global bound to
  ``jax.config``) is keyed by JAX's jit key: its reader still hits."""
  import gc
  held = STOCK_JIT(lambda v: v + 1)
  x = jnp.arange(1.0, 4.0)

  def run():
    saved = _settings_snapshot()
    out = []
    try:
      for i, checks in enumerate([True, True, False, False, True]):
        jax.config.update("jax_enable_checks", checks)
        jax.config.update("jax_numpy_rank_promotion", "allow")
        np.seterr(divide="warn")
        np.set_printoptions(precision=8)
        sys.setrecursionlimit(saved[3])
        gc.enable()
        sys.setswitchinterval(0.005)
        held(x)
        c = 2.0 + i % 2

        def signed(v):
          return v * (c if jax.config.jax_enable_checks else -c)

        def signed_global(v):   # the setting through a global
          return v * (c if _jax_config.jax_enable_checks else -c)

        def signed_bare(v):   # the config itself read bare
          return v * c + (1.0 if getattr(_jax_config, "jax_enable_checks")
                          else 0.0)

        def writes_jax(v):
          jax.config.update("jax_numpy_rank_promotion", "raise")
          return v + c

        def writes(v):
          np.seterr(divide="ignore")
          np.set_printoptions(precision=3)
          sys.setrecursionlimit(saved[3] + 7)
          return v * c

        def collects(v):
          gc.disable()
          sys.setswitchinterval(0.001)
          return v / c

        def wide(v):
          return (v * c).astype(jnp.float64 if jax.config.jax_enable_x64
                                else jnp.float32)

        scanned = jax.lax.scan(lambda s, v: (s + signed(v), s), 0.0, x)
        graded = jax.jit(jax.grad(lambda v: signed(v).sum()))(x)
        out.append((i, jax.jit(signed_global)(x).tolist(),
                    jax.jit(signed_bare)(x).tolist()))
        out.append((i, jax.jit(signed)(x).tolist(),
                    [np.asarray(a).tolist() for a in scanned],
                    graded.tolist()))
        out.append((i, jax.jit(writes_jax)(x).tolist(),
                    jax.config.jax_numpy_rank_promotion))
        out.append((i, jax.jit(writes)(x).tolist(),
                    np.geterr()["divide"], np.get_printoptions()["precision"],
                    sys.getrecursionlimit()))
        out.append((i, jax.jit(collects)(x).tolist(), gc.isenabled(),
                    sys.getswitchinterval(), "collects"))
        r = jax.jit(wide)(x)
        out.append((i, str(r.dtype), r.tolist()))
      for i in range(4):   # (apart: a clear drops every entry)
        held(x)
        c = 2.0

        def clears(v):
          jax.clear_caches()
          return v - c
        out.append((i, jax.jit(clears)(x).tolist(), held._cache_size()))
    finally:
      _restore_settings(saved)
    return out

  want = replay_in_both_modes(run, clear=True)
  assert {o[1][0] for o in want if len(o) == 4} == {-2.0, -3.0, 2.0, 3.0}
  assert {(o[1][0], o[2][0]) for o in want if len(o) == 3
          and type(o[1]) is type(o[2]) is list} == {(2.0, 3.0), (3.0, 4.0), (-2.0, 2.0),
                                      (-3.0, 3.0)}
  assert {o[2] for o in want if len(o) == 3 and type(o[2]) is str} == {
      "raise"}
  assert {o[2:] for o in want if len(o) == 5 and o[-1] != "collects"} == {
      ("ignore", 3, sys.getrecursionlimit() + 7)}
  assert {o[2:] for o in want if o[-1] == "collects"} == {
      (False, 0.001, "collects")}
  jcc.clear()
  jcc.enable()
  try:
    x64_hits = jcc.stats()["hits"]
    for c in (2.0, 2.0, 2.0, 2.0):   # stock's, stored, then two hits
      jax.jit(lambda v: (v * c).astype(
          jnp.float64 if jax.config.jax_enable_x64 else jnp.float32))(x)
      jax.jit(lambda v: (v * c).astype(
          jnp.float64 if _jax_config.jax_enable_x64 else jnp.float32))(x)
    assert jcc.stats()["hits"] - x64_hits == 4
  finally:
    jcc.disable()


class _Point:
  __match_args__ = ("a", "b")

  def __init__(self, a, b):
    self.a, self.b = a, b


class _Base:
  pass


def _helper(v):
  return v


def test_state_a_trace_reads_outside_the_key_is_read_anew_as_stock():
  """Fresh jitted closures (and an eager ``scan`` body) whose traces read
  what no key holds, changed after hits: a class pattern's
  ``__match_args__``, a name bound in ``builtins``, a helper's
  ``__qualname__`` and ``__doc__``, a class's ``__subclasses__()``, and
  the caller's local through ``sys._getframe``: each call reads it as
  stock's trace does. Hits answered the earlier value (found by a
  differential pass)."""
  import builtins
  import gc
  x = jnp.arange(1.0, 4.0)

  def run():
    out = []
    _Point.__match_args__ = ("a", "b")
    _helper.__qualname__, _helper.__doc__ = "_helper", None
    builtins._JCC_TEST_SCALE = 2.0
    subclasses = []
    gc.collect()   # (the last run's subclass: a class lives in a cycle)
    try:
      for i, c in enumerate((1.0, 2.0, 1.0, 2.0, 1.0, 2.0)):
        if i == 4:
          _Point.__match_args__ = ("b", "a")
          builtins._JCC_TEST_SCALE = 5.0
          _helper.__qualname__, _helper.__doc__ = "renamed", "doc"
          subclasses.append(type("Sub", (_Base,), {}))
        p = _Point(c, 10.0)

        def matched(y):
          match p:
            case _Point(first, _):
              return y * first

        def scaled(y):
          return y * _JCC_TEST_SCALE + c   # noqa: F821 (bound in builtins)

        def named(y):
          return y * (len(_helper.__qualname__) + (_helper.__doc__ is None))

        def counted(y):
          return y * len(_Base.__subclasses__()) + c

        def framed(y, scale=c * 3):
          frame = sys._getframe(1)
          while frame is not None and "scale" not in frame.f_locals:
            frame = frame.f_back
          return y * (c + (frame is not None))

        for f in (matched, scaled, named, counted, framed):
          out.append((i, f.__name__, jax.jit(f)(x).tolist()))
        out.append((i, float(jax.lax.scan(
            lambda s, v: (s + named(v) + counted(v), s), 0.0, x)[0])))
    finally:
      del builtins._JCC_TEST_SCALE
      _Point.__match_args__ = ("a", "b")
      _helper.__qualname__, _helper.__doc__ = "_helper", None
      del subclasses[:]
    return out

  replay_in_both_modes(run, clear=True)
