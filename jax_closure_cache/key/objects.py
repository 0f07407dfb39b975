"""Plain Python objects and callable objects as the walk sees them.

Which classes are plain (their whole state is their ``__dict__`` or slots,
plus the items of a ``list``/``tuple``/``dict`` base) and copyable (a
shallow copy holds tracers without running user code), a callable object
as its bound ``__call__``, and what a class attribute contributes to its
class's key.

Invariants: nothing here calls user code but attribute reads the walk
would make anyway; a class with a ``__new__``, ``__setattr__`` or
``__getattribute__`` of its own is never copied.
"""

from __future__ import annotations

import functools
import types
import typing
import weakref

from jax_closure_cache import cache
from jax_closure_cache._compat.lowering import HEAPTYPE as _HEAPTYPE
from jax_closure_cache.key.parts import Tag

_FunctionType = types.FunctionType


_PACKAGE = __name__.partition(".")[0] + "."
_plain_types: "weakref.WeakKeyDictionary[type, bool]" = cache.STORE.table(
    "objects.plain_types", cache.Store.FACTS, weakref.WeakKeyDictionary)


# C bases whose whole state the walk can read: their items (see contents).
_CONTAINER_BASES = (list, tuple, dict)
# C bases that keep no state of an instance's: ``typing.Generic`` (written
# in C from Python 3.12: only class-level hooks, ``__class_getitem__`` and
# ``__init_subclass__``; its instances are object's size), the base of
# generic user classes (and of jax's ``custom_jvp`` and ``custom_vjp``).
_STATELESS_BASES = (typing.Generic,)
# C types whose state the walk reads through their ``__dict__`` as a Python
# class's: an ``lru_cache`` wrapper (``__wrapped__``, keyed by its code and
# what it reads; its cache only memoizes that function).
_DICT_STATE_TYPES = frozenset({type(functools.lru_cache(None)(len))})
# What a class implemented in C has of its own (a Python class gets getset
# descriptors for __dict__ and __weakref__ alone).
_C_MEMBERS = (types.MethodDescriptorType, types.WrapperDescriptorType,
              types.ClassMethodDescriptorType, types.BuiltinFunctionType,
              types.GetSetDescriptorType)


def _python_class(c: type) -> bool:
  """Whether ``c`` was made by a ``class`` statement, not in C: a heap type
  (many C extension types are heap types too, such as ``_random.Random``)
  with no member implemented in C for it (``__hash__ = object.__hash__``
  is object's, not its own). This package's own C type (the entrance
  ``jit``) keeps its state in its ``__dict__`` as a Python class does."""
  if c in _DICT_STATE_TYPES or c.__module__.startswith(_PACKAGE):
    return True
  if not c.__flags__ & _HEAPTYPE:
    return False
  return not any(
      isinstance(v, _C_MEMBERS) and k not in ("__dict__", "__weakref__")
      and (getattr(v, "__objclass__", None) is c
           or getattr(v, "__self__", None) is c)
      for k, v in vars(c).items())


def is_plain_type(cls: type) -> bool:
  """Instances keep all their state in ``__dict__`` (plus their items, for a
  subclass of list, tuple or dict): Python classes only, no ``__slots__``
  anywhere in the MRO and no other C base than object and those three."""
  try:
    return _plain_types[cls]
  except KeyError:
    pass
  plain = True
  for c in cls.__mro__[:-1]:
    if c in _CONTAINER_BASES or c in _STATELESS_BASES:
      continue
    slots = c.__dict__.get("__slots__", ())
    if isinstance(slots, str):
      slots = (slots,)
    if (not _python_class(c)
        or set(slots) - {"__dict__", "__weakref__"}):
      plain = False
      break
  plain = plain and "__dict__" in dir(cls)
  _plain_types[cls] = plain
  return plain


_slotted: "weakref.WeakKeyDictionary[type, tuple | None]" = cache.STORE.table(
    "objects.slotted", cache.Store.FACTS, weakref.WeakKeyDictionary)


def slot_members(cls: type):
  """``((owner, name), ...)`` of the slots of a pure-Python class whose
  state is its ``__slots__`` (and its ``__dict__``, if it has one) through
  its MRO, or None for a class with any other C base (state the walk
  cannot read). Read through each slot's own descriptor
  (:func:`slot_values`), never through the class's attribute hooks."""
  try:
    return _slotted[cls]
  except KeyError:
    pass
  members = []
  for c in cls.__mro__[:-1]:
    if c in _STATELESS_BASES:
      continue
    if not _python_class(c):
      members = None
      break
    slots = c.__dict__.get("__slots__", ())
    for name in ((slots,) if isinstance(slots, str) else slots):
      if name not in ("__dict__", "__weakref__"):
        mangled = (f"_{c.__name__.lstrip('_')}{name}"
                   if name.startswith("__") and not name.endswith("__")
                   else name)
        members.append((c, mangled))
  _slotted[cls] = members = None if members is None else tuple(members)
  return members


def slot_values(v, members) -> dict:
  """``{name: value}`` of ``v``'s filled slots (``members`` from
  :func:`slot_members`)."""
  out = {}
  for owner, name in members:
    try:
      out[name] = owner.__dict__[name].__get__(v, owner)
    except AttributeError:   # an unfilled slot: keyed by its absence
      pass
  return out


_copyable_types: "weakref.WeakKeyDictionary[type, bool]" = cache.STORE.table(
    "objects.copyable_types", cache.Store.FACTS, weakref.WeakKeyDictionary)
# Class attributes that make a shallow copy by __dict__ unsafe: creation or
# attribute hooks, and a class's own idea of how to copy itself.
_COPY_HOOKS = ("__new__", "__setattr__", "__delattr__", "__getattribute__",
               "__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__",
               "__getstate__", "__setstate__")


def is_copyable_type(cls: type) -> bool:
  """Instances of ``cls`` (a plain type) can be rebuilt as
  ``object.__new__(cls)`` plus a copy of their ``__dict__``: no class in the
  MRO defines a creation, attribute or copy hook, or a data descriptor
  (a property, whose value the copy could not set), and none is a list,
  tuple or dict."""
  try:
    return _copyable_types[cls]
  except KeyError:
    pass
  ok = True
  for c in cls.__mro__[:-1]:
    d = c.__dict__
    if c in _CONTAINER_BASES or any(h in d for h in _COPY_HOOKS):
      ok = False
      break
    for name, attr in d.items():
      if name in ("__dict__", "__weakref__"):
        continue
      if hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"):
        ok = False
        break
    if not ok:
      break
  _copyable_types[cls] = ok
  return ok


def contents(v) -> list:
  """The items of a plain object that subclasses list, tuple or dict (by
  its type: a proxy's ``__class__`` may claim one it is not)."""
  t = type(v)
  if issubclass(t, dict):
    return [x for kv in v.items() for x in kv]
  if issubclass(t, (list, tuple)):
    return list(v)
  return []


def as_method(fun):
  """A callable object's bound ``__call__``, or None for anything else.

  An instance of a plain, copyable Python class (see ``is_copyable_type``)
  whose class defines ``__call__`` as a Python function is keyed as that
  method bound to it: its ``__call__`` by closure key, itself by its
  attributes. A class stock cannot hash (a dataclass with ``eq=True``) is
  left to stock, whose ``TypeError`` the user gets as without the cache.
  """
  t = type(fun)
  if t is _FunctionType or t.__hash__ is None:
    return None
  call = getattr(t, "__call__", None)
  if (type(call) is not _FunctionType or not is_plain_type(t)
      or not is_copyable_type(t)):
    return None
  return types.MethodType(call, fun)


SKIP = Tag("SKIP")
# Class-level names that hold no state a trace reads through an instance.
_CLASS_BOOKKEEPING = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
    "__annotations__", "__slots__", "__firstlineno__", "__static_attributes__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__",
    "__orig_bases__", "__parameters__", "__abstractmethods__", "_abc_impl"})


def class_member(name: str, x):
  """What a class attribute contributes to its class's key: a method's
  function (of a staticmethod or classmethod too), a property's accessors,
  a data attribute itself; ``SKIP`` for bookkeeping, slots' descriptors
  and dunder names that are not functions."""
  t = type(x)
  if name in _CLASS_BOOKKEEPING or t is types.MemberDescriptorType:
    return SKIP   # a slot's descriptor: the slot's value is the instance's
  if t is staticmethod or t is classmethod:
    x = x.__func__
  elif t is property:
    return (x.fget, x.fset, x.fdel)
  if name[:2] == "__" == name[-2:] and type(x) is not _FunctionType:
    return SKIP
  return x
