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

__all__ = ["draw_major_fun"]

# Primitives that call a closed jaxpr and mean nothing more than that call.
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})


def draw_major_fun(closed: Any) -> Callable:
    """`jax.extend.core.jaxpr_as_fun(closed)`, with the draw-major products described above.

    `closed` is the per-draw function's `ClosedJaxpr`; its inputs are the draw's values, its
    constants the model's data.
    """

    def fun(*args):
        consts = closed.consts
        return _eval(closed.jaxpr, consts, [False] * len(consts), args, [True] * len(args))

    return fun


def _eval(jaxpr, consts, const_flags, args, arg_flags) -> list:
    """Evaluate `jaxpr`; the flags say which constants and arguments depend on the draw."""
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
        name = eqn.primitive.name
        inner = eqn.params.get("jaxpr") if name in _CALLS else None
        if inner is not None and hasattr(inner, "consts"):
            n = len(inner.consts)
            outs = _eval(inner.jaxpr, inner.consts, [False] * n, values, flags)
        elif name == "dot_general" and not flags[0] and flags[1] and _no_batch(eqn.params):
            outs = [_swapped_dot(values[0], values[1], eqn.params)]
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)
            # jax >= 0.11 returns the params; earlier versions (subfuns, params).
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *values, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        any_draw = any(flags)
        for v, x in zip(eqn.outvars, outs):
            env[v], depends[v] = x, any_draw
    return [read(v) for v in jaxpr.outvars]


def _no_batch(params) -> bool:
    (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


def _swapped_dot(data, draw, params):
    """`dot_general(data, draw, **params)`, computed as `dot_general(draw, data)`: the result's
    free dimensions of `draw` come first, then they are moved back behind those of `data`."""
    (lhs_contract, rhs_contract), _ = params["dimension_numbers"]
    swapped = dict(params, dimension_numbers=((rhs_contract, lhs_contract), ((), ())))
    out = lax.dot_general_p.bind(draw, data, **swapped)
    n_draw = draw.ndim - len(rhs_contract)  # free dimensions of `draw`, now first
    n_data = data.ndim - len(lhs_contract)
    if n_draw == 0 or n_data == 0:
        return out
    permutation = tuple(range(n_draw, n_draw + n_data)) + tuple(range(n_draw))
    return lax.transpose(out, permutation)
