"""Layer three: the fast front, what a call goes through.

* ``wrapper``: ``jit`` and ``ClosureJitted`` (identity rows, the miss and
  the store, the canonical stock objects for closure-free functions).
* ``generated``: the per-code front classes whose ``__call__`` inlines the
  stored keys' matchers, and ``entrance``, which puts the C entrance
  (``_entrance.c``, optional) in front of ``jit``.
* ``static_args``: functions passed as static arguments.
* ``convert``: eager ``jax.closure_convert`` keyed by closure.

Invariants: a function object stock has traced behaves as stock (identity
first); a hit is one Python frame over stock's C++ fast path; a miss that
cannot prove its key falls back to stock and says why.
"""
