"""pytest plugin: ``--closure-cache`` runs any test suite with the cache on.

Registered through the ``pytest11`` entry point, so it is available wherever
the package is installed. Loading it imports nothing heavy: jax is imported
only when the option is given, in ``pytest_configure``, which runs before
test modules are collected, so modules that bind ``from jax import jit`` at
import get the patched object.

Example::

    python -m pytest --closure-cache tests/
"""


def pytest_addoption(parser):
  parser.addoption(
      "--closure-cache", action="store_true", default=False,
      help="run the tests with jax_closure_cache enabled (jax.jit and "
           "jax.lax control flow cache on closure contents)")


def pytest_configure(config):
  if config.getoption("--closure-cache"):
    import jax_closure_cache
    jax_closure_cache.enable()


def pytest_report_header(config):
  if config.getoption("--closure-cache"):
    import jax_closure_cache
    return f"jax_closure_cache: enabled={jax_closure_cache.is_enabled()}"
  return None
