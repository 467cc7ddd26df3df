"""NumPyro's routes: Predictive, log_likelihood and loo, and the patch of numpyro's names."""
