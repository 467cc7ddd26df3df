"""NumPyro's `Predictive` and `log_likelihood` on pymc_chunkpost's engine.

The same arguments and the same numbers as `numpyro.infer.Predictive` and
`numpyro.infer.util.log_likelihood` (docs/numpyro.md says which, bit for bit), computed by
one compiled, chunked map over the draws within a memory budget. Needs numpyro: `pip install
"pymc-chunkpost[numpyro]"`. Importing `pymc_chunkpost` alone never imports numpyro.
"""

from ._extras import require as _require

_require("numpyro", extra="numpyro")

from ._numpyro import Predictive as Predictive  # noqa: E402
from ._numpyro import log_likelihood as log_likelihood  # noqa: E402

__all__ = ["Predictive", "log_likelihood"]
