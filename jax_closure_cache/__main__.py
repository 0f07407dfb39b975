"""``python -m jax_closure_cache``: the command line (``tools/cli.py``)."""

import sys

from jax_closure_cache.tools.cli import main

if __name__ == "__main__":
  sys.exit(main())
