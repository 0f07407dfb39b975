"""The package's layout keeps the three layers apart (CONTRIBUTING,
"Architecture"): imports go one way, no module takes another's private
names, and there is no import cycle, lazy imports inside functions included.
"""

import ast
import collections
import importlib
import os
import re
import types
import weakref

import pytest

import jax_closure_cache

ROOT = os.path.dirname(jax_closure_cache.__file__)
PACKAGE = "jax_closure_cache"


def _modules() -> dict:
  found = {}
  for folder, _, files in os.walk(ROOT):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        name = PACKAGE if rel == "__init__" else f"{PACKAGE}.{rel}"
        found[name.removesuffix(".__init__")] = path
  return found


MODULES = _modules()


def _imports(name: str):
  """``(imported module, imported name or None)`` for every import of the
  package in module ``name``, at any depth."""
  with open(MODULES[name]) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if full in MODULES or f"{full}" == f"{PACKAGE}.front._entrance":
          yield full, None
        else:
          yield node.module, alias.name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith(PACKAGE):
          yield alias.name, None


def _layer(name: str) -> str:
  rest = name[len(PACKAGE) + 1:]
  return rest.partition(".")[0] if "." in rest else "top"


# What each layer may import from the package, besides itself.
ALLOWED = {
    "lowering": {"_compat", "atoms", "cache", "settings"},
    "key": {"_compat", "atoms", "cache"},
    "lookup": {"_compat", "atoms", "cache", "key"},
    "front": {"_compat", "atoms", "cache", "settings", "events", "diagnostics",
              "explain", "key",
              "lookup", "lowering"},
    "control_flow": {"_compat", "atoms", "front", "key"},
}


def _target_layer(target: str) -> str:
  rest = target[len(PACKAGE) + 1:]
  return rest.partition(".")[0]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_go_one_way(layer):
  wrong = []
  for name in MODULES:
    if name.startswith(f"{PACKAGE}.") and _layer(name) == layer:
      for target, _ in _imports(name):
        if target == PACKAGE:
          continue
        t = _target_layer(target)
        if t != layer and t not in ALLOWED[layer]:
          wrong.append(f"{name} imports {target}")
  assert wrong == []


def test_nothing_on_a_call_path_imports_the_tools():
  wrong = [f"{name} imports {target}" for name in MODULES
           if _layer(name) != "tools"
           for target, _ in _imports(name)
           if _target_layer(target) == "tools"
           and name != f"{PACKAGE}.__main__"]
  assert wrong == []


def test_no_module_imports_another_modules_private_names():
  wrong = [f"{name}: {module}.{attr}" for name in MODULES
           for module, attr in _imports(name)
           if attr is not None and attr.startswith("_")]
  assert wrong == []


def test_no_import_cycle():
  edges = {name: {t for t, _ in _imports(name) if t in MODULES and t != name
                  and t != PACKAGE}
           for name in MODULES}
  state, cycles = {}, []

  def visit(node, stack):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(edges[node]):
      if state.get(nxt) == "open":
        cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
      elif nxt not in state:
        visit(nxt, stack)
    stack.pop()
    state[node] = "done"

  for name in sorted(MODULES):
    if name not in state:
      visit(name, [])
  assert cycles == []


def test_only_the_compat_layer_imports_jaxs_private_modules():
  """``_compat`` (its ``__init__`` and ``trace``) is the one place a JAX or
  jaxlib private module is imported, lazy imports included."""
  wrong = []
  for name, path in MODULES.items():
    if name.startswith(f"{PACKAGE}._compat"):
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        targets = [node.module or ""]
      elif isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      else:
        continue
      wrong += [f"{name} imports {t}" for t in targets
                if t.startswith(("jax._src", "jaxlib."))]
  assert wrong == []


#: Private names of Python's own that the package may read anywhere.
_PYTHON_PRIVATE = frozenset({"_make", "_fields", "_replace", "_asdict",
                             "_getframe"})


def _private_reads(tree) -> dict:
  """Private attribute names read on something other than ``self``/``cls``
  (``x._a``, ``getattr(x, "_a")``, ``NAME = "_a"``), each with a line."""
  found = {}
  for node in ast.walk(tree):
    name = None
    if (isinstance(node, ast.Attribute)
        and not (isinstance(node.value, ast.Name)
                 and node.value.id in ("self", "cls"))):
      name = node.attr
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("getattr", "hasattr", "setattr")
          and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
      name = node.args[1].value
    elif (isinstance(node, ast.Assign)
          and isinstance(node.value, ast.Constant)
          and all(isinstance(t, ast.Name) and t.id.isupper()
                  for t in node.targets)):
      name = node.value.value
    if (isinstance(name, str) and name.startswith("_")
        and not name.startswith("__") and name not in _PYTHON_PRIVATE):
      found.setdefault(name, node.lineno)
  return found


def test_only_the_compat_layer_reads_jaxs_private_attributes():
  """A private attribute ``_compat`` reads on JAX's objects (``_committed``,
  ``_jit_info``, ...: those it reads that the package defines nowhere) is
  read nowhere else: a JAX release that renames one changes ``_compat``
  alone."""
  trees = {}
  for name, path in MODULES.items():
    with open(path) as f:
      trees[name] = ast.parse(f.read())
  own = set()
  for tree in trees.values():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        own.add(node.name)
      elif isinstance(node, ast.Name):
        own.add(node.id)
      elif (isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")):
        own.add(node.attr)
  compat = f"{PACKAGE}._compat"
  jaxs = set()
  for name, tree in trees.items():
    if name == compat or name.startswith(compat + "."):
      jaxs |= set(_private_reads(tree)) - own
  assert "_committed" in jaxs and "_jit_info" in jaxs, sorted(jaxs)
  wrong = [f"{name}:{line}: {attr}" for name, tree in trees.items()
           if not (name == compat or name.startswith(compat + "."))
           for attr, line in _private_reads(tree).items() if attr in jaxs]
  assert wrong == []


def _class_privates(tree) -> set:
  """The private names a module's classes define: class attributes,
  methods, ``__slots__`` entries and attributes their methods assign on
  ``self``."""
  names = set()
  for cls in ast.walk(tree):
    if not isinstance(cls, ast.ClassDef):
      continue
    for node in cls.body:
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        names.add(node.name)
      elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
          if isinstance(t, ast.Name):
            names.add(t.id)
            if t.id == "__slots__" and isinstance(node.value, (ast.Tuple, ast.List)):
              names |= {e.value for e in node.value.elts
                        if isinstance(e, ast.Constant)}
    for node in ast.walk(cls):
      if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
          and isinstance(node.value, ast.Name) and node.value.id == "self"):
        names.add(node.attr)
  return {n for n in names
          if isinstance(n, str) and n.startswith("_") and not n.startswith("__")}


def test_no_module_reads_another_modules_classes_private_attributes():
  """A private attribute of a class (a slot, a method, a class attribute)
  is read by that class's own module only, or through ``self``/``cls``:
  what a class's collaborators need is a method of theirs or an argument,
  so a class can change its private state without hunting for readers."""
  trees = {}
  for name, path in MODULES.items():
    with open(path) as f:
      trees[name] = ast.parse(f.read())
  defines = {name: _class_privates(tree) for name, tree in trees.items()}
  compat = f"{PACKAGE}._compat"
  wrong = []
  for name, tree in trees.items():
    if name == compat or name.startswith(compat + "."):
      continue   # reads JAX's objects, whose private names ours may mirror
    others = set().union(*(d for n, d in defines.items() if n != name))
    for attr, line in _private_reads(tree).items():
      if attr in others and attr not in defines[name]:
        owners = sorted(n for n, d in defines.items() if attr in d)
        wrong.append(f"{name}:{line}: {attr} (defined in {', '.join(owners)})")
  assert wrong == []


def test_contributing_names_every_module():
  """CONTRIBUTING.md's module table names each module of the package (by
  its path below the package, or its file name in a row of a folder)."""
  here = os.path.dirname(os.path.abspath(__file__))   # the checkout's tests/
  with open(os.path.join(os.path.dirname(here), "CONTRIBUTING.md")) as f:
    text = f.read()
  missing = []
  for name, path in MODULES.items():
    rel = os.path.relpath(path, ROOT)
    if os.path.basename(rel) == "__init__.py" and rel != "__init__.py":
      continue
    if f"`{rel}`" not in text and f"`{os.path.basename(rel)}`" not in text:
      missing.append(rel)
  assert missing == []


def _defined_names(tree) -> set:
  """Every name a module defines: functions, classes, their methods and
  attributes, assigned names and imports."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      names.add(node.attr)
    elif isinstance(node, ast.alias):
      names.add((node.asname or node.name).split(".")[0])
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      names.add(node.value)   # generated sources, __slots__ entries
  return names


#: JAX's own names a row of the module table mentions
_JAXS_NAMES_IN_CONTRIBUTING = frozenset({"odeint", "weakref_lru_cache"})
#: the command line's subcommands (``python -m jax_closure_cache patch``)
_COMMANDS = frozenset({"run", "bench", "doctor", "patch"})


def test_contributing_module_rows_name_what_their_module_defines():
  """Each backticked identifier in a row of CONTRIBUTING.md's module table
  (``| `path` | ... |``) is defined in that row's module, or at the top
  level of another (``enable``, ``Walk``): a renamed or removed function
  leaves no stale name behind."""
  here = os.path.dirname(os.path.abspath(__file__))
  with open(os.path.join(os.path.dirname(here), "CONTRIBUTING.md")) as f:
    rows = [line for line in f if line.startswith("| `")]
  by_rel = {os.path.relpath(path, ROOT): path for path in MODULES.values()}
  # what a row may name of another module: its top-level definitions
  top_level = set(_JAXS_NAMES_IN_CONTRIBUTING)
  top_level |= {name.rsplit(".", 1)[-1] for name in MODULES}   # `doctor`
  top_level |= set(_COMMANDS)
  for path in MODULES.values():
    with open(path) as f:
      for node in ast.parse(f.read()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
          top_level.add(node.name)
        elif isinstance(node, ast.Assign):
          top_level |= {t.id for t in node.targets if isinstance(t, ast.Name)}
  stale, checked = [], 0
  for row in rows:
    cells = row.split("|")
    rel = cells[1].strip().strip("`")
    if rel not in by_rel:
      continue
    with open(by_rel[rel]) as f:
      defined = _defined_names(ast.parse(f.read()))
    for token in re.findall(r"`([^`]+)`", "|".join(cells[2:])):
      token = token.lstrip(".").removesuffix("()")
      if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
        continue
      checked += 1
      if token not in defined and token not in top_level:
        stale.append(f"{rel}: {token}")
  assert checked > 100, checked
  assert stale == []


def test_the_miss_stages_declare_what_they_read_of_the_wrapper():
  """``front/miss.py``'s ``MissStages`` (the wrapper's slow paths, a base
  class of ``ClosureJitted`` in another module) reads through ``self`` only
  private names it declares itself, which the wrapper class defines."""
  from jax_closure_cache.front import miss, wrapper
  with open(MODULES[f"{PACKAGE}.front.miss"]) as f:
    tree = ast.parse(f.read())
  cls = next(n for n in tree.body
             if isinstance(n, ast.ClassDef) and n.name == "MissStages")
  declared = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
  assert not any(isinstance(n, ast.AnnAssign) for n in cls.body)
  declared |= {e.value for n in cls.body if isinstance(n, ast.Assign)
               and [t.id for t in n.targets] == ["_WRAPPER_SLOTS"]
               for e in n.value.elts}
  declared |= {t.id for n in cls.body if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name)}
  read = {n.attr for n in ast.walk(cls)
          if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
          and n.value.id == "self" and n.attr.startswith("_")
          and not n.attr.startswith("__")}
  assert read - declared == set()
  for name in ("_user", "_presented", "_own", "_pin", "_remember_matcher",
               "_constants_are_operands"):
    assert name in vars(wrapper.ClosureJitted), name   # defined, not inherited
  assert {"_fun", "_spec"} <= set(wrapper.ClosureJitted.__slots__)
  assert set(miss.MissStages._WRAPPER_SLOTS) <= set(
      wrapper.ClosureJitted.__slots__)


def test_no_module_imports_by_name_at_run_time():
  """Every import is an import statement this file reads: no
  ``importlib.import_module`` or ``__import__`` chooses a module at run
  time (the one use of ``importlib`` allowed is the activation hook's
  finder, which waits for jax's own import)."""
  wrong = []
  for name, path in MODULES.items():
    if _layer(name) == "tools":
      continue   # the CLI's subcommands, never on a call path
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and node.attr == "import_module":
        wrong.append(f"{name}: import_module")
      elif isinstance(node, ast.Name) and node.id in ("__import__",
                                                      "import_module"):
        wrong.append(f"{name}: {node.id}")
      elif isinstance(node, ast.alias) and node.name == "import_module":
        wrong.append(f"{name}: from importlib import import_module")
  assert wrong == []


# What a table is: a container, a bounded store, or an object of the
# package's own that can be emptied.
_CONTAINERS = (dict, list, set, bytearray, collections.deque,
               weakref.WeakKeyDictionary, weakref.WeakValueDictionary,
               weakref.WeakSet)


#: JAX's own caches a module keeps a reference to (the original it patches)
_JAXS_OWN = frozenset({f"{PACKAGE}.lowering.shared.STOCK"})


def _is_table(value) -> bool:
  if isinstance(value, (type, types.FunctionType)) or callable(value) and (
      not hasattr(value, "cache_clear")):
    # (a function of the package's with a ``cache_clear`` of its own
    # empties tables this test sees on their own)
    return isinstance(value, _CONTAINERS)
  if isinstance(value, _CONTAINERS) or hasattr(value, "cache_clear"):
    return True   # a memoizing cache too (JAX's ``weakref_lru_cache``)
  return type(value).__module__.startswith(PACKAGE) and hasattr(
      value, "clear")


def _defaults(where: str, f):
  for i, d in enumerate(f.__defaults__ or ()):
    yield f"{where} default {i}", d
  for k, d in (f.__kwdefaults__ or {}).items():
    yield f"{where} default {k}", d


def _held_by_module(name: str, module, owned):
  """``(where, value)`` for each value a module holds where a table could
  hide: its globals, a module-level tuple's items, its own classes'
  attributes, its own functions' and methods' defaults and closure cells,
  and the state of a module-level object of the package's that the store
  does not own (``owned(value)``)."""
  for attr, value in vars(module).items():
    if attr.startswith("__"):
      continue
    where = f"{name}.{attr}"
    yield where, value
    if type(value) is tuple:
      for i, x in enumerate(value):
        yield f"{where}[{i}]", x
    elif isinstance(value, type) and value.__module__ == name:
      for k, v in vars(value).items():
        if k.startswith("__") or k == "_field_defaults":   # (a NamedTuple's)
          continue
        yield f"{where}.{k}", v
        f = getattr(v, "__func__", v)
        if type(f) is types.FunctionType:
          yield from _defaults(f"{where}.{k}", f)
    elif type(value) is types.FunctionType and value.__module__ == name:
      yield from _defaults(where, value)
      for cell, var in zip(value.__closure__ or (), value.__code__.co_freevars):
        try:
          yield f"{where} cell {var}", cell.cell_contents
        except ValueError:   # empty
          pass
    elif (not isinstance(value, (type, types.ModuleType, types.FunctionType))
          and type(value).__module__.startswith(PACKAGE) and not owned(value)):
      state = dict(getattr(value, "__dict__", {}))
      for cls in type(value).__mro__:
        for slot in getattr(cls, "__slots__", ()):
          if hasattr(value, slot):
            state[slot] = getattr(value, slot)
      for k, v in state.items():
        if not k.startswith("__"):
          yield f"{where}.{k}", v


def test_every_module_level_table_is_the_stores():
  """No module keeps a table of its own: every module-level container (and
  every object of the package's that can be emptied) outside ``_compat`` is
  one ``cache.STORE`` owns, so that one ``clear()`` and one ``stats()`` see
  it (CONTRIBUTING, "The store"); so is one inside a module-level tuple, a
  class's attributes, a function's defaults or cells, or a module-level
  object's state. Constant tables are read-only (``MappingProxyType``,
  ``frozenset``, tuples)."""
  from jax_closure_cache import cache

  def owned(value) -> bool:
    return cache.STORE.owns(value) or any(value is x for x in (
        cache.STORE, cache.STORE.counters, cache.jax_handle))
  jax_closure_cache.enable()   # the patched modules are all imported
  try:
    loose = []
    for name in sorted(MODULES):
      if (name.startswith((f"{PACKAGE}._compat", f"{PACKAGE}.tools"))
          or name.endswith("__main__")):
        continue
      module = importlib.import_module(name)
      for where, value in _held_by_module(name, module, owned):
        if _is_table(value) and where not in _JAXS_OWN and not owned(value):
          loose.append(f"{where}: {type(value).__name__}")
    assert loose == []
  finally:
    jax_closure_cache.disable()


def test_the_table_check_sees_tables_hidden_in_tuples_classes_and_defaults():
  """The check above would find a table kept where a module-level scan of
  globals alone would not see it."""
  module = types.ModuleType(f"{PACKAGE}.planted")

  class Holder:
    memo: dict = {}
  Holder.__module__ = module.__name__

  def memoized(x, _seen=set()):
    return x
  memoized.__module__ = module.__name__
  module.PAIR = ("name", [])
  module.Holder = Holder
  module.memoized = memoized
  found = {where for where, value in
           _held_by_module(module.__name__, module, lambda v: False)
           if _is_table(value)}
  assert found == {f"{PACKAGE}.planted.PAIR[1]",
                   f"{PACKAGE}.planted.Holder.memo",
                   f"{PACKAGE}.planted.memoized default 0"}


def test_the_store_clears_what_its_kinds_say():
  """``clear()`` empties every ``TRACES`` and ``CALLS`` table and keeps
  ``FACTS`` and ``REGISTRY``; ``release_traces()`` empties ``TRACES`` only."""
  from jax_closure_cache import cache
  store = cache.Store()
  tables = {kind: store.table(f"t.{kind}", kind)
            for kind in (cache.Store.TRACES, cache.Store.CALLS,
                         cache.Store.FACTS, cache.Store.REGISTRY)}

  def fill():
    for t in tables.values():
      t["k"] = 1

  fill()
  store.release_traces()
  assert {k: len(t) for k, t in tables.items()} == {
      "traces": 0, "calls": 1, "facts": 1, "registry": 1}
  fill()
  store.clear()
  assert {k: len(t) for k, t in tables.items()} == {
      "traces": 0, "calls": 0, "facts": 1, "registry": 1}
  with pytest.raises(ValueError, match="already holds"):
    store.table("t.traces", cache.Store.TRACES)
  with pytest.raises(ValueError, match="unknown kind"):
    store.table("t.other", "other")
