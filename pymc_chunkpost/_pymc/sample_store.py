"""The patched `pm.sample`'s outputs on disk: its whole InferenceData in one Zarr store.

pymc's `sample_jax_nuts` post-processes twice after NUTS, through `_postprocess_samples`: the
pointwise log-likelihood first (where `idata_kwargs={"log_likelihood": True}`), then the
posterior; then it packs everything into an InferenceData (pymc 5) or a DataTree (pymc 6).
With `postprocessing_output_memory="disk"`:

- before NUTS, `SampleStore.plan` checks the place (`_disk_sink.check_place`: a path,
  empty or absent, writable, room for what the model's shapes say the outputs take) and
  names each post-processing run's outputs as pymc will (`_runs`);
- each run writes its store of its own under the store's `_zarr_store.PARTS`
  (`next_run`), and hands pymc placeholders that take no memory (`placeholders`): pymc
  packs them with its other groups;
- `finish` moves the runs' groups into the store, writes pymc's other groups (sample stats,
  observed and constant data) and attributes beside them, marks the store complete, and
  returns pymc's type opened from it: the posterior (and the log-likelihood) read lazily.

The store then holds the groups of the InferenceData that pymc returns without disk, and
`xr.open_datatree(path, engine="zarr")` opens it. A store cannot be resumed here: each call
draws new samples.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._engine.call.postprocess import StoreLayout
from .._engine.execute import disk_sink as _disk_sink
from .._store import zarr as _zarr_store
from .model import pymc6

__all__ = ["OPTION", "SampleStore"]

#: What `pm.sample` calls the store's folder (`check_place`'s messages name it).
OPTION = "postprocessing_output_path"
#: What a place refused after sampling leaves (the exact bytes, checked once the draws'
#: shapes are known): the draws were not kept.
AFTER_SAMPLING = (
    "NUTS had run: its draws are not kept, and what this call wrote is removed. Sample "
    "again with a place that can take the outputs."
)


@dataclasses.dataclass
class SampleStore:
    """One sampling call's store: its folder, the model, and, in pymc's order, each
    post-processing run's group and layout (`runs`); `existed`: the folder was there (empty)
    before the call; `started`: a run has written under it; `completed`: the store is
    complete (nothing of it is then removed)."""

    path: Path
    model: Any
    runs: list[tuple[str, StoreLayout]]
    existed: bool = False
    started: bool = False
    completed: bool = False

    @classmethod
    def plan(cls, path: Any, model: Any, arguments: Mapping[str, Any]) -> SampleStore:
        """The store of a sampling call with these arguments (`sample_jax_nuts`'s, bound),
        checked before NUTS runs.

        Raises:
            ValueError: the place cannot take the outputs (`_disk_sink.check_place`), or
                the arguments name variables the model lacks.
        """
        runs = _runs(model, arguments)
        draws = int(arguments["chains"]) * int(arguments["draws"])
        known = sum(_known_bytes(model, layout.names or (), draws) for _, layout in runs)
        _disk_sink.check_place(path, [], known, resume=False, name=OPTION, refused="")
        folder = Path(os.fspath(path))
        return cls(folder, model, runs, existed=folder.is_dir())

    def next_run(self) -> dict[str, Any]:
        """`_postprocess.run`'s keywords for pymc's next post-processing run: its outputs
        on disk, in a store of its own under this one's, laid out as pymc names them.

        Raises:
            RuntimeError: pymc post-processes more often than this pymc is known to.
        """
        if not self.runs:
            raise RuntimeError(
                "pymc_chunkpost: this pymc's `sample_jax_nuts` post-processes more often "
                "than the disk tier knows (the log-likelihood, then the posterior). Pass "
                "another `postprocessing_output_memory`."
            )
        group, layout = self.runs.pop(0)
        self.started = True
        return {
            "output_memory": "disk",
            "output_path": _zarr_store.part_path(self.path, group),
            "store": dataclasses.replace(layout, option=OPTION, refused=AFTER_SAMPLING),
        }

    @staticmethod
    def placeholders(outputs: Sequence[Any]) -> list[np.ndarray]:
        """What pymc packs in place of the stored outputs: their shapes and dtypes, no
        memory (`finish` puts the store's arrays in their place)."""
        return [np.broadcast_to(np.zeros((), x.dtype), x.shape) for x in outputs]

    def finish(self, idata: Any, checks: bool, quiet: bool) -> Any:
        """The store completed from pymc's `idata` (packed around the placeholders), and
        `idata`'s type opened from it; pymc's convergence checks on it where asked."""
        from pymc.stats.convergence import log_warnings, run_convergence_checks

        groups = _groups(idata)
        _zarr_store.begin(self.path)
        parts = self.path / _zarr_store.PARTS
        stored = set()
        if parts.is_dir():
            for part in sorted(parts.iterdir()):
                _zarr_store.adopt(self.path, part)
                stored.add(part.name)
            parts.rmdir()
        for name, dataset in groups.items():
            if name in stored:  # pymc's coordinates of its own (`<name>_dim_0`: 0..n-1)
                index = {k: v.values for k, v in dataset.coords.items() if v.dims == (k,)}
                _zarr_store.add_coords(self.path, name, index)
                _zarr_store.set_attrs(self.path, name, dataset.attrs)
            else:
                _zarr_store.write_dataset(self.path, name, dataset)
        _zarr_store.complete(self.path)
        self.completed = True
        opened = _open(self.path, list(groups))
        if checks:
            warns = run_convergence_checks(opened, self.model)
            if not quiet:
                log_warnings(warns)
        return opened

    def abandon(self) -> None:
        """After a failure: remove what the call wrote (the folder was empty or absent
        before it, `plan`), so that the same path can be passed again; a folder that was
        there stays, emptied. A complete store stays whole. A failure to remove is a
        warning: the caller's exception is the one raised."""
        if not self.started or self.completed or not self.path.is_dir():
            return
        try:
            if self.existed:
                for entry in self.path.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
            else:
                shutil.rmtree(self.path)
        except OSError as error:
            warnings.warn(
                f"pymc_chunkpost could not remove the unfinished store at {self.path} "
                f"({error}); delete it before passing that path again.",
                RuntimeWarning,
                stacklevel=3,
            )


def _runs(model: Any, arguments: Mapping[str, Any]) -> list[tuple[str, StoreLayout]]:
    """Each post-processing run of `sample_jax_nuts`, as pymc names its outputs: the
    observed variables' log-likelihood (where asked), then the posterior's variables
    (`var_names`, `keep_untransformed`: pymc's own selection), with pymc's dims and coords
    (the model's, updated by `idata_kwargs`)."""
    from pymc.backends.arviz import coords_and_dims_for_inferencedata
    from pymc.util import get_default_varnames

    var_names = arguments.get("var_names")
    values = model.unobserved_value_vars
    if var_names is not None:
        values = [v for v in values if v.name in var_names]
    posterior = list(
        get_default_varnames(values, include_transformed=bool(arguments["keep_untransformed"]))
    )
    idata_kwargs = dict(arguments.get("idata_kwargs") or {})
    coords, dims = coords_and_dims_for_inferencedata(model)
    coords.update(idata_kwargs.get("coords") or {})
    dims.update(idata_kwargs.get("dims") or {})
    runs = []
    if idata_kwargs.get("log_likelihood", False):
        names = [v.name for v in model.observed_RVs]
        runs.append(("log_likelihood", StoreLayout(names, "log_likelihood", dims, coords)))
    names = [v.name for v in posterior]
    runs.append(("posterior", StoreLayout(names, "posterior", dims, coords)))
    return runs


def _known_bytes(model: Any, names: Sequence[str], draws: int) -> int:
    """What the outputs named take over `draws`, as far as the model's shapes say before
    sampling: the free variables' evaluated shapes, the others' static ones (a variable of
    unknown shape counts nothing: the engine checks the exact bytes before it writes)."""
    shapes = model.eval_rv_shapes()
    total = 0
    for name in names:
        variable = model[name]
        shape = shapes.get(name, variable.type.shape)
        if any(s is None for s in shape):
            continue
        total += math.prod(int(s) for s in shape) * np.dtype(variable.dtype).itemsize
    return total * draws


def _groups(idata: Any) -> dict[str, Any]:
    """pymc's groups, by name, as `Dataset`s (InferenceData or DataTree)."""
    if pymc6():
        return {name: idata[name].to_dataset() for name in idata.children}
    return {name: idata[name] for name in idata.groups()}


def _open(path: Path, names: Sequence[str]) -> Any:
    """pymc's type for the groups `names`, opened lazily from the store at `path`."""
    if pymc6():
        import xarray

        tree = xarray.open_datatree(os.fspath(path), engine="zarr", chunks=None)
        tree.attrs.pop(_zarr_store.ATTRIBUTE, None)  # the store's own description
        return tree
    from arviz import InferenceData

    return InferenceData(**{name: _zarr_store.open_group(path, name) for name in names})
