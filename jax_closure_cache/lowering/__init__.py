"""Tier A: the lowering and executable shared by structurally equal jaxprs,
after stock's own trace (``shared.py``), keyed by ``structure.py``."""
