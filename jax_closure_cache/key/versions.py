"""Dict version tags: a generated matcher's checks of one dict's globals,
skipped while that dict is unchanged.

``version(d)`` is the version tag CPython keeps for the dict ``d``
(``key/_versions.c``), which changes with every change to ``d`` and is
never the same on two states of it; None where the extension is not built
or this interpreter's tags do not behave so (checked once at import). The
matchers then make every check on every call, as without this module.
``namespace_version(t)`` is the tag of a run-time class's namespace dict
(``code_plan.library_class`` keeps its answer while it holds).

Invariant: a matcher skips a dict's checks only at a version at which they
passed, for the same dict object (it compares the dict itself by identity).
"""

from __future__ import annotations

try:
  from jax_closure_cache.key._versions import version as _version
  from jax_closure_cache.key._versions import (
      namespace_version as _namespace_version)
except ImportError:   # not built (no compiler, or a CPython without tags)
  _version = _namespace_version = None


def _tags_move(version) -> bool:
  """Whether ``version`` changes with each kind of change to a dict and
  differs between two dicts."""
  d, other = {"a": 1}, {"a": 1}
  seen = [version(d)]
  d["a"] = 2   # a value replaced
  seen.append(version(d))
  d["b"] = 3   # a key added
  seen.append(version(d))
  del d["b"]   # a key removed
  seen.append(version(d))
  d.update(a=4)
  seen.append(version(d))
  return len(set(seen)) == len(seen) and version(other) not in seen


version = _version if _version is not None and _tags_move(_version) else None


def _class_tags_move(namespace_version) -> bool:
  """Whether ``namespace_version`` changes when a class attribute is set,
  replaced or deleted."""
  class Probe:
    pass
  seen = [namespace_version(Probe)]
  Probe.a = 1
  seen.append(namespace_version(Probe))
  Probe.a = 2
  seen.append(namespace_version(Probe))
  del Probe.a
  seen.append(namespace_version(Probe))
  return len(set(seen)) == len(seen)


#: ``namespace_version(t)``: the version tag of a run-time class's namespace
#: (None where not built or not moving as a dict's tag should).
namespace_version = (_namespace_version if version is not None
                     and _class_tags_move(_namespace_version) else None)
