"""pytest plugin: ``--closure-cache`` runs any test suite with the cache on;
``--closure-cache-verify`` runs it in verify mode (every hit also answered
as stock would answer it and compared; a test during which a hit differed
from stock fails, with the count, although stock's answer was returned).

Registered through the ``pytest11`` entry point, so it is available wherever
the package is installed. Loading it imports nothing heavy: jax is imported
only when an option is given, in ``pytest_configure``, which runs before
test modules are collected, so modules that bind ``from jax import jit`` at
import get the patched object.

Example::

    python -m pytest --closure-cache tests/
    python -m pytest --closure-cache-verify tests/
"""


import pytest


def pytest_addoption(parser):
  parser.addoption(
      "--closure-cache", action="store_true", default=False,
      help="run the tests with jax_closure_cache enabled (jax.jit and "
           "jax.lax control flow cache on closure contents)")
  parser.addoption(
      "--closure-cache-verify", action="store_true", default=False,
      help="as --closure-cache, in verify mode: every hit is also traced "
           "(or lowered) as stock would and compared; any mismatch fails "
           "the session")


def _on(config) -> bool:
  return (config.getoption("--closure-cache")
          or config.getoption("--closure-cache-verify"))


#: A test that makes mismatches on purpose (verify mode's own tests) and
#: counts them itself: the session's check leaves it alone.
EXPECTS_MISMATCHES = "closure_cache_expects_mismatches"


def pytest_configure(config):
  config.addinivalue_line(
      "markers", f"{EXPECTS_MISMATCHES}: the test makes verify-mode "
      "mismatches on purpose and counts them itself")
  if _on(config):
    import jax_closure_cache
    jax_closure_cache.enable(
        verify=True if config.getoption("--closure-cache-verify") else None)


def pytest_report_header(config):
  if _on(config):
    import jax_closure_cache
    from jax_closure_cache import cache
    return (f"jax_closure_cache: enabled={jax_closure_cache.is_enabled()} "
            f"verify={cache.verifying()}")
  return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  if (not item.config.getoption("--closure-cache-verify")
      or item.get_closest_marker(EXPECTS_MISMATCHES) is not None):
    return (yield)
  from jax_closure_cache import cache
  before = cache.verify_totals()
  result = yield
  checked, mismatches = cache.verify_totals()
  if mismatches > before[1]:
    raise AssertionError(
        f"jax_closure_cache verify mode: {mismatches - before[1]} of "
        f"{checked - before[0]} hits in this test differed from stock's "
        "trace (stock's answer was returned; the log names each one)")
  return result
