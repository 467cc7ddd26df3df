"""NumPyro's `Predictive` and `log_likelihood` on pymc_chunkpost's engine.

The same arguments and the same numbers as `numpyro.infer.Predictive` and
`numpyro.infer.util.log_likelihood` (docs/numpyro.md says which, bit for bit), computed by
one compiled, chunked map over the draws within a memory budget. `patch` (or `patched`, for
a `with` block) routes numpyro's own names to them, for code that calls those (ArviZ's
`from_numpyro`). Needs numpyro: `pip install "pymc-chunkpost[numpyro]"`. Importing
`pymc_chunkpost` alone never imports numpyro.
"""

from ._support.extras import require as _require

_require("numpyro", extra="numpyro")

from ._numpyro.loo import numpyro_loo as loo  # noqa: E402
from ._numpyro.patch import is_patched as is_patched  # noqa: E402
from ._numpyro.patch import patch as patch  # noqa: E402
from ._numpyro.patch import patched as patched  # noqa: E402
from ._numpyro.patch import unpatch as unpatch  # noqa: E402
from ._numpyro.routes import Predictive as Predictive  # noqa: E402
from ._numpyro.routes import log_likelihood as log_likelihood  # noqa: E402

__all__ = ["Predictive", "is_patched", "log_likelihood", "loo", "patch", "patched", "unpatch"]
