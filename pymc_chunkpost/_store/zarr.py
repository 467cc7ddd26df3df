"""The disk tier's layout: Zarr v3 stores in xarray's DataTree encoding, and reading them back.

One unit: what a store of outputs looks like on disk, for every writer of it (the engine's
sink, `_engine.execute.disk_sink`, writes chunks into it; the routes assemble a whole
InferenceData from several runs' stores, `PARTS`) and for `open_outputs`, which reads it
back. It imports nothing of the engine: the engine and the routes import it.

Layout (xarray's Zarr encoding of a DataTree, as pymc's `ZarrTrace` writes it): a Zarr v3
group per InferenceData group (`posterior`, `log_likelihood`, ...), in it one array per
variable with `dimension_names` `("chain", "draw", <name>_dim_0, ...)` (or the route's own
dims) and one array per coordinate. The leading sample dims are the route's: the engine's
`(chains, draws)` by default; one, `("draw",)`, or more (`sample_dims`) where the route
returns its outputs so (numpyro's `batch_ndims`). The engine's flat items, `(a * b)` of its
`(a, b, ...)` draws, are the sample dims' items in C order.
`xr.open_datatree(path, engine="zarr")` and `xr.open_zarr(path, group=...)` open it lazily.
The root group's `ATTRIBUTE` describes the store: its `FORMAT`, its outputs
(`Output.describe`) and whether it is `complete`.

Invariants:

- A chunk's marker (a file under `MARKERS`, named by its item range) says that every
  output's region of that chunk was written and flushed to the disk: the markers say which
  items were written whole (`open_outputs`'s `items_written`).
- The root group's `chunkpost.complete` attribute becomes true last (`complete`), after
  every file of the store is flushed to the disk: a killed run never reads back as
  complete. The markers are removed after it (a complete store needs none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._support.extras import require

__all__ = [
    "ATTRIBUTE",
    "FORMAT",
    "MARKERS",
    "PARTS",
    "SAMPLE_DIMS",
    "Output",
    "StoredOutputs",
    "add_coords",
    "adopt",
    "begin",
    "complete",
    "open_group",
    "open_outputs",
    "part_path",
    "sample_dims",
    "set_attrs",
    "stored_arrays",
    "write_dataset",
]

#: The folder, inside the store, of the markers of the chunks written whole.
MARKERS = "_chunkpost_written"
#: The root attribute that describes the store: its format, the outputs, and `complete`.
ATTRIBUTE = "chunkpost"
FORMAT = 1
#: The names of the last two sample dims (of one, `draw`'s alone; of more, `sample_dims`).
SAMPLE_DIMS = ("chain", "draw")


def sample_dims(n: int) -> tuple[str, ...]:
    """The names of `n` leading sample dims: `("draw",)`, `("chain", "draw")`, and before
    those `sample_dim_0`, ... for more."""
    if n < 1:
        raise ValueError(f"Outputs on disk need at least one sample dim, got {n}.")
    return tuple(f"sample_dim_{i}" for i in range(n - 2)) + SAMPLE_DIMS[-n:]


def _zarr() -> Any:
    return require("zarr", extra="disk")


@dataclasses.dataclass(frozen=True)
class Output:
    """One output as stored: its group, name, shape (its `n_sample_dims` sample dims, then
    one draw's), dtype and dims."""

    group: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str, ...]
    n_sample_dims: int = 2

    def describe(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "dims": list(self.dims),
            "n_sample_dims": self.n_sample_dims,
        }

    @classmethod
    def described(cls, d: Mapping[str, Any]) -> Output:
        """The output that `describe` gave `d` (two sample dims where it does not say)."""
        return cls(
            d["group"],
            d["name"],
            tuple(d["shape"]),
            d["dtype"],
            tuple(d["dims"]),
            int(d.get("n_sample_dims", 2)),
        )

    @property
    def n_items(self) -> int:
        """The engine's flat items: the sample dims' product."""
        return math.prod(self.shape[: self.n_sample_dims])


def _read_description(path: Path) -> dict[str, Any] | None:
    """The store's `chunkpost` attribute; None where `path` holds no store of ours."""
    try:
        root = _zarr().open_group(str(path), mode="r")
    except Exception:  # noqa: BLE001 - not a Zarr group (or an unreadable one): not ours
        return None
    described = dict(root.attrs).get(ATTRIBUTE)
    return described if isinstance(described, dict) else None


def _outputs_of(described: Mapping[str, Any]) -> list[Output]:
    return [Output.described(d) for d in described.get("outputs", [])]


def stored_arrays(path: Path, outputs: Sequence[Output]) -> list[Any]:
    """The outputs' Zarr arrays, opened read-only."""
    root = _zarr().open_group(str(path), mode="r")
    return [root[f"{o.group}/{o.name}"] for o in outputs]


def _write_coords(root: Any, outputs: Sequence[Output], coords: Mapping[str, Any]) -> None:
    """The given coordinates (the sample dims by default `0..n-1`), in every group, as
    xarray writes an index coordinate: an array named as its dim."""
    for group_name in dict.fromkeys(o.group for o in outputs):
        sizes: dict[str, int] = {}
        for o in outputs:
            if o.group == group_name:
                sizes.update(zip(o.dims, o.shape))
        sample = {d for o in outputs for d in o.dims[: o.n_sample_dims]}
        _write_group_coords(root[group_name], sizes, coords, sample)


def _write_group_coords(
    group: Any,
    sizes: Mapping[str, int],
    coords: Mapping[str, Any],
    sample: Collection[str] = SAMPLE_DIMS,
) -> None:
    """The coordinates of the dims `sizes` that `group` lacks, from `coords` (the `sample`
    dims by default `0..n-1`)."""
    for dim, size in sizes.items():
        if dim in group:
            continue
        values = coords.get(dim)
        if values is None and dim in sample:
            values = np.arange(size)
        if values is None or np.shape(values) != (size,):
            continue
        values = np.asarray(values)
        if values.dtype.kind in "OU":
            values = values.astype(str)
            dtype: Any = str
        else:
            dtype = values.dtype
        array = group.create_array(dim, shape=values.shape, dtype=dtype, dimension_names=[dim])
        array[...] = values


def _mark(folder: Path, start: int, stop: int) -> None:
    marker = folder / f"{start}_{stop}"
    marker.touch()
    _sync([marker], folder.parent)


def _read_markers(folder: Path) -> list[tuple[int, int]]:
    done = []
    with contextlib.suppress(FileNotFoundError):
        for entry in folder.iterdir():
            a, _, b = entry.name.partition("_")
            if a.isdigit() and b.isdigit():
                done.append((int(a), int(b)))
    return done


def complete(path: Path) -> None:
    """Consolidate the store's metadata and flush every file of it to the disk, then mark
    it complete (last: the store is whole), then remove its markers (a complete store needs
    none)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="zarr")
        _zarr().consolidate_metadata(str(path))
    _sync((f for f in path.rglob("*") if f.is_file()), path)
    root = _zarr().open_group(str(path), mode="r+")
    described = dict(root.attrs[ATTRIBUTE])
    root.attrs[ATTRIBUTE] = described | {"complete": True}
    _sync([path / "zarr.json"], path)
    shutil.rmtree(path / MARKERS, ignore_errors=True)


def _sync(files: Iterable[Path], root: Path) -> None:
    """Flush `files` (each inside the store at `root`) and the folders that name them, up
    to `root`, to the disk (`fsync`): after a power cut they read back as written. A folder
    the system cannot flush (a file system without `fsync` on folders) is left as it is."""
    folders: set[Path] = set()
    for file in files:
        _fsync(file)
        folders.update(p for p in file.parents if p == root or root in p.parents)
    for folder in sorted(folders, key=lambda p: -len(p.parts)):  # the deepest first
        _fsync(folder)


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL: a folder on a file system that cannot flush one
        pass
    finally:
        os.close(fd)


# --- A store that several runs fill (the patched `pm.sample`: the log-likelihood, the
# posterior) and the rest of an InferenceData: each run writes a store of its own under
# `PARTS`, whose groups are then moved in (renamed, never copied). --------------------------

#: The folder, inside such a store, of the runs' own stores until they are moved in.
PARTS = "_chunkpost_parts"


def part_path(path: Any, group: str) -> Path:
    """Where the run that writes `group` of the store at `path` writes its own store."""
    return Path(os.fspath(path)) / PARTS / group


def begin(path: Path) -> None:
    """The root of a store that several runs fill, described as incomplete (a run killed
    before `complete` never reads back as complete)."""
    root = _zarr().open_group(str(path), mode="a")
    root.attrs[ATTRIBUTE] = {"format": FORMAT, "complete": False, "outputs": []}


def adopt(path: Path, part: Path) -> None:
    """Move every group of the complete store `part` into the store at `path` (a rename on
    one disk), and its outputs into `path`'s description."""
    described = _read_description(part)
    if described is None or not described.get("complete"):
        raise RuntimeError(f"{str(part)!r} is not a complete store of ours.")
    for group in dict.fromkeys(o["group"] for o in described["outputs"]):
        os.replace(part / group, path / group)
    root = _zarr().open_group(str(path), mode="r+")
    mine = dict(root.attrs[ATTRIBUTE])
    root.attrs[ATTRIBUTE] = mine | {"outputs": mine["outputs"] + described["outputs"]}
    shutil.rmtree(part)


def write_dataset(path: Path, group: str, dataset: Any) -> None:
    """An in-memory `Dataset` as the store's `group`, written by xarray (its encoding)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="zarr")
        dataset.to_zarr(str(path), group=group, mode="w-", zarr_format=3, consolidated=False)


def add_coords(path: Path, group: str, coords: Mapping[str, Any]) -> None:
    """The index coordinates `coords` (dim name to values) that the store's `group` lacks."""
    sizes = {dim: len(values) for dim, values in coords.items()}
    _write_group_coords(_zarr().open_group(str(path), mode="r+")[group], sizes, coords)


def set_attrs(path: Path, group: str, attrs: Mapping[str, Any]) -> None:
    """The attributes of the store's `group`, as xarray reads a `Dataset`'s."""
    plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in attrs.items()}
    _zarr().open_group(str(path), mode="r+")[group].attrs.update(plain)


def open_group(path: Any, group: str) -> Any:
    """The store's `group` as an xarray `Dataset`, read lazily (no dask: each variable is
    read where it is indexed)."""
    import xarray

    return xarray.open_dataset(
        os.fspath(path), group=group, engine="zarr", chunks=None, consolidated=True
    )


@dataclasses.dataclass(frozen=True)
class StoredOutputs:
    """A store of outputs on disk, reopened by `open_outputs`.

    Attributes:
        path: the store's folder.
        complete: True once every chunk and every output was written whole; a run killed
            half-way never reads back as complete.
        arrays: every output's Zarr array (read lazily, slice by slice), keyed by
            `"group/name"`.
        items_written: for an incomplete store, the draws written whole (items of the
            sample dims, flat: what `resume=True` keeps); all of them for a complete one.
        n_items: the draws: the product of the sample dims (`chains * draws`; numpyro's
            `num_samples` with one sample dim).
    """

    path: Path
    complete: bool
    arrays: dict[str, Any]
    items_written: int
    n_items: int

    def __getitem__(self, key: str) -> Any:
        return self.arrays[key]


def open_outputs(path: str | os.PathLike, *, require_complete: bool = False) -> StoredOutputs:
    """Reopen a store of outputs written with `output_memory="disk"`, and say whether it is
    complete. Nothing is read but the metadata (and the markers of an incomplete store).

    For the store as a DataTree, `xarray.open_datatree(path, engine="zarr")` opens it lazily.

    Args:
        path: the store's folder (the `output_path` it was written with).
        require_complete: raise, rather than report, an incomplete store.

    Returns:
        The store's arrays and whether it is complete (`StoredOutputs.complete`).

    Raises:
        ValueError: `path` holds no store of ours, or, with `require_complete`, one that a
            run did not finish (pass `resume=True` to the call that wrote it to finish it).
        MissingExtraError: zarr is not installed (`pip install "pymc-chunkpost[disk]"`).
    """
    path = Path(os.fspath(path))
    described = _read_description(path) if path.is_dir() else None
    if described is None:
        raise ValueError(f"{str(path)!r} holds no outputs written by pymc_chunkpost.")
    outputs = _outputs_of(described)
    complete = bool(described.get("complete"))
    n_items = outputs[0].n_items if outputs else 0
    if complete:
        written = n_items
    else:
        covered = np.zeros(n_items, bool)
        for a, b in _read_markers(path / MARKERS):
            covered[a:b] = True
        written = int(covered.sum())
    if require_complete and not complete:
        raise ValueError(
            f"The store at {str(path)!r} is incomplete ({written} of {n_items} draws written "
            "whole): the run that wrote it did not finish. Run the same call with "
            "`resume=True` to finish it."
        )
    arrays = dict(zip([f"{o.group}/{o.name}" for o in outputs], stored_arrays(path, outputs)))
    return StoredOutputs(path, complete, arrays, written, n_items)
