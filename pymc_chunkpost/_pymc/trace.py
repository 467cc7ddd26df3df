"""The trace that `sample_posterior_predictive` takes, read as pymc reads it: the draws and
their sample dims, and what pymc reads from around them (constant data, coords, observed
data), checked before any work.

Both the route (`predictive`: it reads the trace, and packs the result around it) and pymc's
rules for what is drawn anew (`forward_graph`: which variables the trace holds, at which
shapes) take a `Trace`; it lives here so that neither imports the other for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .model import pymc6

__all__ = ["Trace", "read_trace"]


@dataclasses.dataclass
class Trace:
    """The trace's draws and what pymc reads from around them.

    `sample_shape` is the leading shape of pymc's outputs: the lengths of the sample dims for
    a `Dataset`, `(1, n)` for a list of `n` points (`stacked_dims` is then None).
    """

    idata: Any  # the inference data given (extended in place), else None
    posterior: Any  # the posterior `Dataset`, or the list of points
    sample_dims: list[str]
    stacked_dims: dict[str, Any] | None
    sample_shape: tuple[int, ...]
    names: list[str]  # the trace's variables
    constant_data: dict[str, np.ndarray]
    coords: dict[str, np.ndarray]
    observed_data: Any

    def values(self, name: str) -> np.ndarray:
        """`name`'s draws, of shape `sample_shape + event shape` (a view where possible)."""
        if self.stacked_dims is None:
            stacked = np.stack([np.asarray(point[name]) for point in self.posterior])
            return stacked.reshape(self.sample_shape + stacked.shape[1:])
        return self.posterior[name].transpose(*self.sample_dims, ...).values

    def event_shape(self, name: str) -> tuple[int, ...]:
        if self.stacked_dims is None:
            return tuple(np.shape(self.posterior[0][name]))
        return tuple(self.posterior[name].shape[len(self.sample_dims) :])


def read_trace(trace: Any, sample_dims: Sequence[str] | None, model: Any) -> Trace:
    """What pymc reads from `trace`, checked before any work.

    Raises:
        TypeError: a trace of a type pymc does not take (pymc's own message).
        ValueError: sample dims the trace does not have, or points without the same keys.
    """
    import xarray

    dims = ["chain", "draw"] if sample_dims is None else list(sample_dims)
    constant_data: dict[str, np.ndarray] = {}
    coords: dict[str, np.ndarray] = {}
    idata, observed_data = None, None
    if _is_inference_data(trace):
        given = getattr(trace, "constant_data", None)
        if given is not None:
            coords.update({str(k): v.data for k, v in given.coords.items()})
            constant_data.update({str(k): v.data for k, v in given.items()})
        idata, observed_data = trace, trace.get("observed_data", None)
        if not pymc6():
            trace = trace["posterior"]
        else:
            trace = trace["posterior"].dataset if "posterior" in trace.children else trace.dataset
    if isinstance(trace, xarray.Dataset):
        return _read_dataset(trace, dims, idata, constant_data, coords, observed_data)
    if isinstance(trace, list) and trace and all(isinstance(x, dict) for x in trace):
        names = list(trace[0])
        if any(list(point) != names for point in trace):
            raise ValueError(
                "Every point of `trace` must have the same variables, in the same order; "
                f"the first has {names}."
            )
        shape = (1, len(trace))
        return Trace(None, trace, dims, None, shape, names, {}, {}, None)
    raise TypeError(f"Unsupported type for `trace` argument: {type(trace)}.")


def _read_dataset(dataset, dims, idata, constant_data, coords, observed_data) -> Trace:
    names = [str(name) for name in dataset.data_vars]
    if not names:
        raise ValueError("`trace` has no variables: pass the posterior that `pm.sample` returned.")
    for name in names:
        if absent := [d for d in dims if d not in dataset[name].dims]:
            raise ValueError(
                f"`sample_dims={dims}` names {absent}, which `trace[{name!r}]` does not have "
                f"(its dims: {dataset[name].dims}). Pass the dims that index its draws."
            )
    coords.update({str(k): v.data for k, v in dataset.coords.items()})
    stacked = {d: dataset[names[0]][d] for d in dims}  # as pymc's `dataset_to_point_list`
    shape = tuple(len(coord) for coord in stacked.values())
    return Trace(idata, dataset, dims, stacked, shape, names, constant_data, coords, observed_data)


def _is_inference_data(trace: Any) -> bool:
    if pymc6():
        import xarray

        return isinstance(trace, xarray.DataTree)
    from arviz import InferenceData

    return isinstance(trace, InferenceData)
