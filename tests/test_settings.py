"""One parser for every environment variable (``settings``)."""

import warnings

import pytest

from jax_closure_cache import settings


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
  monkeypatch.setattr(settings, "WARNED", set())


@pytest.mark.parametrize("raw,expected", [
    (None, False), ("", False), ("  ", False), ("0", False), (" OFF ", False),
    ("no", False), ("1", True), ("Yes", True), ("on", True)])
def test_flag_values(monkeypatch, raw, expected):
  if raw is None:
    monkeypatch.delenv(settings.LIFT_NUMPY.name, raising=False)
  else:
    monkeypatch.setenv(settings.LIFT_NUMPY.name, raw)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert settings.read(settings.LIFT_NUMPY) is expected


def test_garbled_flag_warns_once_and_keeps_the_default(monkeypatch):
  monkeypatch.setenv(settings.LIFT_NUMPY.name, "maybe")
  with pytest.warns(UserWarning, match="JAX_CLOSURE_CACHE_LIFT_NUMPY='maybe'"):
    assert settings.read(settings.LIFT_NUMPY) is False
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # once per variable
    assert settings.read(settings.LIFT_NUMPY) is False


@pytest.mark.parametrize("raw,expected,warns", [
    ("5", 5, False), (" 12 ", 12, False), ("0", 8, True), ("-3", 8, True),
    ("many", 8, True), ("", 8, False)])
def test_count_values(monkeypatch, raw, expected, warns):
  monkeypatch.setenv(settings.STORM_THRESHOLD.name, raw)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert settings.read(settings.STORM_THRESHOLD) == expected
  assert bool(caught) is warns


def test_ignored_variable_warns_once_at_enable(monkeypatch):
  """``JAX_CLOSURE_CACHE_AUTO_DYNAMIC`` is not read: set, ``enable()``
  warns once that it is ignored, and why (tier A shares a changing scalar's
  executable); unset or empty, nothing is said."""
  import jax_closure_cache as jcc
  assert "JAX_CLOSURE_CACHE_AUTO_DYNAMIC" not in {s.name for s in settings.ALL}
  monkeypatch.setenv("JAX_CLOSURE_CACHE_AUTO_DYNAMIC", "1")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jcc.enable()
    jcc.disable()
    jcc.enable()   # once per process
  jcc.disable()
  said = [str(w.message) for w in caught
          if "JAX_CLOSURE_CACHE_AUTO_DYNAMIC" in str(w.message)]
  assert len(said) == 1, said
  assert said[0].startswith(
      "JAX_CLOSURE_CACHE_AUTO_DYNAMIC='1' is ignored: auto-dynamic scalars "
      "were removed; "), said
  assert "shared after that stock trace (tier A)" in said[0], said
  assert caught[[str(w.message) for w in caught].index(said[0])].filename \
      == __file__   # the caller of enable()
  for raw in (None, "", " "):
    monkeypatch.setattr(settings, "WARNED", set())
    if raw is None:
      monkeypatch.delenv("JAX_CLOSURE_CACHE_AUTO_DYNAMIC")
    else:
      monkeypatch.setenv("JAX_CLOSURE_CACHE_AUTO_DYNAMIC", raw)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      jcc.enable()
    jcc.disable()


def test_only_settings_reads_the_environment():
  """Outside ``settings`` (and the tools, which only pass the environment on
  to subprocesses), no module reads an environment variable itself."""
  import os
  import re
  root = os.path.dirname(settings.__file__)
  readers = []
  for folder, _, files in os.walk(root):
    if os.path.basename(folder) == "tools":
      continue
    for f in files:
      path = os.path.join(folder, f)
      if f.endswith(".py") and f != "settings.py":
        with open(path) as fh:
          if re.search(r"os\.environ|os\.getenv", fh.read()):
            readers.append(os.path.relpath(path, root))
  assert readers == []
  names = {s.name for s in settings.ALL}
  assert len(names) == len(settings.ALL)
  assert all(n.startswith("JAX_CLOSURE_CACHE") for n in names)
