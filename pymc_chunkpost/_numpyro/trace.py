"""One draw of a NumPyro model, traced into the engine's per-draw function.

The per-draw functions apply numpyro's own handlers in numpyro's order (`predict_draw`,
`log_likelihood_draw`: numpyro's `single_prediction` and `single_loglik`). `trace` traces
one, and makes the engine's function of it once per program and data (cached per model),
so that the numbers are numpyro's (the routes' module docstring says why; docs/numpyro.md
has what was compared):
- each draw is computed by the program of one draw (`_one_draw_at_a_time`), as numpyro's
  `lax.map` computes it, unless `exact=False`;
- the model's data enter the program behind `lax.optimization_barrier`. In numpyro's
  `lax.map` they are operands of the loop, computed on at run time by XLA's compiled kernels;
  as constants of our program XLA would fold the data-only operations (`log1p(x ** 2)`) at
  compile time, with other math, a bit apart;
- small constants are per-draw inputs, and a draw's key is derived from its index
  (`_keys_from_indices`), as numpyro's split gives it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal
from numpyro import handlers

from .._engine.data.problem import host_copy
from .._support.cache import FunctionCache
from .._support.compat import split_key_at
from .arguments import is_key

__all__ = ["SMALL_CONSTANT_BYTES", "Traced", "log_likelihood_draw", "predict_draw", "trace"]

# Per model (weakly keyed: a model that is gone takes its entries, and their compiled
# executables, with it), the engine's function for each traced per-draw program and data.
_FUNCTIONS = FunctionCache(per_function=8)
# Content digests of the jax arrays among a program's constants, by identity while the array
# lives (jax arrays are immutable), so that a warm call does not hash the model's data again.
_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}

# --- one draw, as numpyro computes it --------------------------------------------------------


def predict_draw(
    model: Callable,
    key: jax.Array,
    samples: dict[str, Any],
    return_sites: Sequence[str] | str | None,
    condition_deterministic: bool,
    args: tuple,
    kwargs: dict,
) -> dict[str, Any]:
    """One draw of numpyro's `_predictive` (its `single_prediction`, without enumeration):
    the model masked, given the draw's `samples`, seeded with the draw's `key`."""
    masked = handlers.mask(model, mask=False)  # numpyro's mask(model, mask=infer_discrete)
    if condition_deterministic:
        substituted = handlers.substitute(masked, samples)
    else:

        def without_deterministic(msg: dict) -> Any:
            return samples.get(msg["name"]) if msg["type"] != "deterministic" else None

        substituted = handlers.substitute(masked, substitute_fn=without_deterministic)
    model_trace = handlers.trace(handlers.seed(substituted, key)).get_trace(*args, **kwargs)
    if return_sites is None:
        sites = {
            name
            for name, site in model_trace.items()
            if (site["type"] == "sample" and name not in samples) or site["type"] == "deterministic"
        }
    elif return_sites == "":
        sites = {name for name, site in model_trace.items() if site["type"] != "plate"}
    else:
        sites = set(return_sites)
    return {name: site["value"] for name, site in model_trace.items() if name in sites}


def log_likelihood_draw(
    model: Callable, samples: dict[str, Any], args: tuple, kwargs: dict
) -> dict[str, Any]:
    """One draw of numpyro's `log_likelihood` (its `single_loglik`)."""
    model_trace = handlers.trace(handlers.substitute(model, samples)).get_trace(*args, **kwargs)
    return {
        name: site["fn"].log_prob(site["value"])
        for name, site in model_trace.items()
        if site["type"] == "sample" and site["is_observed"]
    }


# --- the program for the engine --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Traced:
    """One draw's program, ready for the engine.

    Attributes:
        jax_fn: the engine's per-draw function, of the inputs at `used`.
        out_tree: the structure of one draw's dict of results; `jax_fn`'s outputs are its
            leaves, in jax's order (a site's value may be a pytree: a `param` site holding
            a dict, a flow guide's `$params`).
        used: indices of the inputs the program reads (at least one: the engine maps inputs).
        forwarded: per output leaf, whether it is an input passed through.
        out_specs: per output leaf, one draw's shape and dtype.
        key_at: where `jax_fn` takes each draw's index, from which it derives the draw's key
            (its last input is then the seed's key data); None: no key to derive.
    """

    jax_fn: Callable
    out_tree: Any
    used: tuple[int, ...]
    forwarded: tuple[bool, ...]
    out_specs: tuple[jax.ShapeDtypeStruct, ...]
    key_at: int | None = None


def trace(
    owner: Callable,
    per_draw: Callable,
    specs: list[jax.ShapeDtypeStruct],
    exact: bool,
    keyed: bool = False,
) -> tuple[Traced, list[Any]]:
    """Trace one draw of `per_draw`: the engine's function for it (the one made for the same
    program and data before, so that the engine's compiled executables are reused), and the
    program's small constants, which that function takes as per-draw inputs. `keyed`: the
    last input is a draw's key, which the engine's function derives from the draw's index
    (`_keys_from_indices`).

    In numpyro's `lax.map` the model's data are operands of the loop: parameters of the
    compiled program. Here a constant of up to `SMALL_CONSTANT_BYTES` (a distribution's
    scale, eight schools' `sigma`, a guide's scalar params) is a per-draw input, a parameter
    too; a larger one (a design matrix) stays a constant of the engine's function, behind
    an optimization barrier (`_engine_function`), and in the cache key by content. The
    engine passes it to its programs as an argument (`_program`); the exact loop takes it as
    an input of the loop (`_exact_engine_function`), as numpyro's does. Folded as a
    constant, XLA would sink what reads only it into the loop, where its rewrites of
    `(a * b) * broadcast(c)` round apart from numpyro's (docs/numpyro.md).
    """
    closed, out_shape = jax.make_jaxpr(per_draw, return_shape=True)(*specs)
    out_tree = jax.tree_util.tree_structure(out_shape)
    jaxpr = closed.jaxpr
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, Literal)}
    read |= {id(v) for v in jaxpr.outvars if not isinstance(v, Literal)}
    used = tuple(i for i, v in enumerate(jaxpr.invars) if id(v) in read) or (0,)
    inputs = {id(v) for v in jaxpr.invars}
    forwarded = tuple(not isinstance(v, Literal) and id(v) in inputs for v in jaxpr.outvars)
    consts = list(closed.consts)
    small = tuple(i for i, c in enumerate(consts) if _is_small(c))
    data = tuple(_fingerprint(c) for i, c in enumerate(consts) if i not in small)
    key_at = used.index(len(specs) - 1) if keyed and len(specs) - 1 in used else None
    key = (str(jaxpr), out_tree, used, small, data, exact, key_at)
    owner = getattr(owner, "__func__", owner)  # a bound method: its function lives on
    traced = _FUNCTIONS.get(owner, key)
    if traced is None:
        if exact:
            jax_fn = _exact_engine_function(closed, used, small)
        else:
            jax_fn = _engine_function(closed, used, small)
        if key_at is not None:
            jax_fn = _keys_from_indices(jax_fn, key_at)
        out_specs = tuple(jax.tree_util.tree_leaves(out_shape))
        traced = Traced(jax_fn, out_tree, used, forwarded, out_specs, key_at)
        _FUNCTIONS.put(owner, key, traced)
    return traced, [consts[i] for i in small]


#: Constants of at most this many bytes enter as per-draw inputs (`trace`): each costs
#: draws x its bytes (4,000 draws x 256 B = 1 MiB at most), a small share of any output.
SMALL_CONSTANT_BYTES = 256


def _is_small(value: Any) -> bool:
    return not is_key(value) and math.prod(np.shape(value)) * value.dtype.itemsize <= (
        SMALL_CONSTANT_BYTES
    )


def _barred(closed: Any, small: tuple[int, ...]) -> list[int]:
    """The program's constants that are the model's data: neither small nor keys."""
    return [i for i, c in enumerate(closed.consts) if i not in small and not is_key(c)]


def _engine_function(
    closed: Any, used: tuple[int, ...], small: tuple[int, ...], data_inputs: bool = False
) -> Callable:
    """The traced program as the engine's per-draw function of the inputs at `used`, then
    of one per-draw input for each constant at `small`; with `data_inputs`, then of the
    model's data (`_barred`), as inputs too.

    Invariant: the program's other constants (the model's data) reach XLA behind an
    optimization barrier, so that no operation that reads only them is folded at compile
    time, with other math than the compiled kernels' (the module docstring). Unused inputs
    are zeros that XLA removes. The function holds no small constant: they come each call.
    """
    jaxpr = closed.jaxpr
    held = [None if i in small else c for i, c in enumerate(closed.consts)]
    barred = _barred(closed, small)
    avals = [v.aval for v in jaxpr.invars]

    def jax_fn(*inputs: Any) -> list[Any]:
        consts = list(held)
        data = [held[i] for i in barred]
        if data_inputs:
            inputs, data = (
                inputs[: len(inputs) - len(barred)],
                list(inputs[len(inputs) - len(barred) :]),
            )
        if barred:
            for i, c in zip(barred, lax.optimization_barrier(data)):
                consts[i] = c
        for i, x in zip(small, inputs[len(used) :]):
            consts[i] = x
        args: list[Any] = [jnp.zeros(a.shape, a.dtype) for a in avals]
        for i, x in zip(used, inputs):
            args[i] = x
        return jax.core.eval_jaxpr(jaxpr, consts, *args)

    return jax_fn


def _exact_engine_function(closed: Any, used: tuple[int, ...], small: tuple[int, ...]) -> Callable:
    """`_engine_function`, each draw computed by the program of one draw
    (`_one_draw_at_a_time`).

    Invariant: the model's data are inputs of the one-draw loop, the same at every draw, and
    constants of the function returned alone, which the engine passes to its programs as
    arguments: a batching rule that closed over them would keep them in the compiled loop,
    data-sized constants of a program that other data could not share.
    """
    barred = _barred(closed, small)
    data = [closed.consts[i] for i in barred]
    loop = _one_draw_at_a_time(
        _engine_function(closed, used, small, data_inputs=True), len(small) + len(barred)
    )

    def jax_fn(*inputs: Any) -> list[Any]:
        return loop(*inputs, *data)

    return jax_fn


def _one_draw_at_a_time(fn: Callable, n_invariant: int = 0) -> Callable:
    """`fn`, which `jax.vmap` maps as `lax.map`: one draw per step, however many are mapped.
    Its last `n_invariant` inputs are the same at every draw (the small constants, mapped
    as per-draw inputs, and the model's data): the loop takes draw 0's as an operand of its
    own.

    Invariant: every draw is computed by the program of one draw, as in numpyro's loop, so
    that XLA's shape-dependent rewrites (in a batch, a loop-invariant operand is a
    broadcast, and XLA reassociates `(a * b) * broadcast(c)`) and its fused multiply-adds
    are those of numpyro's program: the numbers do not depend on how many draws a chunk
    maps (docs/numpyro.md). Under nested maps each level is a loop. The small constants
    reach the loop as numpyro's reach its loop: operands of the loop, not sliced per step
    (sliced, XLA compiled the 5,000-row `deterministic_sites` loop 2.5x slower).
    """

    @jax.custom_batching.custom_vmap
    def per_draw(*inputs: Any) -> list[Any]:
        return fn(*inputs)

    @per_draw.def_vmap
    def rule(axis_size: int, in_batched: list[bool], *inputs: Any) -> tuple[list, list]:
        invariant = range(len(inputs) - n_invariant, len(inputs))
        inputs = tuple(
            x[0] if i in invariant and in_batched[i] else x for i, x in enumerate(inputs)
        )
        in_batched = [b and i not in invariant for i, b in enumerate(in_batched)]
        mapped = tuple(x for x, batched in zip(inputs, in_batched) if batched)

        def one(values: tuple) -> list[Any]:
            it = iter(values)
            return per_draw(*[next(it) if b else x for x, b in zip(inputs, in_batched)])

        if not mapped:  # nothing varies over the draws: one draw's outputs, broadcast
            outputs = per_draw(*inputs)
            outputs = [jnp.broadcast_to(y, (axis_size, *jnp.shape(y))) for y in outputs]
        elif axis_size == 1:  # one draw (one chain of many draws): no loop to compile
            outputs = [y[None] for y in one(tuple(x[0] for x in mapped))]
        else:
            outputs = lax.map(one, mapped)
        return outputs, [True] * len(outputs)

    return per_draw


def _keys_from_indices(fn: Callable, at: int) -> Callable:
    """`fn`, whose input `at` is a draw's key data, as a function of the draw's index there
    and of the seed's key data as one more, last input: the draw's key is key `index` of the
    seed's split (`split_key_at`).

    Invariant: the keys are hashed outside `fn`, so that under the engine's map a chunk's keys
    hash together, vectorised, before `fn`'s loop of one-draw programs takes them, as
    numpyro's loop takes the keys of its split. Integer arithmetic: the same bits in a batch.
    """

    def keyed(*inputs: Any) -> list[Any]:
        *inputs_, seed = inputs
        inputs_[at] = split_key_at(seed, inputs_[at])
        return fn(*inputs_)

    return keyed


def _fingerprint(value: Any) -> tuple:
    """Shape, dtype and content digest of a constant: equal for equal data."""
    shape, dtype = tuple(np.shape(value)), str(value.dtype)
    if not isinstance(value, jax.Array):  # numpy data may change in place: hashed each time
        return shape, dtype, _digest(value)
    memo = _DIGESTS.get(id(value))
    if memo is not None and memo[0]() is value:
        return shape, dtype, memo[1]
    digest = _digest(value)
    key = id(value)
    _DIGESTS[key] = (weakref.ref(value, lambda _: _DIGESTS.pop(key, None)), digest)
    return shape, dtype, digest


def _digest(value: Any) -> str:
    data = np.ascontiguousarray(host_copy(value))  # a random key's data; no copy kept on it
    return hashlib.blake2b(data.reshape(-1).view(np.uint8).data, digest_size=16).hexdigest()
