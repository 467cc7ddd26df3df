"""PyMC's routes: pm.sample, the post-hoc functions, posterior predictive and loo, with the
pymc graph as a per-draw JAX function."""
