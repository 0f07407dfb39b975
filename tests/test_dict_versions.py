"""A generated matcher skips the checks of a dict's globals while the
dict's version tag is one at which they held (``key/versions.py``), and
makes every check again once the dict changes: a replaced, removed or
re-added global of a module a walked function reads is seen at the next
call, as stock's next trace sees it. Without version tags (no extension)
the matchers make every check every call. Each case against stock on
fresh function objects.
"""

import types

import jax.numpy as jnp
import pytest

import jax_closure_cache as jcc
from jax_closure_cache import cache
from jax_closure_cache.key import closure, matchers, versions
from conftest import STOCK_JIT, assert_like_stock, stock_off


def _outcome(call):
  try:
    return call()
  except Exception as e:   # stock's exception is the answer to compare
    return type(e)


def _like_stock(module, w, x):
  """The cache's call of a fresh function, against stock's of another:
  the same values, or the same exception type."""
  want = stock_off(lambda: _outcome(lambda: STOCK_JIT(_make(module, w))(x)))
  got = _outcome(lambda: jcc.jit(_make(module, w))(x))
  if isinstance(want, type):
    assert got is want
  else:
    assert not isinstance(got, type), got
    assert_like_stock(got, _make(module, w), x)


def _module_with_helper():
  """A module whose closures' helper reads two globals (a float and an
  int): the closures' own globals dict, which their matchers hold."""
  module = types.ModuleType("dict_versions_helpers")
  exec("SCALE = 2.0\nOFFSET = 1\n"
       "def helper(v):\n  return v * SCALE + OFFSET\n"
       "def make(w):\n  def f(x):\n    return helper(x @ w)\n  return f\n",
       module.__dict__)
  return module


def _make(module, w):
  return module.make(w)


def _calls(module):
  x = jnp.ones((3, 3))
  for i in range(3):   # stock's object, the entry, a hit
    w = jnp.eye(3) * (i + 1.0)
    assert_like_stock(jcc.jit(_make(module, w))(x), _make(module, w), x)
  return x


@pytest.mark.parametrize("change", ["replaced", "removed", "re-added",
                                    "same object again", "other global"])
def test_a_changed_global_is_seen_after_hits(change):
  module = _module_with_helper()
  x = _calls(module)
  w = jnp.eye(3)
  if change == "replaced":
    module.SCALE = 3.0
  elif change == "removed":   # stock's trace raises NameError
    del module.SCALE
  elif change == "re-added":
    del module.SCALE
    module.SCALE = 2.0
  elif change == "same object again":
    module.SCALE = module.SCALE
  else:   # a global the helper does not read: the checks hold again
    module.unrelated = 1
  before = cache.STORE.record_hits()
  for _ in range(2):
    _like_stock(module, w, x)
  if change in ("same object again", "other global"):
    # the same key: both calls hit through the front, their checks made
    # again at the new tag and held
    assert cache.STORE.record_hits() - before == 2
  module.OFFSET = 3   # and once more, after those calls
  _like_stock(module, w, x)


def test_tags_move_with_every_change_here():
  """On this interpreter, where the extension is built, the tags are in
  use (``.ci/run`` requires it there)."""
  if versions.version is None:
    pytest.skip("dict version tags not built here")
  d = {"a": 1}
  tag = versions.version(d)
  assert versions.version(d) == tag   # unchanged, the same tag
  d["a"] = 1.0
  assert versions.version(d) != tag
  with pytest.raises(TypeError):
    versions.version(types.MappingProxyType(d))


def test_without_tags_every_check_is_made(monkeypatch):
  """Without tags (``version`` None) a matcher made then reads none and
  still sees a changed global."""
  monkeypatch.setattr(versions, "version", None)
  module = _module_with_helper()
  f = _make(module, jnp.eye(3))
  src = matchers.match_source(f, closure.analyse(f).key)
  assert src is not None
  assert not any("version(" in line for line in src.block())
  x = _calls(module)
  module.SCALE = 5.0
  for _ in range(2):
    _like_stock(module, jnp.eye(3), x)


def test_a_matcher_reads_each_module_dicts_tag_once():
  """With tags, the globals two helpers of one module read (two each) are
  one tag read, not four lookups."""
  if versions.version is None:
    pytest.skip("dict version tags not built here")
  module = types.ModuleType("dict_versions_two_helpers")
  exec("SCALE = 2.0\nOFFSET = 1\nPOWER = 2\n"
       "def helper(v):\n  return v * SCALE + OFFSET\n"
       "def other(v):\n  return v ** POWER - OFFSET\n"
       "def make(w):\n  def f(x):\n    return other(helper(x @ w))\n"
       "  return f\n", module.__dict__)
  f = module.make(jnp.eye(3))
  lines = matchers.match_source(f, closure.analyse(f).key).block()
  assert sum("version(" in line for line in lines) == 1
  for name in ("'SCALE'", "'OFFSET'", "'POWER'"):
    assert [line for line in lines if name in line] == [
        line for line in lines if name in line and "version" not in line
        and " != " in line and "[0] and (" in line]


def test_a_matcher_agrees_with_the_key_when_a_helpers_module_name_changes():
  """A walked helper renamed into a library's module (``functools.wraps``
  copies ``__module__``) is still the user's code, walked as before (its
  code was not loaded from jax's folder): the key is the same, and the
  matcher of the earlier key agrees; a change to what it reads is seen by
  both."""
  module = _module_with_helper()
  f0 = module.make(jnp.eye(3))
  key = closure.analyse(f0).key
  match = matchers.compile_matcher(matchers.match_source(f0, key))
  assert match(module.make(jnp.eye(3))) is not None
  module.helper.__module__ = "jax.numpy"
  f1 = module.make(jnp.eye(3))
  assert closure.analyse(f1).key == key
  assert match(f1) is not None
  module.SCALE = 3.0
  f2 = module.make(jnp.eye(3))
  assert closure.analyse(f2).key != key
  assert match(f2) is None


class _Globals(dict):
  """A dict subclass as a function's globals (``FunctionType`` takes one)."""


def test_globals_in_a_dict_subclass_hit_through_the_front():
  """A dict subclass has no version tag: its globals are checked one by
  one, and hit."""
  g = _Globals(SCALE=2.0, OFFSET=1, __builtins__=__builtins__)
  exec("def make(w):\n  def f(x):\n    return (x @ w) * SCALE + OFFSET\n"
       "  return f\n", g)
  x = jnp.ones((3, 3))
  for i in range(3):
    w = jnp.eye(3) * (i + 1.0)
    assert_like_stock(jcc.jit(g["make"](w))(x), g["make"](w), x)
  before = cache.STORE.record_hits()
  for i in range(2):
    w = jnp.eye(3) * (i + 5.0)
    assert_like_stock(jcc.jit(g["make"](w))(x), g["make"](w), x)
  assert cache.STORE.record_hits() - before == 2
  g["SCALE"] = 3.0
  assert_like_stock(jcc.jit(g["make"](x))(x), g["make"](x), x)


def test_a_global_array_beside_other_globals_is_lifted_on_the_fast_path():
  """A lifted array read from a global is a leaf, never a check skipped by
  the tag: functions reading it beside other globals of one module hit
  through the generated front, with the array passed as it is now."""
  module = types.ModuleType("dict_versions_arrays")
  exec("SCALE = 2.0\nOFFSET = 1\n"
       "def make(w):\n  def f(x):\n    return (x @ w) * SCALE + OFFSET + W\n"
       "  return f\n", module.__dict__)
  module.W = jnp.asarray([1.0, 1.5, 2.0])   # (not one value: (x + 1) + W)
  x = jnp.ones((3, 3))
  for i in range(3):   # stock's object, the entry, a hit
    w = jnp.eye(3) * (i + 1.0)
    assert_like_stock(jcc.jit(module.make(w))(x), module.make(w), x)
  before = cache.STORE.record_hits()
  for i in range(3):
    module.W = jnp.asarray([i, i + 0.5, i + 1.0])   # a new array: the same key
    w = jnp.eye(3) * (i + 1.0)
    assert_like_stock(jcc.jit(module.make(w))(x), module.make(w), x)
  assert cache.STORE.record_hits() - before == 3


@pytest.mark.parametrize("tagged", [True, False])
def test_a_library_classs_kept_answer_follows_its_namespace(monkeypatch,
                                                          tagged):
  """``library_class`` keeps its answer per class while the class's
  namespace is unchanged (its version tag, or without the extension its
  values' ids): a method the user sets on a library's class makes it the
  user's at once, and removing it makes it the library's again."""
  import fractions
  from jax_closure_cache.key import code_plan
  from jax_closure_cache.key.code_plan import library_class
  if not tagged:
    monkeypatch.setattr(code_plan, "_namespace_version", None)
  elif code_plan._namespace_version is None:
    pytest.skip("the version-tag extension is not built here")
  assert library_class(fractions.Fraction)
  with monkeypatch.context() as patched:
    patched.setattr(fractions.Fraction, "__float__", lambda self: 2.0)
    assert not library_class(fractions.Fraction)
  assert library_class(fractions.Fraction)
  monkeypatch.setattr(fractions.Fraction, "extra", lambda self: 2.0,
                      raising=False)
  assert not library_class(fractions.Fraction)
