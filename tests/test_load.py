"""Safety under load: threads, many closures over large arrays, eviction,
and a property test over random closure contents."""

import contextlib
import gc
import os
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import jax_closure_cache as jcc
from conftest import assert_like_stock, counting


def scaled(w, b):
  return lambda x: x * w + b


def test_eight_threads_each_500_calls_over_distinct_arrays():
  x = jnp.arange(4.0, dtype=jnp.float32)
  # (not ones: stock's module folds x * 1)
  jcc.jit(scaled(jnp.full(4, 2.0), 0.0))(x)   # the first object is stock's
  jcc.jit(scaled(jnp.full(4, 2.0), 0.0))(x)   # one entry, shared by all threads
  errors = []

  def worker(t):
    try:
      for i in range(500):
        value = np.float32(t * 1000 + i + 2)
        w = jnp.full(4, value, dtype=jnp.float32)
        out = np.asarray(jcc.jit(scaled(w, 0.0))(x))
        np.testing.assert_array_equal(out, np.arange(4.0, dtype=np.float32) * value)
    except Exception as e:   # surfaced below; a thread cannot fail the test
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert errors == []
  s = jcc.stats()
  assert s["misses"] == 2 and s["hits"] == 8 * 500 and s["fallbacks"] == 0


def rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096


def test_ten_thousand_closures_over_1mb_arrays_stay_bounded():
  x = jnp.ones((), jnp.float32)
  make = lambda w: (lambda x: x + w[0])
  jcc.jit(make(jnp.zeros(1 << 18, jnp.float32)))(x)   # 1 MiB of float32
  jcc.jit(make(jnp.zeros(1 << 18, jnp.float32)))(x)   # the shared entry
  gc.collect()
  before = rss_bytes()
  refs = []
  for i in range(10_000):
    w = jnp.full(1 << 18, float(i), jnp.float32)
    out = jcc.jit(make(w))(x)
    if i % 500 == 0:
      refs.append(weakref.ref(w))
      assert float(out) == 1.0 + i
    del w, out
  gc.collect()
  grown = rss_bytes() - before
  assert all(r() is None for r in refs)          # every closed-over array freed
  assert grown < 256 << 20, grown                # 10,000 MiB went through
  assert jcc.stats()["misses"] == 2


@contextlib.contextmanager
def two_entries_keyed_by_value():
  """Capacity 2, scalars keyed by value (one entry each); yields ``make``,
  a closure factory, and ``x``."""
  old = jcc.capacity()
  jcc.set_capacity(2)
  try:
    yield (lambda s: (lambda x: x * s)), jnp.ones(2)
  finally:
    jcc.set_capacity(old)


def test_lru_evicts_the_least_recently_used():
  with two_entries_keyed_by_value() as (make, x):
    for s in (1.0, 2.0, 3.0):   # each key met once: stock's, no entry
      jcc.jit(make(s))(x)
    assert jcc.stats()["entries"] == 0
    jcc.jit(make(1.0))(x)   # A, met again
    jcc.jit(make(2.0))(x)   # B
    jcc.jit(make(1.0))(x)   # A used again
    jcc.jit(make(3.0))(x)   # C: evicts B, the least recently used
    assert jcc.stats()["entries"] == 2
    with counting() as c:
      out = jcc.jit(make(1.0))(x)   # A survived
    assert c["compiles"] == 0
    assert_like_stock(out, make(1.0), x)
    misses = jcc.stats()["misses"]
    assert_like_stock(jcc.jit(make(2.0))(x), make(2.0), x)     # B was evicted
    assert jcc.stats()["misses"] == misses + 1


def test_a_hit_of_the_fast_front_counts_as_a_use_for_eviction():
  """The fast front counts its hits on the entry's record alone; that count
  must both reach stats() and keep the entry from eviction."""
  from jax_closure_cache.front import generated
  with two_entries_keyed_by_value() as (make, x):
    jcc.jit(make(9.0))(x)   # the code's first object: stock's own jit
    for s in (1.0, 2.0, 3.0):   # each key met once: stock's, no entry
      jcc.jit(make(s))(x)
    jcc.jit(make(1.0))(x)   # A, met again
    jcc.jit(make(2.0))(x)   # B
    hits = jcc.stats()["hits"]
    w = jcc.jit(make(1.0))
    assert type(w).__call__.__code__.co_filename == generated.FILENAME
    w(x)                    # A, hit by the front
    assert jcc.stats()["hits"] == hits + 1
    jcc.jit(make(3.0))(x)   # C: evicts B, not A
    misses = jcc.stats()["misses"]
    assert_like_stock(jcc.jit(make(1.0))(x), make(1.0), x)   # A survived
    assert jcc.stats()["misses"] == misses
    assert_like_stock(jcc.jit(make(2.0))(x), make(2.0), x)   # B was evicted
    assert jcc.stats()["misses"] == misses + 1


# -- property: random closure contents ---------------------------------------

def nested_fn(c):
  return lambda x: x * c


ATOMS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=False, width=32),
    st.sampled_from([0.0, -0.0, float("nan")]),
    st.integers(-3, 3), st.booleans(),
    st.sampled_from([np.float32(1), np.int32(1), np.float32(-0.0)]),
    st.text(max_size=2),
    st.builds(lambda n, dt: jnp.arange(n, dtype=dt) + 1,
              st.integers(1, 3), st.sampled_from([jnp.float32, jnp.int32])),
    st.builds(nested_fn, st.floats(-2, 2, width=32)),
)
CONTENTS = st.recursive(
    ATOMS, lambda inner: st.one_of(
        st.tuples(inner, inner), st.lists(inner, max_size=2),
        st.dictionaries(st.sampled_from("ab"), inner, max_size=2)),
    max_leaves=4)


def contribution(leaf, x):
  if callable(leaf):
    return leaf(x).sum()
  if isinstance(leaf, str):
    return jnp.float32(len(leaf))
  return jnp.sum(jnp.asarray(leaf).astype(jnp.float32))


def make_fold(c):
  def fold(x):
    out = x * 1.5
    for i, leaf in enumerate(jax.tree_util.tree_leaves(c)):
      out = out + (i + 1) * contribution(leaf, x)
    return out
  return fold


def _dict_orders(c):
  if isinstance(c, dict):
    return (tuple(c), tuple(_dict_orders(v) for v in c.values()))
  if isinstance(c, (list, tuple)):
    return tuple(_dict_orders(v) for v in c)
  return ()


def canonical(c):
  """What the key may depend on: structure, types, and exact static values;
  arrays by type only (they are lifted), functions by what they close over."""
  leaves, treedef = jax.tree_util.tree_flatten(c)
  # a dict's treedef sorts its keys; the key keeps insertion order (the
  # function iterates it in that order), so the order is part of it too
  out = [treedef, _dict_orders(c)]
  for leaf in leaves:
    if isinstance(leaf, jax.Array):
      out.append(("array",))
    elif callable(leaf):
      out.append(("fn", float(leaf.__closure__[0].cell_contents).hex()))
    elif isinstance(leaf, float):
      out.append((float, leaf.hex()))
    elif isinstance(leaf, np.generic):
      out.append((type(leaf), leaf.tobytes()))
    else:
      out.append((type(leaf), leaf))
  return out


# PROPERTY_EXAMPLES=300 for a longer hunt; 40 keeps CI quick.
@settings(max_examples=int(os.environ.get("PROPERTY_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=CONTENTS, b=CONTENTS)
def test_random_closures_match_stock_and_never_share_wrongly(a, b):
  jcc.clear()
  x = jnp.arange(3.0, dtype=jnp.float32)
  # Stock bakes closed-over arrays as constants that XLA folds with its
  # other constants; a key whose scalars it folds so is stock's, and the
  # rest compute alike: results, dtypes and weak types exactly stock's.
  # a's first object is stock's, its second compiles the shared entry; b,
  # if its key is a's, hits it twice, else its first object is a key met
  # once (stock's) and its second, met again, compiles its own entry
  assert_like_stock(jcc.jit(make_fold(a))(x), make_fold(a), x)
  assert_like_stock(jcc.jit(make_fold(a))(x), make_fold(a), x)
  assert_like_stock(jcc.jit(make_fold(b))(x), make_fold(b), x)
  assert_like_stock(jcc.jit(make_fold(b))(x), make_fold(b), x)
  same = canonical(a) == canonical(b)
  s = jcc.stats()
  reasons = dict(s["fallback_reasons"])
  if reasons.pop("folds_constants", 0):
    # scalars XLA folds together in stock's module (a lifted array's sum
    # added after another scalar): stock answers that key's objects
    assert s["hits"] == 0, (a, b)
    return
  if reasons.pop("lifted_value", 0):
    # a lifted array holding a value stock's module folds by (zeros added,
    # ones multiplied by): those calls are stock's, their results checked
    return
  assert reasons == ({} if same else {"key_met_once": 1}), (a, b)
  assert (s["hits"], s["misses"]) == ((2, 2) if same else (0, 3)), (a, b)
