"""Site values that are pytrees, on the numpyro routes, against numpyro's own functions.

A numpyro site's value may be a pytree: a `param` holding a dict, list or tuple, or a flow
guide's `$params` from `numpyro.module`. Every place such a value can occur is tested: the
guide's draws, `params`, `return_sites`, `posterior_samples` and `log_likelihood`. The
structures are drawn at random (seeded), with leaves of distinct values and shapes, so that
a route that pairs leaves with the wrong names or the wrong order cannot pass. References:
numpyro's `Predictive(parallel=False)`; for pytree-valued `posterior_samples`, which
numpyro's `Predictive` constructor and `log_likelihood` refuse (they read each site's
shape), numpyro's own `_predictive`, which its `Predictive` calls, and `log_likelihood`'s
per-draw function mapped by numpyro's `soft_vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")

import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer import Predictive as NumpyroPredictive  # noqa: E402
from numpyro.infer.autoguide import (  # noqa: E402
    AutoBNAFNormal,
    AutoDelta,
    AutoGuideList,
    AutoIAFNormal,
    AutoNormal,
)
from numpyro.infer.util import _predictive as numpyro_predictive  # noqa: E402
from numpyro.util import soft_vmap  # noqa: E402

from pymc_chunkpost.numpyro import Predictive, log_likelihood  # noqa: E402

KEY = jax.random.PRNGKey(11)
N = 24


def assert_identical_trees(ours, theirs):
    """The same tree structure, each leaf of the same shape, dtype and bits."""
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    got = jax.tree_util.tree_flatten_with_path(ours)[0]
    want = jax.tree_util.tree_leaves(theirs)
    for (path, a), b in zip(got, want):
        where = jax.tree_util.keystr(path)
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, where
        assert a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)


# --- the reproduction ---------------------------------------------------------------


def _model():
    x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    numpyro.sample("y", dist.Normal(x, 1.0).to_event(1))


def _dict_guide():
    p = numpyro.param("p", {"loc": jnp.zeros(3), "scale": jnp.ones(3)})
    numpyro.sample("x", dist.Normal(p["loc"], p["scale"]).to_event(1))


def test_a_guide_whose_param_is_a_dict_gets_numpyros_values():
    params = {"p": {"loc": jnp.arange(3.0) * 10, "scale": jnp.full(3, 0.01)}}
    ours = Predictive(_model, guide=_dict_guide, params=params, num_samples=4)(KEY)
    theirs = NumpyroPredictive(_model, guide=_dict_guide, params=params, num_samples=4)(KEY)
    assert_identical_trees(ours, theirs)
    # The scale is 0.01: each draw of y sits near loc = (0, 10, 20), not near (0, 1, 1).
    np.testing.assert_allclose(np.mean(np.asarray(ours["y"]), 0), [0, 10, 20], atol=3)


# --- random pytrees, everywhere a site value can occur --------------------------------------


def _random_tree(rng, depth=0):
    """A pytree of float32 leaves of random shapes: dicts, lists and tuples nested up to
    two levels. Leaf values are distinct, so a leaf paired with the wrong place differs."""
    kind = rng.choice(["leaf", "dict", "list", "tuple"] if depth < 2 else ["leaf"])
    if kind == "leaf":
        shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(0, 3)))
        return jnp.asarray(rng.normal(size=shape) + rng.uniform(-5, 5), jnp.float32)
    children = [_random_tree(rng, depth + 1) for _ in range(int(rng.integers(1, 4)))]
    if kind == "dict":  # keys out of sorted order: jax flattens dicts sorted
        return {f"k{9 - i}": c for i, c in enumerate(children)}
    return children if kind == "list" else tuple(children)


def _tree_model(tree):
    """A model with a param `p` of structure `tree`, whose every leaf reaches `obs`."""

    def model(obs=None):
        p = numpyro.param("p", tree)
        total = sum(jnp.sum(leaf * (i + 1)) for i, leaf in enumerate(jax.tree_util.tree_leaves(p)))
        z = numpyro.sample("z", dist.Normal(total, 1.0))
        numpyro.deterministic("d", jax.tree_util.tree_map(lambda leaf: leaf * z, p))
        numpyro.sample("obs", dist.Normal(z, 1.0).expand([2]).to_event(1), obs=obs)

    return model


def _tree_guide(tree):
    def guide(obs=None):
        p = numpyro.param("p", tree)
        leaves = jax.tree_util.tree_leaves(p)
        loc = sum(jnp.mean(leaf) * (i + 2) for i, leaf in enumerate(leaves))
        numpyro.sample("z", dist.Normal(loc, 0.1))

    return guide


def _batched(tree, rng, lead):
    """Draws of `tree`: each leaf with leading axes `lead`, of distinct values."""
    return jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(rng.normal(size=lead + leaf.shape), leaf.dtype), tree
    )


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_pytree_params_guides_and_return_sites_equal_numpyro(seed):
    rng = np.random.default_rng(seed)
    tree = _random_tree(rng)
    params = {"p": _batched(tree, rng, ())}
    model, guide = _tree_model(tree), _tree_guide(tree)
    for return_sites in (None, ["p", "d", "obs", "z"]):
        kwargs = {"guide": guide, "params": params, "num_samples": N}
        ours = Predictive(model, return_sites=return_sites, chunk_size=5, **kwargs)(KEY)
        theirs = NumpyroPredictive(model, return_sites=return_sites, **kwargs)(KEY)
        assert_identical_trees(ours, theirs)
    # Prior predictive with the param substituted, its pytree returned.
    ours = Predictive(model, params=params, num_samples=N, return_sites=["p", "d"])(KEY)
    theirs = NumpyroPredictive(model, params=params, num_samples=N, return_sites=["p", "d"])(KEY)
    assert_identical_trees(ours, theirs)


@pytest.mark.parametrize("batch_ndims", [1, 2])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_pytree_posterior_samples_equal_numpyro(seed, batch_ndims):
    rng = np.random.default_rng(100 + seed)
    tree = _random_tree(rng)
    model = _tree_model(tree)
    lead = (N,) if batch_ndims == 1 else (2, N // 2)
    posterior = {"p": _batched(tree, rng, lead), "z": jnp.asarray(rng.normal(size=lead))}
    ours = Predictive(model, posterior, batch_ndims=batch_ndims, chunk_size=7)(KEY)
    theirs = numpyro_predictive(
        KEY, model, posterior, lead, parallel=False, exclude_deterministic=True
    )
    assert_identical_trees(ours, theirs)
    obs = jnp.asarray(rng.normal(size=2), jnp.float32)
    ours = log_likelihood(model, posterior, obs=obs, batch_ndims=batch_ndims, chunk_size=7)
    assert_identical_trees(ours, _numpyro_log_likelihood_of_pytrees(model, posterior, lead, obs))


def _numpyro_log_likelihood_of_pytrees(model, posterior, lead, obs):
    """numpyro's `log_likelihood`, whose batch-shape check reads `jnp.shape` of each site
    value and so refuses a pytree-valued site (a list or tuple raises; a dict reads as shape
    `()`, unlike the other sites'): its per-draw function (`single_loglik`, as
    written there) mapped by its own `soft_vmap`, one draw at a time (`parallel=False`)."""

    def single_loglik(samples):
        substituted = numpyro.handlers.substitute(model, samples)
        model_trace = numpyro.handlers.trace(substituted).get_trace(obs=obs)
        return {
            name: site["fn"].log_prob(site["value"])
            for name, site in model_trace.items()
            if site["type"] == "sample" and site["is_observed"]
        }

    return soft_vmap(single_loglik, posterior, len(lead), 1)


def test_a_pytree_draw_with_a_bad_batch_shape_names_its_leaf():
    tree = {"a": jnp.zeros(2), "b": [jnp.zeros(3)]}
    posterior = {"p": {"a": jnp.zeros((N, 2)), "b": [jnp.zeros((N - 1, 3))]}}
    with pytest.raises(ValueError, match=r"posterior_samples\['p'\]\['b'\]\[0\]"):
        Predictive(_tree_model(tree), posterior)


# --- flow guides from SVI: `$params` from numpyro.module ------------------------------------


def _beta_bernoulli(data):
    p = numpyro.sample("p", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event(1))
    q = numpyro.sample("q", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("n", data.shape[0], dim=-2):
        numpyro.sample("obs", dist.Bernoulli(p * jax.nn.sigmoid(q)), obs=data)


def _list_guide(model, flow):
    """`flow` for `p`, `AutoDelta` for `q`."""
    guide = AutoGuideList(model)
    guide.append(flow(numpyro.handlers.block(model, hide=["q"])))
    guide.append(AutoDelta(numpyro.handlers.block(model, expose=["q"])))
    return guide


FLOWS = {
    "AutoIAFNormal": lambda m: AutoIAFNormal(m, num_flows=2),
    "AutoBNAFNormal": lambda m: AutoBNAFNormal(m, num_flows=1, hidden_factors=[4]),
    "AutoGuideList[AutoIAFNormal]": lambda m: _list_guide(m, AutoIAFNormal),
    "AutoGuideList[AutoNormal]": lambda m: _list_guide(m, AutoNormal),
}


@pytest.mark.parametrize("flow", FLOWS)
def test_flow_guides_from_svi_equal_numpyro(flow):
    data = jnp.asarray(np.random.default_rng(0).uniform(size=(30, 2)) < 0.7, jnp.float32)
    model = _beta_bernoulli
    guide = FLOWS[flow](model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    params = svi.run(jax.random.PRNGKey(0), 30, data, progress_bar=False).params
    if "AutoNormal" not in flow:  # a flow's `$params` are pytrees
        assert any(not isinstance(v, jax.Array) for v in params.values())
    kwargs = {"guide": guide, "params": params, "num_samples": N}
    ours = Predictive(model, **kwargs)(KEY, data)
    theirs = NumpyroPredictive(model, **kwargs)(KEY, data)
    assert_identical_trees(ours, theirs)
    # The guide's draws of `p` lie in a Beta's support, (0, 1).
    drawn = np.asarray(Predictive(model, return_sites=["p"], **kwargs)(KEY, data)["p"])
    assert np.all((drawn > 0) & (drawn < 1))
