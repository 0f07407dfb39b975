"""Module-level helpers that read their own module's globals."""
import jax.numpy as jnp

W = jnp.full(2, 3.0, jnp.float32)   # (not ones: stock folds x * 1)
SCALE = 2.0


def scaled_by_w(x):
  return x * W


def scaled(x):
  return x * SCALE


def twice_scaled(x):   # reaches SCALE through another helper
  return scaled(x) + scaled(x)
