"""Evaluate a per-draw jaxpr so that, mapped over draws, its results come out draw-major.

`jax.vmap` of `dot_general(data, draw_value)` (a design matrix times a draw's coefficients,
the linear predictor of most regressions) puts the draw axis *after* the data's rows, and
then transposes the whole result into the draw-major outputs: a temporary as large as the
output and a copy through main memory (docs/strategies.md). Evaluated here, such a product is
computed the other way round, `dot_general(draw_value, data)`, which puts the draw axis first,
and transposed back within each draw (nothing, for a matrix times a vector). Per draw the
value is the same product; only the summation order inside XLA's kernel may differ, by
rounding.

Calls of nested jitted functions (`jnp` functions are jitted) are inlined, so that the
products inside them are seen too; XLA inlines them anyway.

With `exact_terms` (a TPU's, `_program.exact_product_terms`), a float32 product at
"highest" precision of at most that many terms per result is computed as multiplies and
adds (`_exact_product`): float32's own rounding, where a TPU's "highest" is bfloat16
passes that XLA takes seconds to compile. Products inside other control flow (a scan, a
loop, a `cond`, a custom derivative's call) are bound whole and keep theirs.

Mapped over draws (`DrawFunction.over_draws`), an elementwise equation (a primitive that
`jax.vmap` batches by binding it on the batched operands as they are) is bound on the draws'
arrays directly; the other equations that read the draws, and everything that reads their
results, are mapped together by one `jax.vmap` per draw axis (the tail). The program is the
one `jax.vmap` gives; only tracing is cheaper, by the batch tracer's cost per equation and
axis: a model of hundreds of scalars traces in a third of the time (docs/strategies.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import Literal

from ..._support.compat import CALLS, elementwise_batchers
from ..._support.config import current

__all__ = ["DrawFunction", "draw_major_fun", "vmap_draws"]

# jax's batching rules for elementwise primitives (internal to jax: `_compat`). Without them,
# every equation is mapped with `jax.vmap`.
_VECTORIZED, _BROADCAST, _RULES = elementwise_batchers()


def vmap_draws(fn: Callable, n: int) -> Callable:
    """`fn` (one draw's values to a list of outputs) over `n` leading draw axes: `n` nested
    `jax.vmap`s, or `fn.over_draws(n)` for a `DrawFunction`."""
    if isinstance(fn, DrawFunction):
        return fn.over_draws(n)
    return _nested_vmap(fn, n)


def _nested_vmap(fn: Callable, n: int, in_axes: Any = 0) -> Callable:
    for _ in range(n):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


class DrawFunction:
    """The per-draw function of a closed jaxpr, with draw-major products (module docstring).

    Called on one draw's values, it returns the outputs at `outputs` (all by default);
    `over_draws(n)` maps it over `n` leading draw axes. `exact_terms`: float32 products at
    "highest" precision over at most this many terms are computed as multiplies and adds
    (module docstring); 0: none.
    """

    def __init__(self, closed: Any, outputs: Sequence[int] | None = None, exact_terms: int = 0):
        self.closed = closed
        self.outputs = None if outputs is None else tuple(outputs)
        self.exact_terms = exact_terms

    def _select(self, outs: list) -> list:
        return outs if self.outputs is None else [outs[j] for j in self.outputs]

    def with_consts(self, consts: Sequence[Any]) -> DrawFunction:
        """The same function reading `consts` (traced arguments of a compiled step, say) in
        place of the jaxpr's own constants; the schedule is shared, not made again."""
        from jax.extend.core import ClosedJaxpr

        closed = ClosedJaxpr(self.closed.jaxpr, list(consts))
        bound = DrawFunction(closed, self.outputs, self.exact_terms)
        bound.__dict__["schedule"] = self.schedule
        return bound

    def __call__(self, *args: Any) -> list:
        closed = self.closed
        env = _env(closed, args, [True] * len(args))
        _eval(closed.jaxpr.eqns, *env, self.exact_terms)
        return self._select([_read(env[0], v) for v in closed.jaxpr.outvars])

    @functools.cached_property
    def schedule(self) -> _Schedule:
        """How `over_draws` evaluates the jaxpr (`_schedule`)."""
        jaxpr = self.closed.jaxpr
        return _schedule(jaxpr.eqns, jaxpr.outvars, dict.fromkeys(jaxpr.invars, True))

    def over_draws(self, n: int) -> Callable:
        """The function of arrays whose `n` leading axes are draws: `n` nested `jax.vmap`s of
        this function, traced more cheaply where `_Schedule.pays` (module docstring)."""
        if not self.schedule.pays or not self.closed.jaxpr.invars:
            return _nested_vmap(self.__call__, n)

        def mapped(*args: Any) -> list:
            batch = _draw_axes(args, n)
            closed = self.closed
            env = _env(closed, args, [True] * len(args))
            _run_schedule(self.schedule, *env, n, self.exact_terms)
            return self._select([_batched(env, v, batch) for v in closed.jaxpr.outvars])

        return mapped


def draw_major_fun(
    closed: Any, outputs: Sequence[int] | None = None, exact_terms: int = 0
) -> DrawFunction:
    """`jax.extend.core.jaxpr_as_fun(closed)`, with the draw-major products described above.

    `closed` is the per-draw function's `ClosedJaxpr`; its inputs are the draw's values, its
    constants the model's data. `outputs`: the indices of the outputs to return.
    `exact_terms`: see `DrawFunction`.
    """
    return DrawFunction(closed, outputs, exact_terms)


def _draw_axes(args: Sequence[Any], n: int) -> tuple[int, ...]:
    """The `n` draw axes that every argument leads with; a `ValueError` (as `jax.vmap`'s) where
    they disagree."""
    shapes = {tuple(np.shape(x)[:n]) for x in args}
    if len(shapes) != 1 or any(np.ndim(x) < n for x in args):
        raise ValueError(
            f"over_draws({n}) got arguments whose {n} leading axes differ: "
            f"{[np.shape(x) for x in args]}"
        )
    (batch,) = shapes
    return batch


# The evaluation state: values by variable, and whether each depends on the draw.
_Env = tuple[dict[Any, Any], dict[Any, bool]]


def _env(closed: Any, args: Sequence[Any], flags: Sequence[bool]) -> _Env:
    """`closed`'s constants (data) and arguments, which depend on the draw where `flags`."""
    jaxpr = closed.jaxpr
    values: dict[Any, Any] = {}
    depends: dict[Any, bool] = {}
    for v, x in zip(jaxpr.constvars, closed.consts):
        values[v], depends[v] = x, False
    for v, x, flag in zip(jaxpr.invars, args, flags):
        values[v], depends[v] = x, flag
    return values, depends


def _read(values: dict, v: Any) -> Any:
    return v.val if isinstance(v, Literal) else values[v]


def _reads_draw(depends: dict, v: Any) -> bool:
    return not isinstance(v, Literal) and depends[v]


def _batched(env: _Env, v: Any, batch: tuple[int, ...]) -> Any:
    """Output `v` with the draw axes: one that does not depend on the draw is broadcast, as
    `jax.vmap` broadcasts it."""
    x = _read(env[0], v)
    if _reads_draw(env[1], v):
        return x
    return lax.broadcast(x, batch)


def _inner(eqn: Any) -> Any:
    """The closed jaxpr a call equation calls, else None."""
    inner = eqn.params.get("jaxpr") if eqn.primitive.name in CALLS else None
    return inner if inner is not None and hasattr(inner, "consts") else None


def _call(eqn: Any, values: dict, depends: dict, evaluate: Callable) -> None:
    """A call equation, inlined: its jaxpr evaluated by `evaluate(eqns, values, depends)` in an
    environment of its own."""
    inner = _inner(eqn)
    args = [_read(values, v) for v in eqn.invars]
    inner_values, inner_depends = _env(inner, args, [_reads_draw(depends, v) for v in eqn.invars])
    evaluate(inner.jaxpr.eqns, inner_values, inner_depends)
    for v, w in zip(eqn.outvars, inner.jaxpr.outvars):
        values[v], depends[v] = _read(inner_values, w), _reads_draw(inner_depends, w)


def _eval(eqns: Sequence[Any], values: dict, depends: dict, exact_terms: int = 0) -> None:
    """Evaluate `eqns` on one draw, in place: each result, and whether it depends on the draw.
    `exact_terms`: see `DrawFunction`."""
    for eqn in eqns:
        with eqn.ctx.manager:
            if _inner(eqn) is not None:
                _call(eqn, values, depends, functools.partial(_eval, exact_terms=exact_terms))
                continue
            args = [_read(values, v) for v in eqn.invars]
            flags = [_reads_draw(depends, v) for v in eqn.invars]
            if _is_exact_product(eqn, exact_terms):
                outs = [_exact_product(args[0], args[1], eqn.params)]
            elif _swappable(eqn, flags):
                outs = [_swapped_dot(args[0], args[1], eqn.params)]
            else:
                outs = _bind(eqn, args)
        for v, x in zip(eqn.outvars, outs):
            values[v], depends[v] = x, any(flags)


def _bind(eqn: Any, args: Sequence[Any]) -> list:
    params = eqn.primitive.get_bind_params(eqn.params)
    outs = eqn.primitive.bind(*args, **params)
    return outs if eqn.primitive.multiple_results else [outs]


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step of a `_Schedule`: an equation that reads no draw, bound as it is ("data"); an
    elementwise equation bound on the draws' arrays ("elementwise"); or an inlined call whose
    own schedule has no tail ("call": a call with one is computed in the caller's tail, as
    `jax.vmap` would lay out its results)."""

    kind: str
    eqn: Any
    inner: _Schedule | None = None


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """How `over_draws` evaluates equations: `steps` in order, then the `tail` under one
    `jax.vmap` per draw axis, of which `tail_outputs` are read afterwards."""

    steps: tuple[_Step, ...]
    tail: tuple[Any, ...]
    tail_outputs: tuple[Any, ...]
    elementwise: int  # elementwise equations bound directly, in calls too
    effects: bool  # an equation has effects, in calls too

    @property
    def pays(self) -> bool:
        """Whether the equations bound directly save more tracing than the tail costs. A
        jaxpr with effects keeps `jax.vmap`, and its order."""
        per_run = current().eqns_per_run  # the tail's tracing, in equations bound directly
        return not self.effects and self.elementwise >= per_run * bool(self.tail)


def _schedule(eqns: Sequence[Any], outvars: Sequence[Any], depends: dict[Any, bool]) -> _Schedule:
    """How to evaluate `eqns` over the draw axes, from which variables depend on the draw
    (`depends`, filled in as it goes; the jaxpr's constants are absent: data).

    An equation that reads the draw joins the tail if it is neither elementwise nor a call
    without a tail, or if it reads what the tail computes. Invariant: every value bound
    directly has the draw axes in front, as under nested `jax.vmap` (whose rules keep them
    there for elementwise primitives on operands that have them there), so the program is
    the one `jax.vmap` gives; a value that `jax.vmap` may leave with the draw axes elsewhere
    (a scan's outputs, a batched dot's) is computed inside the tail, and so is everything
    that reads it. The tail is one `jax.vmap`, whose outputs are the jaxpr's, where
    `jax.vmap` too puts the axes in front. Steps run before the tail: the jaxpr is pure
    (`_Schedule.pays` refuses one with effects)."""
    steps: list[_Step] = []
    tail: list[Any] = []
    computing: set[Any] = set()  # what the tail computes
    elementwise = 0
    effects = False

    def reads_draw(v: Any) -> bool:
        return not isinstance(v, Literal) and depends.get(v, False)

    for eqn in eqns:
        effects = effects or bool(eqn.effects)
        flags = [reads_draw(v) for v in eqn.invars]
        if not any(flags):  # reads no draw, so nothing the tail computes either
            steps.append(_Step("data", eqn))
            continue
        inner = _inner(eqn)
        sub = None
        if inner is not None:
            inner_depends = dict(zip(inner.jaxpr.invars, flags))
            sub = _schedule(inner.jaxpr.eqns, inner.jaxpr.outvars, inner_depends)
            effects = effects or sub.effects
        direct = not sub.tail if sub is not None else _elementwise(eqn, flags)
        if not direct or any(v in computing for v in eqn.invars if not isinstance(v, Literal)):
            tail.append(eqn)
            computing.update(eqn.outvars)
            depends.update(dict.fromkeys(eqn.outvars, True))
            continue
        if sub is None:
            steps.append(_Step("elementwise", eqn))
            elementwise += 1
            depends.update(dict.fromkeys(eqn.outvars, True))
            continue
        steps.append(_Step("call", eqn, sub))
        elementwise += sub.elementwise
        for v, w in zip(eqn.outvars, inner.jaxpr.outvars):
            depends[v] = not isinstance(w, Literal) and inner_depends.get(w, False)
    tail_outputs = tuple(
        dict.fromkeys(v for v in outvars if not isinstance(v, Literal) and v in computing)
    )
    return _Schedule(tuple(steps), tuple(tail), tail_outputs, elementwise, effects)


def _run_schedule(
    schedule: _Schedule, values: dict, depends: dict, n: int, exact_terms: int = 0
) -> None:
    """`_eval` over `n` leading draw axes, as `schedule` says: the values that depend on the
    draw carry them."""
    for step in schedule.steps:
        eqn = step.eqn
        if step.kind == "data":
            _eval([eqn], values, depends, exact_terms)
            continue
        with eqn.ctx.manager:
            if step.kind == "call":
                assert step.inner is not None
                _call(eqn, values, depends, _scheduled(step.inner, n, exact_terms))
                continue
            flags = [_reads_draw(depends, v) for v in eqn.invars]
            args = [_read(values, v) for v in eqn.invars]
            outs = _bind(eqn, _broadcastable(eqn, args, flags, n))
        for v, x in zip(eqn.outvars, outs):
            values[v], depends[v] = x, True
    if schedule.tail:
        _map_run(schedule.tail, schedule.tail_outputs, values, depends, n, exact_terms)


def _scheduled(schedule: _Schedule, n: int, exact_terms: int) -> Callable:
    """`_run_schedule` as the evaluator of a call's equations (`_call`)."""
    return lambda _eqns, values, depends: _run_schedule(schedule, values, depends, n, exact_terms)


def _map_run(
    eqns: Sequence[Any],
    outputs: Sequence[Any],
    values: dict,
    depends: dict,
    n: int,
    exact_terms: int = 0,
) -> None:
    """Evaluate `eqns` (each reads the draw) under one `jax.vmap` per draw axis, for their
    results `outputs`."""
    defined = {v for eqn in eqns for v in eqn.outvars}
    inputs = list(
        dict.fromkeys(
            v for eqn in eqns for v in eqn.invars if not isinstance(v, Literal) and v not in defined
        )
    )
    flags = [depends[v] for v in inputs]

    def run(*args):
        inner_values = dict(zip(inputs, args))
        inner_depends = dict(zip(inputs, flags))
        _eval(eqns, inner_values, inner_depends, exact_terms)
        return [inner_values[v] for v in outputs]

    mapped = _nested_vmap(run, n, [0 if flag else None for flag in flags])
    for v, x in zip(outputs, mapped(*[values[v] for v in inputs])):
        values[v], depends[v] = x, True


def _elementwise(eqn: Any, flags: list[bool]) -> bool:
    """Whether `jax.vmap` batches `eqn` by binding it on the batched operands as they are:
    unary with every operand batched, or n-ary with broadcasting (`_broadcastable`)."""
    rule = getattr(_RULES.get(eqn.primitive), "func", None)
    if rule is None or eqn.primitive.multiple_results:
        return False
    if rule is _VECTORIZED:
        return all(flags)
    if rule is not _BROADCAST:
        return False
    rank = max(len(v.aval.shape) for v in eqn.invars)
    return all(not flag or len(v.aval.shape) in (0, rank) for v, flag in zip(eqn.invars, flags))


def _broadcastable(eqn: Any, args: list, flags: list[bool], n: int) -> list:
    """The operands of an elementwise equation that compute every draw at once, as
    `jax.vmap`'s own rule binds them: with size-1 axes where an operand lacks the draw axes
    (data) or the draw's own axes (a batched scalar among arrays)."""
    rank = max(len(v.aval.shape) for v in eqn.invars)
    out = []
    for x, v, flag in zip(args, eqn.invars, flags):
        r = len(v.aval.shape)
        if flag and r < rank:
            x = lax.expand_dims(x, tuple(range(n, n + rank)))
        elif not flag and r:
            x = lax.expand_dims(x, tuple(range(n)))
        out.append(x)
    return out


def _swappable(eqn, flags: list[bool]) -> bool:
    """A `dot_general` of data (lhs) with a draw's values (rhs) that can be computed the
    other way round with nothing else changed: no batch dimensions, no output sharding, and
    a precision that is None or one per operand (swapped with them)."""
    if eqn.primitive.name != "dot_general" or flags[0] or not flags[1]:
        return False
    params = eqn.params
    precision = params.get("precision")
    return (
        _no_batch(params)
        and params.get("out_sharding") is None
        and (precision is None or isinstance(precision, tuple))
    )


def _no_batch(params) -> bool:
    (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


def _swapped_dot(data, draw, params):
    """`dot_general(data, draw, **params)`, computed as `dot_general(draw, data)`: the result's
    free dimensions of `draw` come first, then they are moved back behind those of `data`."""
    (lhs_contract, rhs_contract), _ = params["dimension_numbers"]
    swapped = dict(params, dimension_numbers=((rhs_contract, lhs_contract), ((), ())))
    if isinstance(params.get("precision"), tuple):  # one per operand: they swap too
        swapped["precision"] = tuple(reversed(params["precision"]))
    out = lax.dot_general_p.bind(draw, data, **swapped)
    n_draw = draw.ndim - len(rhs_contract)  # free dimensions of `draw`, now first
    n_data = data.ndim - len(lhs_contract)
    if n_draw == 0 or n_data == 0:
        return out
    permutation = tuple(range(n_draw, n_draw + n_data)) + tuple(range(n_draw))
    return lax.transpose(out, permutation)


def _is_exact_product(eqn: Any, limit: int) -> bool:
    """Whether `eqn` is a float32 `dot_general` at "highest" precision that sums at most
    `limit` terms per result. A product traced without a precision lowers at XLA's
    default whatever JAX's setting is later: not one (the routes trace under the precision
    they ask for, which the product then records)."""
    if limit < 1 or eqn.primitive.name != "dot_general":
        return False
    params = eqn.params
    lhs, rhs = (v.aval for v in eqn.invars)
    if lhs.dtype != np.float32 or rhs.dtype != np.float32:
        return False
    if params.get("preferred_element_type") not in (None, np.dtype(np.float32)):
        return False
    if params.get("out_sharding") is not None:
        return False
    (lhs_contract, _), _ = params["dimension_numbers"]
    terms = int(np.prod([lhs.shape[d] for d in lhs_contract]))
    if not 1 <= terms <= limit:
        return False
    precision = params.get("precision")
    if precision is None:
        return False
    precisions = precision if isinstance(precision, tuple) else (precision,)
    return all(p == lax.Precision.HIGHEST for p in precisions)


def _exact_product(lhs, rhs, params):
    """`dot_general(lhs, rhs, **params)` as float32 multiplies and adds, term by term in the
    contraction's order: each product rounded once, as the float32 product it stands for,
    where "highest" on a TPU splits the operands into bfloat16 passes (and costs XLA
    seconds of compile). The result's layout is `dot_general`'s: batch, lhs's free, rhs's
    free dimensions."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    lhs_free = [d for d in range(lhs.ndim) if d not in (*lhs_contract, *lhs_batch)]
    rhs_free = [d for d in range(rhs.ndim) if d not in (*rhs_contract, *rhs_batch)]
    batch = tuple(lhs.shape[d] for d in lhs_batch)
    lhs_shape = tuple(lhs.shape[d] for d in lhs_free)
    rhs_shape = tuple(rhs.shape[d] for d in rhs_free)
    terms = int(np.prod([lhs.shape[d] for d in lhs_contract]))
    left = lax.transpose(lhs, (*lhs_batch, *lhs_free, *lhs_contract))
    left = left.reshape(batch + lhs_shape + (1,) * len(rhs_shape) + (terms,))
    right = lax.transpose(rhs, (*rhs_batch, *rhs_free, *rhs_contract))
    right = right.reshape(batch + (1,) * len(lhs_shape) + rhs_shape + (terms,))
    out = None
    for k in range(terms):
        term = left[..., k] * right[..., k]
        out = term if out is None else out + term
    return out
