"""pymc_chunkpost: fast, memory-bounded post-processing of PyMC's JAX NUTS draws."""

from ._engine.call.entry import postprocess_samples_with_plan as postprocess_samples_with_plan
from ._engine.call.options import MATMUL_PRECISIONS as MATMUL_PRECISIONS
from ._engine.call.postprocess import plan as plan
from ._engine.call.postprocess import postprocess_samples as postprocess_samples
from ._engine.data.types import Loop as Loop
from ._engine.data.types import Plan as Plan
from ._engine.kernels.chunked import chunked_vmap as chunked_vmap
from ._engine.kernels.strategies import STRATEGIES as STRATEGIES
from ._pymc.loo import loo as loo
from ._pymc.patch import is_patched as is_patched
from ._pymc.patch import patch as patch
from ._pymc.patch import patched as patched
from ._pymc.patch import unpatch as unpatch
from ._pymc.posthoc import compute_deterministics as compute_deterministics
from ._pymc.posthoc import compute_log_likelihood as compute_log_likelihood
from ._pymc.posthoc import compute_log_prior as compute_log_prior
from ._pymc.predictive import sample_posterior_predictive as sample_posterior_predictive
from ._store.zarr import StoredOutputs as StoredOutputs
from ._store.zarr import open_outputs as open_outputs
from ._support.cache import clear_caches as clear_caches
from ._support.config import configured as configured
from ._support.memory import configure_memory as configure_memory
from ._support.version import __version__ as __version__
