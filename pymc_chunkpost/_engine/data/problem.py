"""What one post-processing call is: shapes, outputs, the data it reads, where the draws are.

`analyse` traces the per-draw function once per function and shapes (cached weakly on the
function). `locate` reads where the draws live: one device, or a mesh on the chain/draw axes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import Mesh, NamedSharding, PartitionSpec, make_single_device_sharding

from ..._support.cache import FunctionCache
from ..._support.compat import CALLS, LAPACK_PRIMITIVES

__all__ = ["Problem", "Placement", "analyse", "locate", "is_out_of_memory", "nbytes"]


def is_out_of_memory(error: Exception) -> bool:
    """Whether an XLA error is the device running out of memory.

    At run time XLA raises RESOURCE_EXHAUSTED. On a GPU it can also fail while *compiling*:
    its autotuner runs candidate kernels on buffers of the real sizes, and when none can be
    allocated it raises "NOT_FOUND: All configs failed during profiling", listing the
    RESOURCE_EXHAUSTED failures (docs/memory.md).
    """
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def nbytes(spec: jax.ShapeDtypeStruct) -> int:
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the draws are, and so where the work runs.

    Attributes:
        device: the first device (its platform and memory statistics stand for all).
        mesh: the mesh the draws are split over, or None for one device.
        spec: the mesh axes of the chain and draw axes, e.g. `("chain", None)`; the trailing
            axes of every array are whole on each device.
        reason: how the placement came about, for the `Plan`.
    """

    device: jax.Device
    mesh: Mesh | None = None
    spec: tuple[str | tuple[str, ...] | None, ...] = (None, None)
    reason: str = "one device"

    @property
    def sharding(self) -> jax.sharding.Sharding:
        if self.mesh is None:
            return make_single_device_sharding(self.device)
        return NamedSharding(self.mesh, PartitionSpec(*self.spec))

    def splits(self) -> tuple[int, int]:
        """How many pieces the chain and draw axes are cut into."""
        if self.mesh is None:
            return 1, 1
        sizes = dict(zip(self.mesh.axis_names, self.mesh.devices.shape))
        out = []
        for entry in self.spec[:2]:
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            out.append(int(np.prod([sizes[a] for a in names], dtype=np.int64)))
        return out[0], out[1]

    @property
    def n_shards(self) -> int:
        a, b = self.splits()
        return a * b

    @property
    def n_devices(self) -> int:
        return 1 if self.mesh is None else self.mesh.devices.size

    @property
    def local_devices(self) -> list[jax.Device]:
        """The devices of the mesh that this process drives (all, but under `jax.distributed`)."""
        if self.mesh is None:
            return [self.device]
        return [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]


@dataclasses.dataclass(frozen=True)
class Problem:
    """The shapes of one post-processing call: what the planner and the caches key on.

    Its sums over the inputs and outputs are computed once per instance (a model may have
    hundreds of variables, and the planner reads them many times).

    Attributes:
        in_specs: the raw samples' global shapes and dtypes, `(chains, draws, ...)` each.
        placement: where the draws are and the work runs.
        out_specs: every output's global shape and dtype.
        forwarded: for each output, the index of the input it merely passes through (an
            untransformed variable), or None. Such outputs are the input arrays themselves.
        intermediate_bytes: per draw, a first bound on the temporaries, read from the jaxpr
            (results of dots, decompositions, gathers, ...). Compiled numbers overrule it.
        shared_bytes: bytes of the constants that every draw reads (the model's data).
        fingerprint: a stable text key of the per-draw function (its jaxpr), for the
            on-disk tuning cache.
        jaxpr: the per-draw function as traced once here. The executor compiles from it,
            so a Python-heavy function (a jaxified pytensor graph) is traced only once.
        gathered_bytes: per draw, the bytes of the results of gathers and scatters of the
            draw's values (`a[idx]`, row-indexed group effects); 0 where there are none.
        one_draw_programs: the function, mapped, computes one draw at a time (a loop of
            programs of one draw, as numpyro's route does for numpyro's numbers), which XLA
            runs on one thread (`_resources.lanes_for`).
        random: the function draws random numbers (the predictive route): its work is
            hashing keys into bits and writing draws, elementwise, which XLA's CPU runtime
            spreads over the cores in a straight-line program and not inside its loop
            (`_sizing.loop_for`).
        shareable: the printed jaxpr (`fingerprint`) says all the program computes, so that
            another function printing the same may run its executable (`_executor`): no
            callable parameter but a custom derivative's rules (which the forward program
            never runs; a callback's or a custom batching rule's may close over data), no
            nested jaxpr with constants of its own (printed as types only), no constant
            printed elided.
        calls_lapack: the per-draw jaxpr applies a LAPACK kernel (`_compat.LAPACK_PRIMITIVES`),
            read once per trace (`_resources.shard_by_shard`, `lanes_for`).
    """

    in_specs: tuple[jax.ShapeDtypeStruct, ...]
    placement: Placement
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    forwarded: tuple[int | None, ...]
    intermediate_bytes: int = 0
    shared_bytes: int = 0
    fingerprint: str = dataclasses.field(default="", compare=False, repr=False)
    jaxpr: Any = dataclasses.field(default=None, compare=False, repr=False)
    gathered_bytes: int = dataclasses.field(default=0, compare=False)
    one_draw_programs: bool = False
    random: bool = False
    calls_lapack: bool = dataclasses.field(default=False, compare=False)
    shareable: bool = dataclasses.field(default=False, compare=False)

    @property
    def device(self) -> jax.Device:
        return self.placement.device

    @property
    def chains(self) -> int:
        return self.in_specs[0].shape[0]

    @property
    def draws(self) -> int:
        return self.in_specs[0].shape[1]

    @property
    def n_items(self) -> int:
        """Draws in all (chains x draws)."""
        return self.chains * self.draws

    @property
    def local_shape(self) -> tuple[int, int]:
        """(chains, draws) of one shard."""
        a, b = self.placement.splits()
        return self.chains // a, self.draws // b

    @property
    def n_local(self) -> int:
        """Draws per shard: what one device's loop runs over."""
        chains, draws = self.local_shape
        return chains * draws

    @property
    def n_shards(self) -> int:
        return self.placement.n_shards

    @functools.cached_property
    def n_local_shards(self) -> int:
        """Shards on this process's devices: all of them, but under `jax.distributed`."""
        placement = self.placement
        if placement.mesh is None:
            return 1
        shape = self.in_specs[0].shape
        index = placement.sharding.addressable_devices_indices_map(shape)
        return len({tuple(s.indices(n) for s, n in zip(i or (), shape)) for i in index.values()})

    @property
    def memory_sharing(self) -> int:
        """Shards whose work goes through one memory system: on a CPU, every local shard
        (its devices share one RAM); on an accelerator, one (each device has its own)."""
        return self.n_local_shards if self.device.platform == "cpu" else 1

    @functools.cached_property
    def input_bytes(self) -> int:
        return sum(nbytes(s) for s in self.in_specs)

    @functools.cached_property
    def output_bytes(self) -> int:
        """Bytes of the outputs that must be newly allocated (not passed-through inputs)."""
        return sum(nbytes(s) for s, k in zip(self.out_specs, self.forwarded) if k is None)

    @functools.cached_property
    def computed(self) -> tuple[int, ...]:
        """Indices of the outputs that are computed (not passed through)."""
        return tuple(j for j, k in enumerate(self.forwarded) if k is None)

    @property
    def n_buffers(self) -> int:
        """Arrays a loop body slices or updates: the inputs and the computed outputs."""
        return len(self.in_specs) + len(self.computed)

    @functools.cached_property
    def per_item_bytes(self) -> int:
        """Input plus computed-output bytes of one draw."""
        return (self.input_bytes + self.output_bytes) // max(self.n_items, 1)

    @property
    def consts(self) -> tuple[Any, ...]:
        """The per-draw function's constants (the model's data): every compiled step takes
        them as arguments, so that new values of the same shapes compile nothing."""
        return () if self.jaxpr is None else tuple(self.jaxpr.consts)

    def every_const(self) -> tuple[Any, ...]:
        """`consts`, then the constants of the closed jaxprs nested in it (a nested `jit`'s
        own, which its printed form shows as types only)."""
        if self.jaxpr is None:
            return ()
        return (*self.consts, *_nested_consts(self.jaxpr.jaxpr))

    @functools.cached_property
    def program_digest(self) -> str:
        """A digest of `fingerprint`: the per-draw program, its constants by shape."""
        return hashlib.sha256(self.fingerprint.encode()).hexdigest()

    def with_placement(self, placement: Placement) -> Problem:
        return dataclasses.replace(self, placement=placement)


_ANALYSES = FunctionCache(per_function=8)
#: What a trace of one draw gives, keyed on one draw's shapes (and JAX's `settings`): the
#: same for any number of chains and draws, and on any device (the shards of one call).
_TRACES = FunctionCache(per_function=8)


@dataclasses.dataclass(frozen=True)
class _Trace:
    """What one trace of a function on one draw's shapes gives (`Problem` has the fields)."""

    jaxpr: Any
    forwarded: tuple[int | None, ...]
    out_avals: tuple[Any, ...]
    intermediate_bytes: int
    shared_bytes: int
    fingerprint: str
    gathered_bytes: int
    calls_lapack: bool
    shareable: bool


def analyse(jax_fn: Callable, in_specs: Sequence[jax.ShapeDtypeStruct], placement) -> Problem:
    """Trace `jax_fn` once on one draw's shapes: output shapes and passed-through inputs.

    `placement` may be a `Placement` or a device.
    """
    if not isinstance(placement, Placement):
        placement = Placement(placement)
    in_specs = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in in_specs)
    jax_settings = settings()
    key = (in_specs, placement, jax_settings)
    cached = _ANALYSES.get(jax_fn, key)
    if cached is not None:
        return cached
    lead = in_specs[0].shape[:2]
    per_draw = tuple(jax.ShapeDtypeStruct(s.shape[2:], s.dtype) for s in in_specs)
    trace_key = (per_draw, jax_settings)
    trace = _TRACES.get(jax_fn, trace_key)
    if trace is None:
        trace = _trace(jax_fn, per_draw)
        _TRACES.put(jax_fn, trace_key, trace)
    problem = Problem(
        in_specs,
        placement,
        tuple(jax.ShapeDtypeStruct(lead + tuple(a.shape), a.dtype) for a in trace.out_avals),
        trace.forwarded,
        trace.intermediate_bytes,
        trace.shared_bytes,
        fingerprint=trace.fingerprint,
        jaxpr=trace.jaxpr,
        gathered_bytes=trace.gathered_bytes,
        calls_lapack=trace.calls_lapack,
        shareable=trace.shareable,
    )
    _ANALYSES.put(jax_fn, key, problem)
    return problem


def settings() -> tuple:
    """JAX's settings that change what a traced function computes, beside its printed jaxpr:
    its constants trace to other dtypes under the other x64 setting, its products to other
    precisions under another `jax.default_matmul_precision`, and its random bits come out
    otherwise under another PRNG implementation or `jax_threefry_partitionable`. Part of
    every trace's key and fingerprint."""
    config = jax.config  # getattr: jax 0.10's type stubs lack the attributes
    return (
        bool(jax.config.read("jax_enable_x64")),
        getattr(config, "jax_default_matmul_precision"),  # noqa: B009
        str(getattr(config, "jax_default_prng_impl")),  # noqa: B009
        bool(getattr(config, "jax_threefry_partitionable")),  # noqa: B009
    )


def _trace(jax_fn: Callable, per_draw: Sequence[jax.ShapeDtypeStruct]) -> _Trace:
    closed = jax.make_jaxpr(lambda *xs: list(jax_fn(*xs)))(*per_draw)
    position = {id(v): i for i, v in enumerate(closed.jaxpr.invars)}
    consts = ";".join(f"{np.shape(c)}{getattr(c, 'dtype', '')}" for c in closed.consts)
    fingerprint = f"{closed.jaxpr}|{consts}|{settings()}"
    return _Trace(
        jaxpr=closed,
        forwarded=tuple(position.get(id(v)) for v in closed.jaxpr.outvars),
        out_avals=tuple(closed.out_avals),
        intermediate_bytes=_intermediate_bytes(closed.jaxpr),
        shared_bytes=sum(int(getattr(c, "nbytes", 0)) for c in closed.consts),
        fingerprint=fingerprint,
        gathered_bytes=_gathered_bytes(closed.jaxpr, [True] * len(closed.jaxpr.invars)),
        calls_lapack=uses_primitives(closed.jaxpr, LAPACK_PRIMITIVES),
        shareable=_shareable(closed.jaxpr) and not any(m in fingerprint for m in _HIDDEN),
    )


#: What the jaxpr printer writes in place of what it hides: a function's address, an
#: array constant's values (jax's simplified constants).
_HIDDEN = ("0xXXXXXXXXXXXX", "[...]")
#: Primitives whose callable parameters the forward program never runs: custom derivatives.
_RULES_NOT_RUN = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


def _nested_consts(jaxpr) -> list[Any]:
    found: list[Any] = []
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for v in value if isinstance(value, tuple | list) else (value,):
                found += getattr(v, "consts", None) or []
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    found += _nested_consts(inner)
    return found


def _runs_code(value: Any) -> bool:
    """Whether a primitive's parameter is code of the user's (a callable that is neither a
    class nor a mesh, which `jit` carries as the context it traced in)."""
    if isinstance(value, type) or type(value).__name__ in ("Mesh", "AbstractMesh"):
        return False
    return callable(value)


def _shareable(jaxpr) -> bool:
    """Whether the printed `jaxpr` says all it computes (`Problem.shareable`)."""
    for eqn in jaxpr.eqns:
        for name, value in eqn.params.items():
            if name == "impl" and eqn.primitive.name.startswith("random_"):
                continue  # a PRNG implementation, printed by its name
            values = value if isinstance(value, tuple | list) else (value,)
            for v in values:
                consts = getattr(v, "consts", None)
                inner = getattr(v, "jaxpr", v)
                if consts:  # a closed jaxpr holding constants of its own
                    return False
                if hasattr(inner, "eqns"):
                    if not _shareable(inner):
                        return False
                elif _runs_code(v) and eqn.primitive.name not in _RULES_NOT_RUN:
                    return False
    return True


# Primitives whose results XLA's fusion passes generally cannot keep out of memory. A first
# bound only: XLA often fuses gathers and transposes, and the compiled analysis overrules it.
_MATERIALISING = frozenset(
    {
        "dot_general",
        "cholesky",
        "triangular_solve",
        "lu",
        "qr",
        "eigh",
        "eig",
        "svd",
        "householder_product",
        "schur",
        "gather",
        "scatter",
        "scatter-add",
        "scatter_add",
        "sort",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "cumlogsumexp",
        "fft",
        "conv_general_dilated",
        "transpose",
        "argsort",
        "top_k",
    }
)


def _aval_bytes(aval) -> int:
    # `dtype.itemsize`, not `np.dtype(...)`: extended dtypes (PRNG keys) have no NumPy dtype.
    return math.prod(aval.shape) * aval.dtype.itemsize


def _intermediate_bytes(jaxpr) -> int:
    """Bytes of materialising intermediates, nested jaxprs included."""
    outvars = {id(v) for v in jaxpr.outvars}
    total = 0
    for eqn in jaxpr.eqns:
        nested = [v for v in eqn.params.values() if hasattr(v, "jaxpr") or hasattr(v, "eqns")]
        for sub in nested:
            total += _intermediate_bytes(getattr(sub, "jaxpr", sub))
        if eqn.primitive.name in _MATERIALISING or nested:
            for v in eqn.outvars:
                if id(v) not in outvars and hasattr(v.aval, "shape"):
                    total += _aval_bytes(v.aval)
    return total


#: Products: XLA's CPU runtime computes them in library calls outside any fusion, so that
#: their results always go to memory.
_PRODUCTS = frozenset({"dot_general", "conv_general_dilated"})


def product_bytes(jaxpr, outputs: bool = True) -> int:
    """Per draw, bytes of the results of products (`_PRODUCTS`) that are not the function's
    outputs (`outputs`: `jaxpr`'s own outputs are), nested jaxprs included (once each,
    whatever their trip count; a product that a call returns as an output counts)."""
    outvars = {id(v) for v in jaxpr.outvars} if outputs else set()
    total = 0
    for eqn in jaxpr.eqns:
        total += sum(product_bytes(j, outputs=False) for j in _nested(eqn.params))
        if eqn.primitive.name in _PRODUCTS:
            total += sum(
                _aval_bytes(v.aval)
                for v in eqn.outvars
                if id(v) not in outvars and hasattr(v.aval, "shape")
            )
    return total


_GATHERS = frozenset({"gather", "dynamic_slice", "dynamic_update_slice"})


def _is_gather(name: str) -> bool:
    return name in _GATHERS or name.startswith("scatter")


def _result_bytes(eqn) -> int:
    return sum(_aval_bytes(v.aval) for v in eqn.outvars if hasattr(v.aval, "shape"))


def _gathered_bytes(jaxpr, draw_inputs: list[bool]) -> int:
    """Bytes of the results of the gathers and scatters in `jaxpr` that read the inputs
    flagged in `draw_inputs`. Jitted calls are followed argument by argument; in any other
    nested jaxpr (control flow, custom derivatives) that reads the draw, every gather counts."""
    depends = dict(zip(jaxpr.invars, draw_inputs))
    total = 0
    for eqn in jaxpr.eqns:
        flags = [not isinstance(v, Literal) and depends.get(v, False) for v in eqn.invars]
        reads_draw = any(flags)
        if eqn.primitive.name in CALLS:
            inner = eqn.params["jaxpr"]
            total += _gathered_bytes(getattr(inner, "jaxpr", inner), flags)
        elif reads_draw:
            total += sum(_all_gathered_bytes(j) for j in _nested(eqn.params))
        if reads_draw and _is_gather(eqn.primitive.name):
            total += _result_bytes(eqn)
        for v in eqn.outvars:
            depends[v] = reads_draw
    return total


def _nested(params) -> list:
    """The jaxprs among an equation's parameters (`branches` of a cond are several)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, list | tuple) else (value,):
            if hasattr(item, "eqns"):
                found.append(item)
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                found.append(item.jaxpr)
    return found


def uses_primitives(jaxpr, names: frozenset[str]) -> bool:
    """Whether `jaxpr`, nested jaxprs included, applies any primitive named in `names`."""
    return any(
        eqn.primitive.name in names or any(uses_primitives(j, names) for j in _nested(eqn.params))
        for eqn in jaxpr.eqns
    )


def _all_gathered_bytes(jaxpr) -> int:
    return sum(
        (_result_bytes(eqn) if _is_gather(eqn.primitive.name) else 0)
        + sum(_all_gathered_bytes(j) for j in _nested(eqn.params))
        for eqn in jaxpr.eqns
    )


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def locate(samples: Sequence, device: jax.Device | None) -> Placement:
    """Where the draws are: the mesh they are split over on the chain/draw axes, or a device.

    Draws that are `jax.Array`s sharded over several devices on their chain and/or draw axes
    (a `NamedSharding` whose spec leaves the trailing axes whole, the same for every array)
    stay where they are. Everything else runs on one device: `device` (from
    `postprocessing_backend`), or the draws' own device, or JAX's default device. A requested
    backend whose platform differs from the draws' moves them there.
    """
    shardings = [x.sharding for x in samples if isinstance(x, jax.Array)]
    first = shardings[0] if len(shardings) == len(samples) else None
    if isinstance(first, NamedSharding) and len(first.device_set) > 1:
        spec = _leading_spec(first)
        same = spec is not None and all(
            isinstance(s, NamedSharding) and s.mesh == first.mesh and _leading_spec(s) == spec
            for s in shardings
        )
        mesh = first.mesh
        devices = list(mesh.devices.flat) if same and isinstance(mesh, Mesh) else []
        if (
            spec is not None
            and devices
            and (device is None or device.platform == devices[0].platform)
        ):
            # Under `jax.distributed` the mesh spans every process's devices: the one that
            # stands for all (memory statistics, platform) must be one this process has.
            here = [d for d in devices if d.process_index == jax.process_index()]
            placement = Placement(
                (here or devices)[0],
                mesh if isinstance(mesh, Mesh) else None,
                spec,
                f"the draws' own sharding over {len(devices)} devices",
            )
            if placement.n_shards > 1:
                return placement
    remote = [i for i, x in enumerate(samples) if _spans_processes(x)]
    if remote:
        raise ValueError(
            f"`raw_mcmc_samples[{remote[0]}]` spans several processes (`jax.distributed`) "
            f"with sharding {samples[remote[0]].sharding}, which cannot run where it is: "
            "every array needs the same `NamedSharding` over one mesh, split on the chain "
            "and/or draw axes only, and `postprocessing_backend` must be None or the draws' "
            "platform. Nothing is moved across processes; reshard the draws that way first "
            "(e.g. `jax.make_array_from_process_local_data` with `PartitionSpec('chain')`)."
        )
    if device is not None:
        return Placement(device)
    if first is not None and len(first.device_set) == 1:
        return Placement(next(iter(first.device_set)))
    return Placement(jax.local_devices()[0])


def host_copy(x: Any) -> np.ndarray:
    """`x`'s values on the host (a random key's data), in a copy that `x` does not keep: a
    `jax.Array`'s own `np.asarray` would keep one on the array for its lifetime. Read
    shard by shard; `x`'s shards must all be in this process."""
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    host = np.empty(x.shape, x.dtype)
    for shard in x.addressable_shards:
        host[shard.index] = np.asarray(shard.data)  # `shard.data`: a new array each time
    return host


def _spans_processes(x) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _leading_spec(sharding) -> tuple | None:
    """The mesh axes of the chain and draw axes, if only those are split; else None."""
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * 2
    if any(entry is not None for entry in spec[2:]):
        return None
    return spec[:2]
