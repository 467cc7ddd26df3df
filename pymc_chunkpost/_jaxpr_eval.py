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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import lax
from jax.extend.core import Literal

__all__ = ["CALLS", "draw_major_fun"]

# Primitives that call a closed jaxpr (param "jaxpr") and mean nothing more than that call:
# jitted functions ("pjit" before jax 0.7).
CALLS = frozenset({"pjit", "jit"})


def draw_major_fun(closed: Any) -> Callable:
    """`jax.extend.core.jaxpr_as_fun(closed)`, with the draw-major products described above.

    `closed` is the per-draw function's `ClosedJaxpr`; its inputs are the draw's values, its
    constants the model's data.
    """

    def fun(*args):
        consts = closed.consts
        outs, _ = _eval(closed.jaxpr, consts, [False] * len(consts), args, [True] * len(args))
        return outs

    return fun


def _eval(jaxpr, consts, const_flags, args, arg_flags) -> tuple[list, list[bool]]:
    """Evaluate `jaxpr`: its outputs, and for each whether it depends on the draw (the flags
    say which constants and arguments do)."""
    env: dict[Any, Any] = {}
    depends: dict[Any, bool] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    def reads_draw(v) -> bool:
        return not isinstance(v, Literal) and depends[v]

    for v, x, flag in zip(
        [*jaxpr.constvars, *jaxpr.invars], [*consts, *args], [*const_flags, *arg_flags]
    ):
        env[v], depends[v] = x, flag
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        flags = [reads_draw(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in CALLS else None
        with eqn.ctx.manager:
            if inner is not None and hasattr(inner, "consts"):
                n = len(inner.consts)
                outs, out_flags = _eval(inner.jaxpr, inner.consts, [False] * n, values, flags)
            else:
                if _swappable(eqn, flags):
                    outs = [_swapped_dot(values[0], values[1], eqn.params)]
                else:
                    params = eqn.primitive.get_bind_params(eqn.params)
                    outs = eqn.primitive.bind(*values, **params)
                    if not eqn.primitive.multiple_results:
                        outs = [outs]
                out_flags = [any(flags)] * len(eqn.outvars)
        for v, x, flag in zip(eqn.outvars, outs, out_flags):
            env[v], depends[v] = x, flag
    return [read(v) for v in jaxpr.outvars], [reads_draw(v) for v in jaxpr.outvars]


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
