"""Packaging for jax-closure-cache, for the JAX releases it supports.

The start-up hook ``jax_closure_cache_startup.pth`` is copied to the root of
the build, so that it lands in site-packages next to the package: Python runs
its one line at every start, which imports the package (and not jax) only
when ``JAX_CLOSURE_CACHE`` is set. The upstream pull requests (one folder per
pull request and JAX tag) are copied into the package for
``python -m jax_closure_cache patch``.
"""

import os

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "jax_closure_cache_startup.pth"
PRS = os.path.join(HERE, "patches", "prs")


class BuildPyWithStartupHook(build_py):
  """Also installs the start-up hook at the root of site-packages and the
  upstream pull requests inside the package (``patch apply`` reads the
  versions for the installed jax there, from
  ``jax_closure_cache/patches/<pr>/<tag>/``)."""

  def _extras(self):
    return [(os.path.join(HERE, "jax_closure_cache", PTH),
             os.path.join(self.build_lib, PTH))] + [
                (os.path.join(PRS, pr, tag, name),
                 os.path.join(self.build_lib, "jax_closure_cache", "patches",
                              pr, tag, name))
                for pr in sorted(os.listdir(PRS))
                if os.path.isdir(os.path.join(PRS, pr)) and pr != "allowed"
                for tag in sorted(os.listdir(os.path.join(PRS, pr)))
                for name in sorted(os.listdir(os.path.join(PRS, pr, tag)))
                if name.endswith(".patch")]

  def run(self):
    super().run()
    for src, dst in self._extras():
      self.mkpath(os.path.dirname(dst))
      self.copy_file(src, dst)

  def get_outputs(self, include_bytecode=1):
    return [*super().get_outputs(include_bytecode),
            *(dst for _, dst in self._extras())]


setup(
    name="jax-closure-cache",
    version="0.1.0",
    description=("jax.jit that caches on a closure's contents: re-created "
                 "closures reuse one compiled executable"),
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["jax_closure_cache", "jax_closure_cache.*"]),
    package_data={"jax_closure_cache": [PTH]},
    # absl-py: the benchmark reads JAX's counters in jax._src.test_util.
    # The releases in _compat.SUPPORTED_RELEASES (0.10.2 and 0.11.x; pip
    # picks 0.10.2 on Python 3.11, which 0.11 does not support).
    install_requires=["jax>=0.10.2,<0.12", "jaxlib>=0.10.2,<0.12", "absl-py"],
    extras_require={
        "test": ["pytest", "absl-py", "hypothesis", "matplotlib"],
        # bench --plot
        "plot": ["matplotlib"],
        # The seed's real client, for the benchmark's GPT-2 generate row:
        # the last transformers line with Flax, which runs on jax 0.10.2.
        "clients": ["transformers==4.57.6", "flax==0.12.8"],
        # tests/ecosystem and `bench --only ecosystem`: the newest releases
        # that install beside jax/jaxlib 0.10.2 on Python 3.11 (flax 0.12.9
        # and later need Python 3.12; optax 0.2.8 no longer needs chex).
        "ecosystem": ["optax==0.2.8", "equinox==0.13.8", "flax==0.12.8",
                      "dm-haiku==0.0.17"],
    },
    # The fast front's entrance in C (jax_closure_cache/front/_entrance.c): optional,
    # so a machine without a compiler installs the pure-Python front, which
    # behaves the same and is about 0.15 us slower per re-created closure.
    # The dicts' version tags (jax_closure_cache/key/_versions.c), with which
    # a generated matcher skips the checks of a library's globals while its
    # module dict is unchanged: optional too (CPython 3.11 to 3.13).
    ext_modules=[Extension("jax_closure_cache.front._entrance",
                           ["jax_closure_cache/front/_entrance.c"],
                           optional=True),
                 Extension("jax_closure_cache.key._versions",
                           ["jax_closure_cache/key/_versions.c"],
                           optional=True)],
    cmdclass={"build_py": BuildPyWithStartupHook},
    entry_points={
        "console_scripts": [
            "jax-closure-cache=jax_closure_cache.tools.cli:main"],
        "pytest11": ["jax_closure_cache = jax_closure_cache.pytest_plugin"],
    },
)
