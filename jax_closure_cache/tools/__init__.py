"""What runs beside the cache, never on its path: the command line
(``cli``: bench, run, doctor, patch), the benchmarks, the two-process
driver and the upstream patch tool. Nothing in layers one to three imports
this package.
"""
