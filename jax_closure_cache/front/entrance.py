"""``jit``: the entrance to the front.

``jit(fun, **options)`` decides what a function gets, in this order: the
hot case (a re-created closure without options: its code's front class, or
the generic wrapper, made without ``__init__``'s frame; a
``functools.partial`` of a plain function whose code has a front class:
that class's wrapper); the options
(stock's ``TypeError`` for a wrong keyword); functions passed as static
arguments (``static_args``); closure-free functions (one canonical stock
object, ``canonical``); opaque callables (stock); everything else a
``ClosureJitted``. Where the optional C extension is built, ``jit`` is
``generated.entrance``'s object, which makes a front's wrapper in C and
passes every other call here.

Invariants: ``jit`` raises what stock's ``jax.jit`` raises for the same
arguments; it never traces or compiles (the first call does).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable

from jax_closure_cache import _compat
from jax_closure_cache import events
from jax_closure_cache.front import canonical
from jax_closure_cache.front import generated
from jax_closure_cache.front import inline
from jax_closure_cache.front import options as jit_options
from jax_closure_cache.front import static_args
from jax_closure_cache.front import wrapper
from jax_closure_cache.key import closure

_new_wrapper = object.__new__
_FunctionType = types.FunctionType
_partial = functools.partial
_CO_GENERATOR = inspect.CO_GENERATOR
_ClosureJitted = wrapper.ClosureJitted
_fill = wrapper.fill
_fronts = inline.fronts
_hot_spec = jit_options.hot_spec_cell()
_lifting = canonical.lifting_codes


class _NotSpecified:
  """``jit()`` without a function: a decorator (``jit(None)`` is stock's
  error, as ``jax.jit(None)`` is)."""
  __slots__ = ()

  def __repr__(self):
    return "NotSpecified()"


_NOT_SPECIFIED = _NotSpecified()


def jit(fun: Callable | _NotSpecified = _NOT_SPECIFIED, /, **options) -> Any:
  """Closure-aware drop-in for ``jax.jit``.

  Takes every keyword of ``jax.jit`` plus ``lift_numpy`` (default: the value
  given to ``enable(lift_numpy=...)`` or ``JAX_CLOSURE_CACHE_LIFT_NUMPY``,
  else False), which passes closed-over numpy arrays as arguments instead of
  baking them. Without ``fun`` it returns a decorator.

  Example::

      >>> import jax.numpy as jnp
      >>> from jax_closure_cache import jit
      >>> def outer(a):
      ...   def inner(x):
      ...     return x * a
      ...   return jit(inner)(2.0)   # one compile for every a of this shape
      >>> float(outer(jnp.float32(3.0))), float(outer(jnp.float32(4.0)))
      (6.0, 8.0)
  """
  if not options and type(fun) is _FunctionType and fun.__closure__:
    # The hot case (a re-created closure, every call): __init__'s slots
    # without its spec lookup (wrapper.fill).
    cls = _fronts.get(fun.__code__)
    if cls is not None:
      # A front carries its code and the hot spec as class attributes.
      return _fill(_new_wrapper(cls), fun)
    if fun.__code__.co_flags & _CO_GENERATOR:
      return _compat.STOCK_JIT(fun)   # stock's TypeError, at jit() time
    return _fill(_new_wrapper(_ClosureJitted), fun,
                 (fun.__code__, _hot_spec[0]))
  if (not options and type(fun) is _FunctionType
      and fun.__code__ in _lifting):
    return _closure_free_wrapper(fun)   # (no closure: the C entrance's
                                        # hot case passed it on)
  if not options and type(fun) is _partial:
    # ``jax.jit(functools.partial(f, w))``, every call: a front's wrapper
    # where ``f``'s code has one (its matchers tell partials apart)
    func = fun.func
    if type(func) is _FunctionType:
      cls = _fronts.get(func.__code__)
      if cls is not None:
        return _fill(_new_wrapper(cls), fun)
  return _jit_with_options(fun, options)


def _closure_free_wrapper(fun):
  """The hot spec's wrapper of a closure-free ``fun`` whose code's key
  needed lifting (``canonical.lifting_codes``), as the hot case makes a
  closure's: of its code's front class where it has one. (The front's
  check of the object's weak references sends one with an identity row, a
  canonical object among them, to that row.)"""
  cls = _fronts.get(fun.__code__)
  if cls is not None:
    return _fill(_new_wrapper(cls), fun)
  return _fill(_new_wrapper(_ClosureJitted), fun,
               (fun.__code__, _hot_spec[0]))


def _jit_with_options(fun, options: dict):
  """``jit`` past the hot case: options, static arguments, closure-free
  functions, opaque callables, then a ``ClosureJitted``."""
  lift_numpy = options.pop("lift_numpy", None)
  if fun is _NOT_SPECIFIED:
    # stock's keyword-only signature rejects a wrong name at once
    jit_options.check_option_names(options)

    def decorator(fun):
      return jit(fun, lift_numpy=lift_numpy, **options)
    return decorator
  if lift_numpy is None:
    lift_numpy = jit_options.lift_numpy_default()
  try:
    options_key = jit_options.options_key(options) if options else ()
  except TypeError as e:
    if "unexpected keyword" in str(e):
      raise
    events.fallback(fun, wrapper.code_of(fun), "unhashable_jit_options",
                    f"the jit options cannot key a cache: {e}")
    return _compat.STOCK_JIT(fun, **options)
  if not callable(fun) or inspect.isgeneratorfunction(fun):
    return _compat.STOCK_JIT(fun, **options)   # stock's error
  if options.get("device") is not None or options.get("backend") is not None:
    # deprecated: stock's jit() warns of them once per object, as made here
    return _compat.STOCK_JIT(fun, **options)
  if jit_options.gives_static_arguments(options):
    if (isinstance(fun, (types.FunctionType, functools.partial,
                         types.MethodType, _ClosureJitted))
        or closure.as_method(fun) is not None):
      # Functions among the static arguments are keyed by closure key, and
      # plain static values exactly (a callable object's too).
      return static_args.StaticArgsJitted(fun, options, options_key,
                                          lift_numpy)
  if type(fun) is types.FunctionType and fun.__closure__ is None:
    if fun.__code__ in _lifting:   # the wrapper's
      if not options and lift_numpy == _hot_spec[0].lift_numpy:
        return _closure_free_wrapper(fun)
    else:
      jitted = canonical.canonical_jitted(fun, options, options_key,
                                          lift_numpy)
      if jitted is not None:
        return jitted
  elif not (isinstance(fun, (types.FunctionType, functools.partial,
                             types.MethodType, _ClosureJitted))
            or closure.as_method(fun) is not None):
    return _compat.STOCK_JIT(fun, **options)   # opaque callables: stock
  w = _ClosureJitted(fun, options, options_key, lift_numpy)
  if jit_options.donates(options):
    # Stock's own jitted object, made now: its validation of the donated
    # arguments raises here, at jit() time, as stock's does.
    w.stock()
  return w


# The fast front's entrance: ``jit`` itself, or the same in C where the
# extension is built (it makes a front's wrapper without jit's Python frame).
_python_jit = jit
jit = generated.entrance(_python_jit, _fronts, _ClosureJitted,
                         wrapper.FILLED_SLOTS, partials=True)


def entrance_built() -> bool:
  """Whether ``jit`` is the C entrance (the extension is optional)."""
  return jit is not _python_jit



@functools.wraps(_compat.STOCK_EVAL_SHAPE)
def eval_shape(fun, *args, **kwargs):
  """``jax.eval_shape``, answering the package's jitted objects as stock
  answers its own, by their ``trace`` (stock recognises its own by their C
  type; a wrapper with static arguments traced as a plain callable would
  get them as tracers)."""
  if isinstance(fun, _ClosureJitted):
    return fun.trace(*args, **kwargs).out_info
  return _compat.STOCK_EVAL_SHAPE(fun, *args, **kwargs)
