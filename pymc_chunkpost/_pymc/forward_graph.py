"""What `sample_posterior_predictive` computes, and the per-draw program that computes it.

Which variables are drawn anew and which are taken from the trace follows the installed
pymc's own rules (`resolve_v5`, `resolve_v6`), into a `Forward`: the result's variables,
the model variables the graph computes and the trace variables it takes. `build` makes that
forward graph one per-draw JAX function (`graph.random_function`: data frozen at their
current values, every random variable drawn by our samplers from keys made of the seed and
the draw), at the trace's shapes, checked as pymc checks them, and cached per model.

A trace variable whose length along a dim differs from the model's (pymc 6 keeps it after
`set_dim`) is computed with at the trace's length, as pymc does; a length fixed in the
variable's type is checked as pymc checks it.

One unit: the rules decide the graph's inputs and outputs, and the program is that graph.
The route (`predictive`) reads the arguments and the trace, runs the program over the draws
and packs the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .._support.cache import FunctionCache
from .graph import RandomFunction, random_function
from .model import cached_graph, expected_shapes
from .trace import Trace

__all__ = ["Built", "Forward", "build", "resolve_v5", "resolve_v6"]

_CACHE_PER_MODEL = 8  # forward graphs kept per model (each holds its compiled executables)
_GRAPHS = FunctionCache(per_function=_CACHE_PER_MODEL)


# --- which variables: pymc's rules --------------------------------------------------------


@dataclasses.dataclass
class Forward:
    """What one call computes, by the installed pymc's rules."""

    names: list[str]  # the result's variables, in pymc's order
    outputs: list[Any]  # the model variables the graph computes
    inputs: list[Any]  # the trace variables the graph takes (as pymc's compiled function)
    copied: list[str]  # pymc 6: variables copied from the trace
    sampled: list[str]  # the random variables drawn anew ("Sampling: [...]")


def _model_variables(model: Any, names: Any, argument: str) -> list[Any]:
    if isinstance(names, str):
        names = [names]
    if unknown := [n for n in names if n not in model.named_vars]:
        raise ValueError(
            f"`{argument}` has {unknown}, which the model does not have. Its variables: "
            f"{list(model.named_vars)}."
        )
    return [model[n] for n in names]


def resolve_v5(model: Any, pymc_args: dict[str, Any], read: Trace) -> Forward:
    """pymc 5.28: every variable in `var_names` is drawn anew, and whatever depends on a
    drawn variable, on changed `pm.Data` or on changed coords (pymc's
    `compile_forward_sampling_function`)."""
    from pymc.sampling.forward import get_constant_coords, observed_dependent_deterministics
    from pymc.util import get_default_varnames
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.tensor.random.var import RandomGeneratorSharedVariable

    var_names = pymc_args.get("var_names")
    if var_names is not None:
        chosen = _model_variables(model, var_names, "var_names")
    else:
        observed = list(model.observed_RVs)
        if read.observed_data is not None:
            observed += [model[x] for x in read.observed_data if x in model]
        chosen = observed + observed_dependent_deterministics(model, observed)
    outputs = list(dict.fromkeys(get_default_varnames(chosen, include_transformed=False)))
    if not outputs:
        return Forward([], [], [], [], [])
    in_trace = {model[n] for n in read.names if n in _traceable(model)}
    constant_coords = get_constant_coords(read.coords, model)
    basic = set(model.basic_RVs)
    volatile: set[Any] = set()
    for var in _toposort(outputs):
        if (
            var in outputs
            or (
                isinstance(var, SharedVariable)
                and not isinstance(var, RandomGeneratorSharedVariable)
                and not _shared_matches(var, read.constant_data, constant_coords)
            )
            or (var in basic and var not in in_trace)
            or (var.owner is not None and any(i in volatile for i in var.owner.inputs))
        ):
            volatile.add(var)
    inputs = _inputs(outputs, in_trace, volatile)
    sampled = sorted(v.name for v in basic & volatile)
    return Forward([v.name for v in outputs], outputs, inputs, [], sampled)


def _shared_matches(var: Any, constant_data: dict, constant_coords: set) -> bool:
    """pymc 5: whether shared `var` holds what it held at inference time."""
    if var.name not in constant_data:
        return var.name in constant_coords
    return bool(np.array_equal(constant_data[var.name], var.get_value(borrow=True)))


def _traceable(model: Any) -> set[str]:
    return {v.name for v in model.free_RVs + model.deterministics}


def _toposort(outputs: Sequence[Any]) -> list[Any]:
    from pytensor.graph.traversal import general_toposort

    return list(general_toposort(outputs, deps=lambda x: x.owner.inputs if x.owner else []))


def _inputs(outputs: Sequence[Any], in_trace: set, volatile: set) -> list[Any]:
    """The trace variables pymc's compiled function takes, that the outputs need.

    pymc's walk (`compile_forward_sampling_function`) takes every non-volatile trace variable
    it meets and every free root; of those, only the ones the outputs reach without passing
    through another are needed. A free root that is not in the trace is an error in pymc.
    """
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors, walk

    taken: list[Any] = []

    def expand(var):
        free_root = var.owner is None and not isinstance(var, Constant | SharedVariable)
        if (free_root or var in in_trace) and var not in volatile:
            taken.append(var)
        return var.owner.inputs if var.owner else None

    list(walk(list(outputs), expand))
    needed = set(ancestors(list(outputs), blockers=taken))
    return [v for v in dict.fromkeys(taken) if v in needed and v not in outputs]


def resolve_v6(model: Any, pymc_args: dict[str, Any], read: Trace) -> Forward:
    """pymc 6.4: trace variables are kept unless in `sample_vars` (with
    `ImplicitFreezeWarning` where something upstream changed); variables missing from the
    trace are drawn; `var_names` only selects the outputs."""
    from pymc.sampling import forward as pymc_forward
    from pytensor.graph.fg import FunctionGraph

    var_names, sample_vars = (
        _names(pymc_args.get("var_names")),
        _names(pymc_args.get("sample_vars")),
    )
    freeze_vars = _names(pymc_args.get("freeze_vars"))
    constant_data = pymc_forward._build_constant_data(read.constant_data, read.coords, model)
    in_trace = [model[n] for n in read.names if n in _traceable(model)]
    outputs = _outputs_v6(model, var_names, sample_vars, read)
    volatile_vars: set[Any] = set()
    if sample_vars is not None:
        allowed = set(model.basic_RVs) | set(model.deterministics)
        chosen = _model_variables(model, sample_vars, "sample_vars")
        if invalid := [v.name for v in chosen if v not in allowed]:
            raise ValueError(
                f"sample_vars {sorted(invalid)} are not random variables or "
                f"deterministics; only those can have trace values to override."
            )
        volatile_vars = set(chosen)
    rv_set, in_trace_set = set(model.basic_RVs), set(in_trace)
    frozen = _frozen_v6(model, freeze_vars, sample_vars, in_trace)
    auto_frozen = [
        rv
        for rv in in_trace
        if rv in rv_set and rv.name not in set(sample_vars or ()) and rv not in frozen
    ]
    frozen.update(auto_frozen)
    closure = pymc_forward._compute_volatile_vars(
        FunctionGraph(outputs=list(outputs) + auto_frozen, clone=False),
        vars_in_trace=in_trace_set,
        rvs=rv_set,
        constant_data=constant_data,
        volatile_vars=volatile_vars,
        freeze_vars=frozen,
    )
    outputs = list(dict.fromkeys(outputs))
    if not outputs:
        return Forward([], [], [], [], [])
    compiled = [v for v in outputs if not (v in in_trace_set and v not in closure)]
    pymc_forward._maybe_warn_implicit_freeze(
        auto_frozen=auto_frozen,
        volatile_closure=closure,
        volatile_vars=volatile_vars,
        rv_set=rv_set,
        vars_in_trace_set=in_trace_set,
        constant_data=constant_data,
        model=model,
        trace_coords=read.coords,
    )
    return _evaluated_v6(
        model, outputs, compiled, in_trace_set, constant_data, volatile_vars, frozen
    )


def _names(names: Any) -> list[str] | None:
    return [names] if isinstance(names, str) else (None if names is None else list(names))


def _outputs_v6(model: Any, var_names: Any, sample_vars: Any, read: Trace) -> list[Any]:
    """pymc 6.4's outputs: `var_names`, else `sample_vars`, else the observed variables and
    the deterministics that depend on them."""
    from pymc.sampling.forward import observed_dependent_deterministics

    if var_names is not None:
        return _model_variables(model, var_names, "var_names")
    if sample_vars is not None:
        return _model_variables(model, sample_vars, "sample_vars")
    extra: list[Any] = []
    outputs = list(model.observed_RVs)
    if read.observed_data is not None:
        for name in read.observed_data:
            if name in model and model[name] not in outputs:
                outputs.append(model[name])
                extra.append(model[name])
    known = set(outputs)
    outputs += [d for d in observed_dependent_deterministics(model, extra) if d not in known]
    return outputs


def _frozen_v6(model: Any, freeze_vars: Any, sample_vars: Any, in_trace: list) -> set[Any]:
    if freeze_vars is None:
        return set()
    frozen = set(_model_variables(model, freeze_vars, "freeze_vars"))
    if missing := {x for x in freeze_vars if x not in {v.name for v in in_trace}}:
        raise ValueError(
            f"freeze_vars {sorted(missing)} are not present in the trace. "
            f"Cannot freeze variables without stored values."
        )
    if sample_vars is not None and (overlap := (set(freeze_vars) & set(sample_vars))):
        raise ValueError(
            f"Variables {sorted(overlap)} are in both sample_vars and freeze_vars. "
            f"A variable cannot be both resampled and frozen."
        )
    return frozen


def _evaluated_v6(model, outputs, compiled, in_trace, constant_data, volatile_vars, frozen):
    """What pymc 6.4's `compile_forward_sampling_function` compiles for `compiled`: outputs
    are not volatile in themselves there, so it computes volatility again on them alone."""
    from pymc.sampling import forward as pymc_forward
    from pymc.util import get_default_varnames
    from pytensor.graph.fg import FunctionGraph

    evaluated = list(get_default_varnames(compiled, include_transformed=False))
    copied = [v.name for v in outputs if v.name not in {e.name for e in evaluated}]
    if not evaluated:
        return Forward([v.name for v in outputs], [], [], copied, [])
    closure = pymc_forward._compute_volatile_vars(
        FunctionGraph(outputs=evaluated, clone=False),
        vars_in_trace=in_trace,
        rvs=set(model.basic_RVs),
        constant_data=constant_data,
        volatile_vars=volatile_vars,
        freeze_vars=frozen,
    )
    inputs = _inputs(evaluated, in_trace, closure)
    sampled = sorted(v.name for v in set(model.basic_RVs) & closure)
    names = [v.name for v in evaluated] + copied  # the order of pymc's inserts
    return Forward(names, evaluated, inputs, copied, sampled)


# --- the program --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Built:
    """The per-draw function `fn(seed_and_index, *inputs)` and what it takes and gives."""

    fn: Callable
    input_names: list[str]
    output_names: list[str]
    impl: str
    n_generators: int


def build(model: Any, forward: Forward, read: Trace) -> Built | str:
    """The forward graph as a per-draw JAX function, cached per model; a reason if none.

    The cache keys weakly on the model, and on the names, the trace's shapes, the PRNG
    implementation and a digest of the model's data: `pm.set_data` gives a new program, as
    the data are constants in it. Whether it traces (a random variable whose size is not
    static cannot) is checked here, before any work.

    Raises:
        ValueError: a trace variable whose shape the variable's static shape refuses, or
            whose length along a resized dim the graph cannot compute with (where pymc's
            own function raises too).
        IndexError: a constant index out of range of what it indexes (pymc 5 raises it).
    """
    impl = str(jax.config.values["jax_default_prng_impl"])  # JAX's default, as set by the user
    shapes = [_checked_shape(v, read) for v in forward.inputs]
    signature = tuple(
        (v.name, shape, v.type.dtype) for v, shape in zip(forward.inputs, shapes, strict=True)
    )
    outputs = tuple(v.name for v in forward.outputs)

    def build_uncached() -> Built | str:
        try:
            graph = random_function(forward.inputs, forward.outputs, shapes)
            if isinstance(graph, str):
                return graph
            names = [v.name for v in forward.inputs]
            built = Built(_per_draw(graph, impl), names, list(outputs), impl, graph.n_generators)
            key_spec = jax.ShapeDtypeStruct((2,), np.uint32)
            specs = [jax.ShapeDtypeStruct(s, v.type.dtype) for v, s in zip(forward.inputs, shapes)]
            jax.eval_shape(built.fn, key_spec, *specs)
        except jax.errors.ConcretizationTypeError as error:
            return f"a random variable's size is not static: {str(error).splitlines()[0]}"
        except NotImplementedError as error:  # e.g. a pytensor Op that JAX has no dispatch for
            return f"no JAX implementation: {str(error).splitlines()[0]}"
        except (ValueError, TypeError) as error:
            _raise_shape_error(model, forward, shapes, error)
        return built

    return cached_graph(_GRAPHS, model, ("predictive", outputs, signature, impl), build_uncached)


def _raise_shape_error(model: Any, forward: Forward, shapes: list, error: Exception) -> None:
    """pymc's `ValueError` for shapes that do not broadcast: pytensor raises ValueError as it
    rebuilds the graph at the trace's shapes, JAX a TypeError as it traces it. Any other
    error is raised as it is."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(error, TypeError) and "incompatible shapes" not in first:
        raise error
    if resized := _resized(model, forward.inputs, shapes):
        raise ValueError(
            f"The trace's {'; '.join(resized)} (a dim resized since sampling), and the "
            f"model's graph does not compute with that: {first} Pass `sample_vars` "
            "(pymc 6) to draw it anew at the model's length, or the model the draws "
            "came from."
        ) from error
    if isinstance(error, TypeError):
        raise ValueError(f"The model's shapes do not broadcast: {first}") from error
    raise error


def _per_draw(graph: RandomFunction, impl: str) -> Callable:
    """`graph.fn` for draw `i`, from `[seed, i]`: generator `j` of the graph draws from the
    key of the 64-bit seed `seed * 2**32 + i * n_generators + j`.

    For threefry (JAX's default) that key is the pair of words `[seed, i * n + j]`, built
    here without a hash (as `jax.random.key` builds it: one threefry hash less for XLA to
    compile per program); for other implementations, `fold_in(key(seed), i * n + j)`.
    """
    fn, n = graph.fn, graph.n_generators
    offsets = np.arange(n, dtype=np.uint32)

    def keys_of(seed_and_index):
        counters = seed_and_index[1] * np.uint32(n) + offsets
        if impl == "threefry2x32":
            words = jax.numpy.stack([jax.numpy.broadcast_to(seed_and_index[0], (n,)), counters])
            return jax.random.wrap_key_data(words.T, impl=impl)
        base = jax.random.key(seed_and_index[0], impl=impl)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, counters)

    def per_draw(seed_and_index, *values):
        return fn(keys_of(seed_and_index) if n else None, *values)

    return per_draw


def _checked_shape(var: Any, read: Trace) -> tuple[int, ...]:
    """The trace's per-draw shape of `var`, checked as pymc's compiled function checks its
    inputs: the variable's rank, and the lengths fixed in its type (`shape=3`, or a model
    after `freeze_dims_and_data`).

    A length that a dim gives (`dims=`, resizable by `set_dim`) is not fixed in the type:
    pymc computes with the trace's length there (pymc 6 keeps a trace variable after its
    dim was resized, and warns `ImplicitFreezeWarning`), and so does the graph, built for the
    trace's shapes. What cannot compute with it fails when the graph is built (`build`), and
    a constant index out of its range raises there (`graph`), not clamped as JAX would.
    """
    shape = read.event_shape(var.name)
    static = tuple(var.type.shape)
    if len(shape) != len(static) or any(
        n is not None and n != m for n, m in zip(static, shape, strict=False)
    ):
        raise ValueError(
            f"The trace's {var.name!r} has shape {shape} per draw, but the model's is fixed "
            f"at {static}. Pass the model the draws came from (with the same data and coords)."
        )
    return shape


def _resized(model: Any, inputs: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> list[str]:
    """ "`name` has shape (trace's) per draw, the model's (current's)" for each free variable
    among `inputs` whose trace shape is not the model's current one."""
    free = [(v, s) for v, s in zip(inputs, shapes, strict=True) if v in model.free_RVs]
    if not free:
        return []
    expected = expected_shapes(model)
    return [
        f"{v.name!r} has shape {s} per draw, the model's {expected[v.name]}"
        for v, s in free
        if s != expected[v.name]
    ]
