"""Bambi's models on the LOO routes: the PyMC model Bambi built, and its draws as that model's.

Bambi (`bambi.Model`) builds a PyMC model (`model.backend.model`), but reports its draws on
another parametrisation: after sampling it shifts `Intercept` back to the raw predictors'
scale, and by default drops the offsets of its non-centred group terms. Evaluated on the
PyMC model as they are, those draws give another log-likelihood without a word. Bambi's own
`_re_center_intercept` gives them back as the PyMC model's value variables (arviz-stats'
`loo_moment_match` calls it so), and routes that take a model take a Bambi model so.
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_pymc"]

_BAMBI_FIT = (
    "These draws come from Bambi (the posterior's `modeling_interface` is 'bambi'), which "
    "reports its intercept on the raw predictors' scale and may drop its group offsets: on "
    "the PyMC model they give another log-likelihood. Pass the Bambi model itself "
    "(`{route}(idata, bambi_model)`), not `bambi_model.backend.model`."
)


def as_pymc(idata: Any, model: Any, route: str) -> tuple[Any, Any]:
    """`(idata, model)` for a route that evaluates `model` at `idata`'s posterior: a Bambi
    model's PyMC model, with the draws as its value variables (a new idata; the caller's is
    unchanged); any other model as given. ArviZ's default `reff` is the caller's draws'
    (`default_reff` of the idata given), which ArviZ reads, not the new idata's.

    Raises:
        ValueError: before any work, a Bambi model not yet built, or a PyMC model with draws
            that Bambi reported (which that model would read as other values).
    """
    if _is_bambi(model):
        if model.backend is None:
            raise ValueError(
                f"`{route}` got a Bambi model that has not been built: fit it (or call "
                "`bambi_model.build()`) first."
            )
        return model._re_center_intercept(idata), model.backend.model
    if _fit_by_bambi(idata):
        raise ValueError(_BAMBI_FIT.format(route=route))
    return idata, model


def _is_bambi(model: Any) -> bool:
    if type(model).__module__.split(".")[0] != "bambi":
        return False
    if not hasattr(model, "_re_center_intercept"):
        raise ValueError(
            "This Bambi has no `Model._re_center_intercept` (Bambi 0.21 and later), which "
            "gives its draws back as its PyMC model's: upgrade Bambi."
        )
    return True


def _fit_by_bambi(idata: Any) -> bool:
    try:
        posterior = idata["posterior"]
    except (KeyError, TypeError):
        return False
    return getattr(posterior, "attrs", {}).get("modeling_interface") == "bambi"
