"""pytensor -> JAX, shared by the pymc routes.

Two guarantees that pytensor's own JAX conversion does not give:

- **Every node keeps pytensor's declared dtype.** pytensor turns each 0-d constant into a
  Python scalar, which JAX types weakly: a weak float64 that meets a float32 value becomes
  float32 (in `LKJCholeskyCov`'s `sd_dist` log-density, a `Switch` between a computed float64
  and a float32 `-inf` is computed in float32). Here 0-d constants are numpy scalars of their
  declared dtype (strongly typed, and still concrete where JAX needs a static value), and
  each node's outputs are cast to their declared dtype where JAX gave another one or a weak
  type. Graphs nested inside an Op (a `Scan`'s body, a `Composite`) are converted by pytensor;
  their outputs are cast like any other node's.
- **Random variables are drawn by our samplers** (`_samplers.SAMPLERS`), from keys passed in
  as inputs: every random variable becomes a `_Draw` node, an Op of ours with its own JAX
  conversion. pytensor's global dispatch is not changed: other graphs keep pytensor's
  samplers.

Where the installed pytensor cannot convert a special function that pytensor 3 converts
(`_compat.special_conversions`: erfcx and erfcinv on pytensor 2.38 without
tensorflow-probability), pytensor 3's conversion is used while `funcify` converts a graph,
nested graphs included; pytensor's dispatch is as it was after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.op import Op

from .._support.compat import special_conversions, split_key_at, splits_key_at
from .samplers import sampler_for

__all__ = ["jax_graph", "jaxify", "funcify", "random_function", "RandomFunction"]


# --- strict conversion --------------------------------------------------------------------


@functools.cache
def _dispatch() -> Any:
    """pytensor's JAX dispatch module, imported on first use, with `_Draw`'s conversion
    registered: importing it imports numpyro where that is installed, which
    `import pymc_chunkpost` must not."""
    from pytensor.link.jax import dispatch

    dispatch.jax_funcify.register(_Draw)(_jax_draw)
    return dispatch


def _typify(data: Any, variable: Any = None, **kwargs: Any) -> Any:
    """A constant's value for the JAX function: arrays stay numpy, of their declared dtype.

    numpy values are constants of the traced program (pytensor's `jnp.array` would compile
    one small program per new shape and dtype on jax 0.12), and a 0-d one is a numpy scalar,
    which JAX types strongly, where pytensor's Python scalar is typed weakly.
    """
    dtype = getattr(getattr(variable, "type", None), "dtype", None)
    if isinstance(data, np.ndarray):
        if dtype is None:
            return data
        return np.dtype(dtype).type(data) if data.ndim == 0 else np.asarray(data, dtype=dtype)
    return _dispatch().jax_typify(data)


def _as_declared(value: Any, dtype: str | None) -> Any:
    """`value` with the declared `dtype`, strongly typed; what has no dtype as it is."""
    if dtype is None:
        return value
    if isinstance(value, bool | int | float | complex):  # a Python scalar: weakly typed
        return np.dtype(dtype).type(value)
    if isinstance(value, np.ndarray | np.generic):
        return value if value.dtype == dtype else np.asarray(value, dtype=dtype)
    if isinstance(value, jax.Array) and (value.dtype != dtype or value.weak_type):
        return jax.numpy.asarray(value, dtype=dtype)
    return value


def _strict_conversion(op: Any, node: Apply, **kwargs: Any) -> Callable:
    """pytensor's JAX function for `node`, its outputs cast to their declared dtypes."""
    function = _counted(op, node) or _dispatch().jax_funcify(op, node=node, **kwargs)
    if _reads_by_index(op):
        function = _bounds_checked(function)
    if _updates_in_place(op):  # `x.at[...]`: the array updated must be a JAX array
        update = function

        def function(x, *args):
            return update(jax.numpy.asarray(x) if isinstance(x, np.ndarray) else x, *args)

    dtypes = [getattr(output.type, "dtype", None) for output in node.outputs]
    if len(dtypes) == 1:
        (dtype,) = dtypes

        def single(*args):
            return _as_declared(function(*args), dtype)

        return single

    def several(*args):
        return tuple(_as_declared(x, d) for x, d in zip(function(*args), dtypes, strict=True))

    return several


def _counted(op: Any, node: Apply) -> Callable | None:
    """pytensor's `all` and `any` (a logical and/or reduction of booleans) as a count of the
    values that decide it, where `node` is one; else None.

    Same values, and XLA folds a count whose values it can prove (pymc's check `mu >= 0` of
    `mu = exp(...)`) in one step. A logical reduction it folds value by value in its HLO
    evaluator: 16 s on jax 0.10 and 0.9 s on jax 0.12 for a check over 4000 draws x 3000
    observations (docs/decisions.md has the reproducer). On integers pytensor's and/or are
    bitwise: those keep pytensor's conversion.
    """
    from pytensor.scalar import AND, OR
    from pytensor.tensor.elemwise import CAReduce

    if not isinstance(op, CAReduce) or not isinstance(op.scalar_op, AND | OR):
        return None
    if getattr(node.inputs[0].type, "dtype", None) != "bool":
        return None
    every, axis = isinstance(op.scalar_op, AND), op.axis

    def counted(x):
        x = jax.numpy.asarray(x)
        reduced = math.prod(x.shape[a] for a in (range(x.ndim) if axis is None else axis))
        if reduced >= 2**31:  # a count that int32 cannot hold: the reduction as it is
            return (jax.numpy.all if every else jax.numpy.any)(x, axis=axis)
        decides = jax.numpy.logical_not(x) if every else x
        count = jax.numpy.sum(decides, axis=axis, dtype=np.int32)
        return count == 0 if every else count != 0

    return counted


def _reads_by_index(op: Any) -> bool:
    from pytensor.tensor import subtensor

    names = ("Subtensor", "AdvancedSubtensor", "AdvancedSubtensor1")  # 1: pytensor 2
    return isinstance(op, tuple(getattr(subtensor, n) for n in names if hasattr(subtensor, n)))


def _bounds_checked(read: Callable) -> Callable:
    """pytensor's `x[indices]` for JAX, raising numpy's `IndexError` for a constant index
    out of range, as pymc's own backends raise it (pymc 5's C backend), where JAX would clamp
    it into range and give another element's value.

    Constant indices are numpy values while the graph traces (`_typify`): the same function
    indexes a zero-strided array of `x`'s shape with them, in numpy, once per trace. An
    index computed in the graph (a tracer) is not checked (JAX clamps it).
    """

    def concrete(index: Any) -> bool:
        if isinstance(index, slice):
            return all(concrete(i) for i in (index.start, index.stop, index.step))
        return not isinstance(index, jax.Array)

    def checked(x, *indices):
        if indices and all(concrete(i) for i in indices):
            read(np.broadcast_to(np.zeros((), np.int8), np.shape(x)), *indices)
        return read(x, *indices)

    return checked


def _updates_in_place(op: Any) -> bool:
    from pytensor.tensor import subtensor

    names = ("IncSubtensor", "AdvancedIncSubtensor", "AdvancedIncSubtensor1")  # 1: pytensor 2
    return isinstance(op, tuple(getattr(subtensor, n) for n in names if hasattr(subtensor, n)))


def funcify(fgraph: FunctionGraph) -> Callable:
    """`fgraph` as a Python function of JAX arrays, every node in its declared dtype."""
    from pytensor.link.utils import fgraph_to_python

    with _special_conversions():
        return fgraph_to_python(
            fgraph, _strict_conversion, type_conversion_fn=_typify, fgraph_name="jax_graph"
        )


_registry_lock = threading.RLock()  # held while pytensor's dispatch holds our conversions


@contextlib.contextmanager
def _special_conversions() -> Any:
    """For the body, which converts (every conversion is looked up as the function is built,
    none as it runs): each op of `_compat.special_conversions` converted by pytensor's own
    conversion, or where that fails (tensorflow-probability missing or broken) by pytensor
    3's; pytensor's own registered again after."""
    conversions = special_conversions()
    if not conversions:
        yield
        return
    jax_funcify = _dispatch().jax_funcify
    with _registry_lock:
        own = {op: jax_funcify.dispatch(op) for op in conversions}
        for op, conversion in conversions.items():
            jax_funcify.register(op, _first_that_converts(own[op], conversion))
        try:
            yield
        finally:
            for op, conversion in own.items():
                jax_funcify.register(op, conversion)


def _first_that_converts(own: Callable, fallback: Callable) -> Callable:
    def conversion(op: Any, **kwargs: Any) -> Any:
        try:
            return own(op, **kwargs)
        except Exception:  # noqa: BLE001  # pytensor's needs tensorflow-probability
            return fallback(op, **kwargs)

    return conversion


def jax_graph(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> FunctionGraph:
    """The graph from `inputs` to `outputs` as pymc's `get_jaxified_graph` converts it: shared
    variables as constants, after pytensor's JAX rewrites."""
    from pymc.sampling.jax import _replace_shared_variables
    from pytensor.compile import mode

    fgraph = FunctionGraph(
        inputs=list(inputs), outputs=_replace_shared_variables(list(outputs)), clone=True
    )
    mode.JAX.optimizer.rewrite(fgraph)
    return fgraph


def jaxify(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> Callable:
    """A deterministic graph from `inputs` to `outputs` as a JAX function, every node in its
    declared dtype (`pymc.sampling.jax.get_jaxified_graph`, converted strictly)."""
    return funcify(jax_graph(inputs, outputs))


# --- random graphs ------------------------------------------------------------------------


class _Draw(Op):
    """A random variable drawn by our sampler: `(key, size, *params) -> (next key, value)`.

    The inputs and output types are the random variable's own (the key flows where pytensor's
    generator flowed), so a `_Draw` replaces an RV node in place, inside a `Scan` body too.
    At run time the "generator" is a typed JAX key. Where the next key is used (`next_key`:
    a generator threaded through a Scan or on to another draw), the key is split into the
    next key and the sampling key; elsewhere the value is drawn from the key itself (one
    hash less per random variable, for XLA to compile and run).
    """

    __props__ = ("rv_op", "next_key")

    def __init__(self, rv_op: Any, next_key: bool = True):
        self.rv_op = rv_op
        self.next_key = bool(next_key)

    def make_node(self, *inputs):  # (rng, size, *params), as the random variable's
        rv_node = self.rv_op.make_node(*inputs)
        return Apply(self, list(rv_node.inputs), [o.type() for o in rv_node.outputs])

    def infer_shape(self, *args):  # (fgraph, node, shapes) on pytensor 2, (node, shapes) on 3
        return self.rv_op.infer_shape(*args)

    def perform(self, node, inputs, outputs):
        raise NotImplementedError("`_Draw` runs in JAX only (pymc_chunkpost's random graphs).")


def _jax_draw(op: _Draw, node: Apply, **kwargs: Any) -> Callable:
    sample = sampler_for(op.rv_op)
    assert sample is not None  # `_unsupported` refused the graph otherwise
    value = node.outputs[1]
    batch_ndim = value.type.ndim - op.rv_op.ndim_supp
    static = tuple(value.type.shape[:batch_ndim])
    ndims_params = list(op.rv_op.ndims_params)
    dtype = np.dtype(value.type.dtype)
    split = op.next_key

    def draw(key, size, *params):
        batch = static if None not in static else _batch_shape(size, params, ndims_params)
        next_key, key = _split(key) if split else (key, key)
        return next_key, sample(key, batch, dtype, *params)

    return draw


def _split(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`jax.random.split(key)`, each key hashed unrolled where `_compat` can (a `Scan` splits
    at every step: no loop inside its body to compile)."""
    if str(jax.random.key_impl(key)) != "threefry2x32" or not splits_key_at():
        first, second = jax.random.split(key)
        return first, second
    data = jax.random.key_data(key)
    first, second = (
        jax.random.wrap_key_data(split_key_at(data, i), impl="threefry2x32") for i in (0, 1)
    )
    return first, second


def _batch_shape(size: Any, params: Sequence[Any], ndims_params: Sequence[int]) -> tuple:
    """The batch shape from a concrete `size`, else from the parameters' batch dims.

    Raises:
        jax.errors.ConcretizationTypeError: `size` is computed at run time (caught at
            build time, where it means "no static size", a reason to fall back).
    """
    if size is not None:
        return tuple(int(s) for s in np.asarray(size).reshape(-1))
    shapes = [np.shape(p)[: np.ndim(p) - n] for p, n in zip(params, ndims_params)]
    return tuple(np.broadcast_shapes(*shapes)) if shapes else ()


@dataclasses.dataclass(frozen=True)
class RandomFunction:
    """A per-draw JAX function `fn(keys, *inputs) -> outputs` of a random graph.

    `keys` is an array of `n_generators` typed JAX keys, one per random generator of the
    graph (in the order of the graph's traversal), each generator's own stream.
    """

    fn: Callable
    n_generators: int


def random_function(
    inputs: Sequence[Variable],
    outputs: Sequence[Variable],
    shapes: Sequence[tuple[int, ...]],
    *,
    rewrite: Callable[[FunctionGraph], None] | None = None,
) -> RandomFunction | str:
    """The forward graph from `inputs` (given per-draw `shapes`) to `outputs`, for JAX.

    Shared data become constants at their current values, random generators become key
    inputs, symbolic random variables are inlined, and every random variable is drawn by our
    samplers. `rewrite` (default: pytensor's JAX rewrites) then runs on the graph.

    Returns:
        The function, or a one-line reason why it cannot be built (a random variable that
        our samplers do not know, an Op with no JAX implementation), found before any work.
    """
    from pytensor.compile import mode
    from pytensor.graph.replace import clone_replace
    from pytensor.tensor.type import TensorType

    roots = [
        TensorType(v.type.dtype, shape=tuple(shape))(name=v.name)
        for v, shape in zip(inputs, shapes, strict=True)
    ]
    cloned = clone_replace(list(outputs), replace=dict(zip(inputs, roots)))
    fgraph = _with_roots(roots, cloned)
    _inline_symbolic(fgraph)
    generators, replacements = _free_roots(fgraph.outputs)
    fgraph = _with_roots(generators + roots, clone_replace(fgraph.outputs, replace=replacements))
    if missing := fgraph.inputs[len(generators) + len(roots) :]:
        return f"the graph needs {[v.name for v in missing]}, which are neither given nor drawn"
    if (reason := _unsupported(fgraph)) is not None:
        return reason
    _replace_random_variables(fgraph)
    (mode.JAX.optimizer.rewrite if rewrite is None else rewrite)(fgraph)
    if _has_random(fgraph):  # every draw is ours, or pytensor's sampler would run
        return "a random variable was left to pytensor's sampler"
    try:
        function = funcify(fgraph)
    except NotImplementedError as error:  # an Op with no JAX implementation
        return f"no JAX implementation: {str(error).splitlines()[0]}"
    return RandomFunction(_keyed(function, len(generators)), len(generators))


def _with_roots(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> FunctionGraph:
    """A graph with `inputs` first, then every other non-constant root it has."""
    known = set(inputs)
    others = [v for v in _root_inputs(outputs) if v not in known and not isinstance(v, Constant)]
    return FunctionGraph([*inputs, *others], list(outputs), clone=False)


def _keyed(function: Callable, n_generators: int) -> Callable:
    def per_draw(keys, *values):
        return list(function(*(keys[i] for i in range(n_generators)), *values))

    return per_draw


def _root_inputs(outputs: Sequence[Variable]) -> list[Variable]:
    from pytensor.graph.traversal import graph_inputs

    return [v for v in graph_inputs(list(outputs)) if v.owner is None]


def _free_roots(outputs: Sequence[Variable]) -> tuple[list[Variable], dict]:
    """New graph inputs for the random generators, and constants for the shared data.

    Returns the generator inputs, in the order of the graph's traversal (so that generator
    `i` always gets the same key), and the replacements of the shared variables.
    """
    import pytensor.tensor as pt
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.tensor.random.type import RandomType

    generators: list[Variable] = []
    replacements: dict[Variable, Variable] = {}
    for variable in _root_inputs(outputs):
        if isinstance(variable.type, RandomType) and not isinstance(variable, Constant):
            generators.append(variable.type(name=variable.name))
            replacements[variable] = generators[-1]
        elif isinstance(variable, SharedVariable):
            value = variable.get_value(borrow=True)
            replacements[variable] = pt.constant(value, dtype=variable.type.dtype)
    return generators, replacements


def _inline_symbolic(fgraph: FunctionGraph) -> None:
    """Replace every symbolic random variable (pymc's `SymbolicRandomVariable`) by its graph."""
    from pymc.distributions.distribution import SymbolicRandomVariable

    while nodes := [n for n in fgraph.toposort() if isinstance(n.op, SymbolicRandomVariable)]:
        for node in nodes:
            fgraph.replace_all(
                list(zip(node.outputs, _bind(node.op, node.inputs))), import_missing=True
            )


def _bind(op: Any, inputs: Sequence[Variable]) -> list[Variable]:
    """The inner graph of `op` (an `OpFromGraph`), applied to `inputs`."""
    if hasattr(op.fgraph, "bind"):  # pytensor 3: frozen inner graphs
        return list(op.fgraph.bind(list(inputs)))
    from pytensor.graph.replace import clone_replace

    return list(clone_replace(op.inner_outputs, replace=dict(zip(op.inner_inputs, inputs))))


def _unsupported(fgraph: FunctionGraph) -> str | None:
    """Why a random variable of `fgraph` (or of a `Scan` body) cannot be drawn; None if all can."""
    from pytensor.scan.op import Scan
    from pytensor.tensor.random.op import RandomVariable

    for node in fgraph.toposort():
        if isinstance(node.op, RandomVariable) and sampler_for(node.op) is None:
            name = node.outputs[1].name or "a random variable"
            return f"no JAX sampler for `{name}` ({type(node.op).__name__})"
        if isinstance(node.op, Scan):
            reason = _unsupported(_mutable_inner(node.op))
            if reason is not None:
                return f"{reason}, inside a Scan"
    return None


def _mutable_inner(op: Any) -> FunctionGraph:
    """A mutable copy of `op`'s inner graph (frozen on pytensor 3)."""
    fgraph = op.fgraph
    return fgraph.unfreeze() if hasattr(fgraph, "unfreeze") else fgraph.clone()


def _replace_random_variables(fgraph: FunctionGraph) -> None:
    """Every random variable becomes a `_Draw`, in `Scan` bodies too (the Scan is rebuilt).

    One node at a time, in order: a draw that takes the generator another one returned
    must be built on that one's replacement.
    """
    from pytensor.scan.op import Scan
    from pytensor.tensor.random.op import RandomVariable

    for node in list(fgraph.toposort()):
        if isinstance(node.op, RandomVariable):
            next_key = bool(fgraph.clients[node.outputs[0]])
            new = _Draw(node.op, next_key).make_node(*node.inputs)
        elif isinstance(node.op, Scan) and _has_random(node.op, draws=True):
            new = _scan_with_draws(node.op).make_node(*node.inputs)
        else:
            continue
        fgraph.replace_all(list(zip(node.outputs, new.outputs)), import_missing=True)


def _has_random(graph: Any, draws: bool = False) -> bool:
    """Whether `graph` (a FunctionGraph, or an Op with an inner one) has a pytensor random
    variable (or, with `draws`, a `_Draw`), in Scan bodies too."""
    from pytensor.scan.op import Scan
    from pytensor.tensor.random.op import RandomVariable

    kinds = (RandomVariable, _Draw) if draws else (RandomVariable,)
    nodes = getattr(graph, "fgraph", graph).apply_nodes
    return any(isinstance(n.op, kinds) for n in nodes) or any(
        isinstance(n.op, Scan) and _has_random(n.op, draws) for n in nodes
    )


def _scan_with_draws(op: Any) -> Any:
    """`op`, a Scan, rebuilt with every random variable of its body a `_Draw`."""
    from pytensor.scan.op import Scan

    inner = _mutable_inner(op)
    _replace_random_variables(inner)
    return Scan(
        list(inner.inputs),
        list(inner.outputs),
        op.info,
        mode=op.mode,
        truncate_gradient=op.truncate_gradient,
        name=op.name,
        profile=op.profile,
        allow_gc=op.allow_gc,
        strict=op.strict,
    )
