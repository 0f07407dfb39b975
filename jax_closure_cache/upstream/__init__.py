"""Modules written to become JAX's own: each file here is added to JAX
unchanged by the upstream patch series (``patches/``), and the package runs
the very same file in monkey-patch mode (``trace_cache`` glues it in)."""
