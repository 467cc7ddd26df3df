"""What the predictive route's numbers do not depend on, and what they do, exactly.

The draws themselves are a function of the seed and the draw's index alone: equal bit for
bit whatever the strategy and chunk size. A function of several drawn values (a
`Deterministic` that sums or averages them) is computed by XLA in a program whose shape
depends on the plan, and its sum may be taken in another order: equal to the last few bits,
not bit for bit (README, docs/predictive.md). Both halves are asserted, against a float64
reference computed from the draws themselves.
"""

from __future__ import annotations

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import predictive_models as models  # noqa: E402

import pymc_chunkpost  # noqa: E402

ROWS = 200
PLANS = [
    {"postprocessing_vectorize": "vmap"},
    {"postprocessing_vectorize": "scan"},
    {"postprocessing_vectorize": "chunked", "chunk_size": 1},
    {"postprocessing_vectorize": "chunked", "chunk_size": 7},
    {"postprocessing_vectorize": "chunked", "n_chunks": 3, "output_memory": "host"},
]


@pytest.fixture(scope="module")
def mean_of_draws():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        y = pm.Normal("y", mu, 1.0, shape=ROWS)
        pm.Deterministic("m", y.mean())
    del y
    return model, models.posterior(model, chains=4, draws=50)


def _predict(model, idata, **options):
    out = pymc_chunkpost.sample_posterior_predictive(
        idata,
        model=model,
        var_names=["y", "m"],
        random_seed=3,
        progressbar=False,
        return_inferencedata=False,
        **options,
    )
    return np.asarray(out["y"]), np.asarray(out["m"])


def test_draws_are_exact_and_their_functions_equal_up_to_the_order_of_sums(mean_of_draws):
    model, idata = mean_of_draws
    y, m = _predict(model, idata)
    assert y.dtype == m.dtype == np.float64
    # Each draw's mean is the mean of its own draws, to the rounding of a sum of ROWS terms.
    eps = np.finfo(np.float64).eps
    bound = ROWS * eps * np.abs(y).max()
    np.testing.assert_allclose(m, y.mean(-1), rtol=0, atol=bound)
    for options in PLANS:
        y_plan, m_plan = _predict(model, idata, **options)
        np.testing.assert_array_equal(y_plan, y, err_msg=str(options))
        np.testing.assert_allclose(m_plan, m, rtol=0, atol=bound, err_msg=str(options))
