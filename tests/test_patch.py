"""`patch`: PyMC's JAX samplers post-processing through `pymc_chunkpost`.

Real NUTS runs (tens of draws, sampled once per module) compare every entry point, patched,
with unpatched pymc at the same seed. The option-routing tests replace only the NUTS step
(`pymc.sampling.jax._sample_{numpyro,blackjax}_nuts`) with a fake that returns fixed draws
and records the kernel's kwargs; everything else is pymc's own code on a real model.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from pathlib import Path

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
pymc_jax = pytest.importorskip("pymc.sampling.jax")
numpyro = pytest.importorskip("numpyro")
pytest.importorskip("blackjax")

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost import STRATEGIES  # noqa: E402
from pymc_chunkpost._engine.call import postprocess as _postprocess  # noqa: E402

PYMC6 = int(pm.__version__.split(".")[0]) >= 6
TARGETS = ("_postprocess_samples", "sample_jax_nuts", "sample_numpyro_nuts", "sample_blackjax_nuts")
PYMC = {name: getattr(pymc_jax, name) for name in TARGETS}  # pymc's own, before any patch
DRAWS, TUNE, CHAINS = 20, 20, 2
REMOVED = 'postprocessing_vectorize={"scan", "vmap"} will be removed'
KERNEL = {"dense_mass": False}  # a genuine NUTS kernel option, which must still arrive

# Entry points: (how it is called, nuts_sampler). pymc 6 takes sampler options as `nuts=`
# (and still as the deprecated `nuts_sampler_kwargs=`); pymc 5 as `nuts_sampler_kwargs=`.
ENTRIES = [
    ("pm.sample", "numpyro"),
    ("pm.sample", "blackjax"),
    ("sample_numpyro_nuts", "numpyro"),
    ("sample_blackjax_nuts", "blackjax"),
    ("sample_jax_nuts", "numpyro"),
    ("sample_jax_nuts", "blackjax"),
] + ([("pm.sample(nuts_sampler_kwargs=)", "numpyro")] if PYMC6 else [])

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*log_likelihood.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*nuts_sampler_kwargs.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(autouse=True)
def _restore_pymc():
    yield
    pymc_chunkpost.unpatch()
    assert all(getattr(pymc_jax, name) is PYMC[name] for name in TARGETS)


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    group = np.arange(12) % 3
    with pm.Model(coords={"group": range(3)}) as model:
        mu = pm.Normal("mu", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)  # log-transformed: post-processing constrains it
        theta = pm.Normal("theta", mu, sigma, dims="group")
        pm.Deterministic("theta_sq", theta**2, dims="group")
        pm.Normal("y", theta[group], 1, observed=rng.normal(size=12))
        pm.Normal("z", mu, 2, observed=rng.normal(size=5))
    return model


def _sample(entry, sampler, model, options, *, kernel=None, seed=1, **extra):
    """One sampling run through `entry`, with the plugin's `options` where pymc wants them."""
    common = dict(
        draws=DRAWS,
        tune=TUNE,
        chains=CHAINS,
        random_seed=seed,
        progressbar=False,
        compute_convergence_checks=False,
        idata_kwargs={"log_likelihood": True},
    )
    common.update(extra)
    kernel = dict(kernel or {})
    if entry.startswith("pm.sample"):
        sampler_options = {"chain_method": "parallel", **options}
        if PYMC6:  # kernel options sit next to the others; `nuts_sampler_kwargs=` is `nuts=`
            sampler_options.update(kernel)
        elif kernel:
            sampler_options["nuts_kwargs"] = kernel
        key = "nuts" if PYMC6 and entry == "pm.sample" else "nuts_sampler_kwargs"
        routed = {key: sampler_options}
        with model:
            return pm.sample(nuts_sampler=sampler, **common, **routed)
    if entry == "sample_jax_nuts":
        common["nuts_sampler"] = sampler
    sample = getattr(pymc_jax, entry)  # looked up now: patched or not
    return sample(
        model=model, chain_method="parallel", nuts_kwargs=kernel or None, **common, **options
    )


def _removed_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if REMOVED in str(w.message)]


@pytest.fixture(scope="module")
def runs(model):
    """Real NUTS runs, cached for the module: `runs(entry, sampler, patched, options)`."""
    cache = {}

    def get(entry, sampler, patched, options):
        key = (entry, sampler, patched, tuple(sorted(options.items())))
        if key not in cache:
            context = pymc_chunkpost.patched() if patched else contextlib.nullcontext()
            with context, warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                idata = _sample(entry, sampler, model, options)
            cache[key] = idata, _removed_warnings(caught)
        return cache[key]

    return get


@pytest.fixture
def spy(monkeypatch):
    """Every call of the engine's `postprocess.run`: its arguments and the plan it ran."""
    calls = []
    real = _postprocess.run
    signature = inspect.signature(real)

    def run(*args, **kwargs):
        outputs, plan = real(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append((bound.arguments, plan))
        return outputs, plan

    monkeypatch.setattr(_postprocess, "run", run)
    return calls


@pytest.fixture
def fake_nuts(monkeypatch):
    """Replace only the NUTS step: fixed draws from the initial points; records its kwargs."""
    calls = []

    def fake(*, initial_points, draws, chains, **kwargs):
        calls.append({"chains": chains, **kwargs})
        step = np.arange(draws, dtype=float)
        raw = [
            (p[:, None] + 0.01 * step.reshape((1, draws) + (1,) * (p.ndim - 1))).astype(p.dtype)
            for p in initial_points
        ]
        stats = {"diverging": np.zeros((chains, draws), dtype=bool)}
        return raw, stats, numpyro

    monkeypatch.setattr(pymc_jax, "_sample_numpyro_nuts", fake)
    monkeypatch.setattr(pymc_jax, "_sample_blackjax_nuts", fake)
    return calls


# --- Real NUTS runs: patched equals unpatched -------------------------------------------------

# (entry, sampler, options, expected strategy (None: the planner's), expected chunk size)
REAL = [
    (
        "pm.sample",
        "numpyro",
        {"postprocessing_vectorize": "chunked", "postprocessing_chunk_size": 7},
        "chunked",
        7,
    ),
    ("pm.sample", "blackjax", {}, None, None),
    ("sample_numpyro_nuts", "numpyro", {"postprocessing_vectorize": "scan"}, "scan", None),
    (
        "sample_blackjax_nuts",
        "blackjax",
        {"postprocessing_vectorize": "chunked", "postprocessing_n_chunks": 3},
        "chunked",
        7,  # per device: parallel chains leave one chain per device, ceil(20 draws / 3)
    ),
    (
        "sample_jax_nuts",
        "numpyro",
        {"postprocessing_vectorize": "nested_scan"},
        "nested_scan",
        None,
    ),
    ("sample_jax_nuts", "blackjax", {"postprocessing_memory_budget": 2**30}, None, None),
    ("pm.sample", "numpyro", {"postprocessing_output_memory": "host"}, None, None),
]


@pytest.mark.slow  # real NUTS runs, patched and not (the routing is checked with fake_nuts)
@pytest.mark.parametrize("entry, sampler, options, strategy, chunk_size", REAL)
def test_patched_run_equals_pymc(runs, entry, sampler, options, strategy, chunk_size):
    # Reference: unpatched pymc at the same seed. `sample_{numpyro,blackjax}_nuts` are
    # `sample_jax_nuts` with `nuts_sampler` bound, so they share the direct reference.
    reference_entry = "pm.sample" if entry == "pm.sample" else "sample_jax_nuts"
    reference, reference_removed = runs(
        reference_entry, sampler, False, {"postprocessing_vectorize": "vmap"}
    )
    idata, removed = runs(entry, sampler, True, options)

    assert set(idata.posterior.data_vars) == {"mu", "sigma", "theta", "theta_sq"}
    for name in idata.posterior.data_vars:
        np.testing.assert_array_equal(idata.posterior[name].values, reference.posterior[name])
    assert set(idata.log_likelihood.data_vars) == {"y", "z"}
    for name in idata.log_likelihood.data_vars:
        np.testing.assert_array_equal(
            idata.log_likelihood[name].values, reference.log_likelihood[name]
        )

    attrs = idata.posterior.attrs
    assert attrs["inference_library"] == reference.posterior.attrs["inference_library"]
    if strategy is None:
        assert attrs["postprocessing_strategy"] in STRATEGIES
    else:
        assert attrs["postprocessing_strategy"] == strategy
    if attrs["postprocessing_strategy"] == "chunked":
        assert type(attrs["postprocessing_chunk_size"]) is int
        assert chunk_size is None or attrs["postprocessing_chunk_size"] == chunk_size
    else:
        assert "postprocessing_chunk_size" not in attrs
    assert "postprocessing_strategy" not in reference.posterior.attrs

    assert reference_removed, "control: unpatched pymc warns that the option will be removed"
    assert removed == []


# --- Options reach the plugin, never the kernel (fake NUTS step) -------------------------------


def _sample_recorded(entry, sampler, model, options, **extra):
    with pymc_chunkpost.patched(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = _sample(entry, sampler, model, options, kernel=KERNEL, **extra)
    return idata, _removed_warnings(caught)


def _check_routed(idata, removed, spy, fake_nuts, expected):
    assert removed == []
    assert [call["nuts_kwargs"] for call in fake_nuts] == [KERNEL]
    # pymc post-processes the log-likelihood first (keeps the draws), then the posterior.
    assert [arguments["donate_samples"] for arguments, _ in spy] == [False, True]
    for arguments, _ in spy:
        for name, value in expected.items():
            assert arguments[name] == value, name
    plan = spy[-1][1]
    assert idata.posterior.attrs["postprocessing_strategy"] == plan.strategy
    assert idata.posterior.attrs.get("postprocessing_chunk_size") == plan.chunk_size


@pytest.mark.parametrize("strategy", [*STRATEGIES, None])
def test_every_strategy_reaches_the_plugin_through_pm_sample(model, spy, fake_nuts, strategy):
    options = {} if strategy is None else {"postprocessing_vectorize": strategy}
    idata, removed = _sample_recorded("pm.sample", "numpyro", model, options)

    expected = "auto" if strategy is None else strategy
    _check_routed(idata, removed, spy, fake_nuts, {"postprocessing_vectorize": expected})
    if expected != "auto":
        assert idata.posterior.attrs["postprocessing_strategy"] == expected


OPTION_SETS = [
    (
        {
            "postprocessing_vectorize": "chunked",
            "postprocessing_chunk_size": 5,
            "postprocessing_memory_budget": 2**30,
        },
        {
            "postprocessing_vectorize": "chunked",
            "chunk_size": 5,
            "n_chunks": None,
            "memory_budget": 2**30,
        },
    ),
    (
        {"postprocessing_n_chunks": 4},
        {"postprocessing_vectorize": "auto", "chunk_size": None, "n_chunks": 4},
    ),
    (
        {"postprocessing_output_memory": "host"},
        {"postprocessing_vectorize": "auto", "output_memory": "host"},
    ),
]


@pytest.mark.parametrize("options, expected", OPTION_SETS)
@pytest.mark.parametrize("entry, sampler", ENTRIES)
def test_options_reach_the_plugin_not_the_kernel(
    model, spy, fake_nuts, entry, sampler, options, expected
):
    idata, removed = _sample_recorded(entry, sampler, model, options)

    _check_routed(idata, removed, spy, fake_nuts, {**expected, "progressbar": False})


def test_postprocessing_backend_still_reaches_the_plugin(model, spy, fake_nuts):
    idata, _ = _sample_recorded("pm.sample", "numpyro", model, {"postprocessing_backend": "cpu"})

    assert [arguments["postprocessing_backend"] for arguments, _ in spy] == ["cpu", "cpu"]
    assert "postprocessing_strategy" in idata.posterior.attrs


@pytest.mark.parametrize(
    "progressbar, quiet, expected",
    [(True, False, True), (True, True, False), (False, False, False)],
)
def test_progressbar_follows_pymc(model, spy, fake_nuts, progressbar, quiet, expected):
    _sample_recorded("sample_jax_nuts", "numpyro", model, {}, progressbar=progressbar, quiet=quiet)

    assert [arguments["progressbar"] for arguments, _ in spy] == [expected, expected]


def test_unpatched_pymc_warns_and_never_calls_the_plugin(model, spy, fake_nuts):
    # Control for the tests above: their checks would see pymc's warning and pymc's path.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = _sample("pm.sample", "numpyro", model, {"postprocessing_vectorize": "scan"})

    assert _removed_warnings(caught)
    assert spy == []
    assert "postprocessing_strategy" not in idata.posterior.attrs


# --- Bad options: ValueError before sampling -----------------------------------------------------

BAD_OPTIONS = [
    ({"postprocessing_vectorize": "bogus"}, "Valid strategies: " + ", ".join(STRATEGIES)),
    ({"postprocessing_vectorize": "vmap", "postprocessing_chunk_size": 4}, "apply to"),
    ({"postprocessing_chunk_size": 0}, "postprocessing_chunk_size` must be a positive int"),
    ({"postprocessing_n_chunks": 1.5}, "postprocessing_n_chunks` must be a positive int"),
    ({"postprocessing_chunk_size": 2, "postprocessing_n_chunks": 2}, "not both"),
    ({"postprocessing_memory_budget": -1}, "postprocessing_memory_budget` must be"),
    ({"postprocessing_backend": "abacus"}, "Unknown `postprocessing_backend"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
@pytest.mark.parametrize(
    "entry, sampler", [("pm.sample", "numpyro"), ("sample_blackjax_nuts", "blackjax")]
)
def test_bad_options_raise_before_sampling(model, spy, fake_nuts, entry, sampler, options, message):
    with pymc_chunkpost.patched(), pytest.raises(ValueError, match=message.replace("(", r"\(")):
        _sample(entry, sampler, model, options)

    assert fake_nuts == []
    assert spy == []


def test_option_given_twice_raises(model, fake_nuts):
    with pymc_chunkpost.patched(), pytest.raises(ValueError, match="given twice"):
        pymc_jax.sample_numpyro_nuts(
            model=model,
            postprocessing_chunk_size=2,
            nuts_kwargs={"postprocessing_chunk_size": 3},
        )
    assert fake_nuts == []


@pytest.mark.parametrize("entry", ["pm.sample", "sample_numpyro_nuts"])
def test_pymc_warnings_name_no_frame_of_ours(model, fake_nuts, entry):
    """pymc's own FutureWarnings from its sampler (pymc 6: `log_likelihood` in
    `idata_kwargs`) are those it gives unpatched, and never name one of pymc_chunkpost's
    frames (pymc's `stacklevel` counts the patch's one frame: one frame below pymc's own
    choice, never a helper of ours)."""

    def caught(patched):
        context = pymc_chunkpost.patched() if patched else contextlib.nullcontext()
        with context, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _sample(entry, "numpyro", model, {})
        return [w for w in caught if w.category is FutureWarning and REMOVED not in str(w.message)]

    plain, patched = caught(False), caught(True)
    if PYMC6:
        assert plain, "control: pymc 6 warns that `log_likelihood` is deprecated"
    assert sorted(str(w.message) for w in patched) == sorted(str(w.message) for w in plain)
    package = str(Path(pymc_chunkpost.__file__).parent)
    assert not any(w.filename.startswith(package) for w in patched)


def test_blackjax_progress_bar_error_names_the_pin(model, monkeypatch):
    upstream = TypeError("kernel() got an unexpected keyword argument 'progress_bar'")

    def broken(**kwargs):
        raise upstream

    monkeypatch.setattr(pymc_jax, "_sample_blackjax_nuts", broken)
    with pymc_chunkpost.patched(), pytest.raises(TypeError, match="blackjax<1.6") as info:
        _sample("sample_blackjax_nuts", "blackjax", model, {})
    assert info.value.__cause__ is upstream


def test_other_type_errors_pass_unchanged(model, monkeypatch):
    upstream = TypeError("kernel() got an unexpected keyword argument 'step_size'")

    def broken(**kwargs):
        raise upstream

    monkeypatch.setattr(pymc_jax, "_sample_blackjax_nuts", broken)
    with pymc_chunkpost.patched(), pytest.raises(TypeError) as info:
        _sample("sample_blackjax_nuts", "blackjax", model, {})
    assert info.value is upstream


# --- Direct calls of the patched `_postprocess_samples` ----------------------------------------


@pytest.fixture(scope="module")
def direct_problem(model):
    jax_fn = pymc_jax.get_jaxified_graph(
        inputs=model.value_vars, outputs=model.unobserved_value_vars
    )
    rng = np.random.default_rng(1)
    point = model.initial_point()
    raw = [
        rng.normal(size=(CHAINS, DRAWS) + point[v.name].shape).astype(v.dtype)
        for v in model.value_vars
    ]
    return jax_fn, raw


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_direct_call_outside_sampling(direct_problem, spy, strategy):
    jax_fn, raw = direct_problem
    expected = PYMC["_postprocess_samples"](jax_fn, raw, None, "vmap")
    pymc_chunkpost.patch()

    got = pymc_jax._postprocess_samples(jax_fn, raw, None, strategy)

    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    # pymc's own names run pymc's own function; the others run the plugin.
    assert len(spy) == (0 if strategy in ("vmap", "scan") else 1)


def test_direct_call_unknown_strategy(direct_problem):
    jax_fn, raw = direct_problem
    pymc_chunkpost.patch()
    with pytest.raises(ValueError, match="Valid strategies: " + ", ".join(STRATEGIES)):
        pymc_jax._postprocess_samples(jax_fn, raw, None, "bogus")


# --- patch / unpatch / patched ----------------------------------------------------------------


def test_unpatch_restores_pymc_by_identity():
    assert not pymc_chunkpost.is_patched()
    pymc_chunkpost.patch()
    assert pymc_chunkpost.is_patched()
    assert all(getattr(pymc_jax, name) is not PYMC[name] for name in TARGETS)

    pymc_chunkpost.unpatch()

    assert not pymc_chunkpost.is_patched()
    assert all(getattr(pymc_jax, name) is PYMC[name] for name in TARGETS)


def test_patch_and_unpatch_twice_are_harmless():
    pymc_chunkpost.patch()
    first = {name: getattr(pymc_jax, name) for name in TARGETS}
    pymc_chunkpost.patch()
    assert all(getattr(pymc_jax, name) is first[name] for name in TARGETS)

    pymc_chunkpost.unpatch()
    pymc_chunkpost.unpatch()

    assert not pymc_chunkpost.is_patched()
    assert all(getattr(pymc_jax, name) is PYMC[name] for name in TARGETS)


def test_patched_restores_pymc_when_the_body_raises():
    with pytest.raises(KeyError), pymc_chunkpost.patched():
        assert pymc_chunkpost.is_patched()
        assert pymc_jax.sample_jax_nuts is not PYMC["sample_jax_nuts"]
        raise KeyError("boom")

    assert not pymc_chunkpost.is_patched()
    assert all(getattr(pymc_jax, name) is PYMC[name] for name in TARGETS)


def test_patched_keeps_an_earlier_patch():
    pymc_chunkpost.patch()
    with pymc_chunkpost.patched():
        pass
    assert pymc_chunkpost.is_patched()


def _replace_parameters(signature, edit):
    return signature.replace(parameters=edit(list(signature.parameters.values())))


def _extra(parameters, kind):
    return [*parameters, inspect.Parameter("chunk_size", kind, default=None)]


SIGNATURE_CHANGES = {
    "_postprocess_samples": [
        lambda ps: _extra(ps, inspect.Parameter.POSITIONAL_OR_KEYWORD),
        lambda ps: [
            p.replace(default="scan") if p.name == "postprocessing_vectorize" else p for p in ps
        ],
        lambda ps: ps[:-1],
    ],
    "sample_jax_nuts": [
        lambda ps: ps[:-1] + _extra(ps[-1:], inspect.Parameter.KEYWORD_ONLY),
        lambda ps: [p for p in ps if p.name != "nuts_kwargs"],
        lambda ps: [
            p.replace(default="scan") if p.name == "postprocessing_vectorize" else p for p in ps
        ],
    ],
}


@pytest.mark.parametrize(
    "name, change",
    [(name, i) for name, changes in SIGNATURE_CHANGES.items() for i in range(len(changes))],
)
def test_unknown_pymc_signature_is_refused_without_half_patch(monkeypatch, name, change):
    original = PYMC[name]

    def impostor(*args, **kwargs):
        return original(*args, **kwargs)

    impostor.__signature__ = _replace_parameters(
        inspect.signature(original), SIGNATURE_CHANGES[name][change]
    )
    monkeypatch.setattr(pymc_jax, name, impostor)
    before = {target: getattr(pymc_jax, target) for target in TARGETS}

    with pytest.raises(
        RuntimeError, match=f"signature of `pymc.sampling.jax.{name}` is not one it knows"
    ):
        pymc_chunkpost.patch()

    assert not pymc_chunkpost.is_patched()
    assert all(getattr(pymc_jax, target) is before[target] for target in TARGETS)


def test_sampler_that_bypasses_the_module_is_refused(monkeypatch):
    original = PYMC["sample_jax_nuts"]

    def impostor(*args, **kwargs):  # same signature, but never calls `_postprocess_samples`
        return original(*args, **kwargs)

    impostor.__signature__ = inspect.signature(original)
    monkeypatch.setattr(pymc_jax, "sample_jax_nuts", impostor)

    with pytest.raises(RuntimeError, match="does not call"):
        pymc_chunkpost.patch()

    assert not pymc_chunkpost.is_patched()
    assert pymc_jax._postprocess_samples is PYMC["_postprocess_samples"]
