"""The predictive route on a trace whose lengths differ from the model's, against pymc's own.

pymc's rules (`test_length_coords_volatile` and its neighbours in pymc's
`tests/sampling/test_forward.py`), found by running pymc's own function on every case here:

- A length fixed in the variable's type (`shape=3`, or the model after
  `freeze_dims_and_data`): a trace of another length raises (pymc: pytensor's `TypeError`
  for the compiled function's input; ours: a `ValueError` that names the variable).
- A length that a dim gives (`dims=`, resizable by `set_dim`): pymc computes with the trace's
  length. pymc 5 draws anew a variable whose coords changed (other labels, or no coords in
  the trace), so it only takes a trace variable of its dims' labels; pymc 6 keeps every trace
  variable not in `sample_vars`, of whatever length, warning `ImplicitFreezeWarning` when its
  coords changed (`y = x.mean()` is then the mean of the trace's values).
- What cannot compute with those lengths raises in both (shapes that do not broadcast:
  `ValueError`). A constant index out of range raises `IndexError` in pymc 5; pymc 6's
  default (numba) backend reads past the array instead, a value no one can reproduce: ours
  raises `IndexError` on both, where JAX would clamp the index.

Every case compares ours (and `pm.sample_posterior_predictive` patched) with pymc's own:
the same exception or none, the same "Sampling: [...]" line and warnings, and the same values
for what is not drawn anew; what is drawn is compared by shape and dtype (its numbers differ
from pymc's for a seed by design, docs/predictive.md).
"""

from __future__ import annotations

import itertools
import logging
import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")
xr = pytest.importorskip("xarray")

import pymc_chunkpost  # noqa: E402
from pymc_chunkpost._pymc import predictive as _predictive  # noqa: E402

PYMC6 = int(pm.__version__.split(".")[0]) >= 6
PYMC = _predictive._pymc_function()  # pymc's own, never patched
IDX = np.array([0, 1, 2])  # `w = x[idx]`: out of range of a trace `x` of length 2


def patched(*args, **kwargs):
    with pymc_chunkpost.patched(posterior_predictive=True):
        return pm.sample_posterior_predictive(*args, **kwargs)


FUNCTIONS = {"ours": pymc_chunkpost.sample_posterior_predictive, "patched": patched}


def model(kind: str) -> pm.Model:
    """`x` of length 3 by a dim's length ("length"), by coords ("coords"), fixed by
    `freeze_dims_and_data` ("frozen") or by `shape=3` ("shape"); deterministics that reduce
    it (`y`), broadcast it against a constant (`z`) and index it (`w`); a random `obs`."""
    with pm.Model(coords={"trial": [0, 1, 2]} if kind in ("coords", "frozen") else None) as m:
        if kind == "length":
            m.add_coord("trial", length=3)
        x = pm.Normal("x", shape=3) if kind == "shape" else pm.Normal("x", dims="trial")
        idx = pm.Data("idx", IDX)
        pm.Deterministic("y", x.mean())
        pm.Deterministic("z", x + np.array([10.0, 20.0, 30.0]))
        pm.Deterministic("w", x[idx])
        pm.Normal("obs", x.sum(), 1.0)
    if kind == "frozen":
        from pymc.model.transform.optimization import freeze_dims_and_data

        m = freeze_dims_and_data(m)
    return m


def trace(length: int, coords: str) -> xr.Dataset:
    """Two draws of `x` (`1, 2, ...`) along "trial", with its coords ("same" labels as the
    model's, "other" labels, or "none")."""
    coordinates = {"chain": [0], "draw": [0, 1]}
    if coords != "none":
        coordinates["trial"] = np.arange(length) + (0 if coords == "same" else 5)
    values = np.broadcast_to(np.arange(1.0, length + 1), (1, 2, length)).copy()
    return xr.Dataset({"x": (("chain", "draw", "trial"), values)}, coords=coordinates)


def outcome(function, kind, length, coords, resize, arguments, caplog):
    """The result (or the exception), the "Sampling" lines and the warnings of one call on a
    fresh model (after `set_dim("trial", resize)` where `resize` is not None)."""
    m = model(kind)
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        with m:
            if resize is not None:
                labels = None if kind == "length" else np.arange(resize)
                m.set_dim("trial", resize, coord_values=labels)
            try:
                result = function(
                    trace(length, coords),
                    progressbar=False,
                    return_inferencedata=False,
                    random_seed=1,
                    **arguments,
                )
            except Exception as error:  # the comparison is the test: which, if any, raises
                result = error
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Sampling")]
    said = [(w.category, str(w.message)) for w in caught if w.category is not FutureWarning]
    return result, lines, said


ARGUMENTS = [{"var_names": ["y"]}, {"var_names": ["x", "y"]}, {"var_names": ["z"]}]
ARGUMENTS += [{"var_names": ["w"]}, {"var_names": ["obs"]}]
if PYMC6:
    ARGUMENTS += [
        {"var_names": ["y"], "sample_vars": ["x"]},
        {"var_names": ["y"], "freeze_vars": ["x"]},
    ]
CASES = [
    (kind, length, coords, resize)
    for kind, length, coords, resize in itertools.product(
        ["length", "coords", "frozen", "shape"], [3, 2], ["same", "other", "none"], [None, 2]
    )
    if resize is None or kind in ("length", "coords")  # a frozen or fixed length stays
]


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=str)
@pytest.mark.parametrize(("kind", "length", "coords", "resize"), CASES, ids=str)
@pytest.mark.parametrize("route", ["ours", pytest.param("patched", marks=pytest.mark.slow)])
def test_resized_trace_as_pymc(route, kind, length, coords, resize, arguments, caplog):
    theirs, their_lines, their_warnings = outcome(
        PYMC, kind, length, coords, resize, arguments, caplog
    )
    ours, our_lines, our_warnings = outcome(
        FUNCTIONS[route], kind, length, coords, resize, arguments, caplog
    )
    drawn = "x" in their_lines[0] if their_lines else True
    model_length = 3 if resize is None else resize
    kept_length = length if not drawn else model_length
    if isinstance(theirs, Exception) and not isinstance(theirs, IndexError):
        assert isinstance(ours, ValueError), (theirs, ours)
        return
    if "w" in arguments["var_names"] and kept_length < len(IDX):
        # pymc 5 raises IndexError; pymc 6 (numba) reads past `x`: ours raises on both.
        assert PYMC6 or isinstance(theirs, IndexError), theirs
        assert isinstance(ours, IndexError), ours
        return
    assert not isinstance(theirs, Exception), theirs
    assert not isinstance(ours, Exception), (theirs, ours)
    assert our_lines == their_lines
    assert our_warnings == their_warnings
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        assert ours[name].shape == value.shape, name
        assert ours[name].dtype == value.dtype, name
        if name != "obs" and not drawn:  # computed from the trace's `x` alone
            np.testing.assert_array_equal(ours[name], value, err_msg=name)


def test_pymcs_length_coords_volatile():
    """pymc's own test on the installed pymc: a trace of 2 `x` along a dim of length 3."""
    with pm.Model() as m:
        m.add_coord("trial", length=3)
        x = pm.Normal("x", dims="trial")
        pm.Deterministic("y", x.mean())
    short = xr.Dataset(
        {"x": (("chain", "draw", "trial"), np.full((1, 1, 2), np.pi))},
        coords={"chain": [0], "draw": [0], "trial": range(2)},
    )
    with m, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = FUNCTIONS["ours"](short, var_names=["y"], progressbar=False)["posterior_predictive"]
    y = np.asarray(y["y"]).reshape(())
    if PYMC6:  # kept, with a warning: the mean of the trace's two values
        assert y == np.pi
        assert [w.category.__name__ for w in caught] == ["ImplicitFreezeWarning"]
    else:  # the coords changed: `x` drawn anew at length 3
        assert y != np.pi


def test_out_of_range_constant_index_raises_before_any_work(monkeypatch):
    """An index out of range of the trace's `x` raises IndexError (pymc 5's), before the
    engine runs, where JAX would clamp it to the last element."""
    from pymc_chunkpost._engine.call import postprocess as _postprocess

    def refuse(*args, **kwargs):
        raise AssertionError("the engine ran")

    monkeypatch.setattr(_postprocess, "run", refuse)
    m = model("coords")
    with m:
        pm.set_data({"idx": np.array([0, 1, 5])})
    with m, pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 3"):
        FUNCTIONS["ours"](trace(3, "same"), var_names=["w"], progressbar=False)
