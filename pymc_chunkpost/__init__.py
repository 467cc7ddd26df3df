"""pymc_chunkpost: fast, memory-bounded post-processing of PyMC's JAX NUTS draws."""

from ._cache import clear_caches as clear_caches
from ._chunked import chunked_vmap as chunked_vmap
from ._config import configured as configured
from ._disk_output import StoredOutputs as StoredOutputs
from ._disk_output import open_outputs as open_outputs
from ._entry import postprocess_samples_with_plan as postprocess_samples_with_plan
from ._loo import loo as loo
from ._memory import configure_memory as configure_memory
from ._options import MATMUL_PRECISIONS as MATMUL_PRECISIONS
from ._patch import is_patched as is_patched
from ._patch import patch as patch
from ._patch import patched as patched
from ._patch import unpatch as unpatch
from ._posthoc import compute_deterministics as compute_deterministics
from ._posthoc import compute_log_likelihood as compute_log_likelihood
from ._posthoc import compute_log_prior as compute_log_prior
from ._postprocess import plan as plan
from ._postprocess import postprocess_samples as postprocess_samples
from ._predictive import sample_posterior_predictive as sample_posterior_predictive
from ._strategies import STRATEGIES as STRATEGIES
from ._types import Loop as Loop
from ._types import Plan as Plan
from ._version import __version__ as __version__
