"""Layer three: the fast front, what a call goes through.

* ``entrance``: ``jit``, which puts the C entrance (``_entrance.c``,
  optional) before the Python one; ``options``: the jit options' specs.
* ``wrapper``: ``ClosureJitted``, with its identity rows (``identity``),
  its miss stages (``miss``) and its stored entries (``entries``).
* ``generated`` and ``inline``: the per-code front classes whose
  ``__call__`` inlines the stored keys' matchers, for ``jit`` and for the
  clients' own wrapper classes (launchers, static arguments' binders).
* ``canonical``: one stock object per closure-free function.
* ``static_args``: functions passed as static arguments.
* ``convert``: eager ``jax.closure_convert`` keyed by closure.
* ``verify``: verify mode's check of a hit against stock's trace.

Invariants: a function object stock has traced behaves as stock (identity
first); a hit is one Python frame over stock's C++ fast path; a miss that
cannot prove its key falls back to stock and says why.
"""
