"""pymc_chunkpost: fast, memory-bounded post-processing of PyMC's JAX NUTS draws."""

import importlib.metadata

from ._chunked import chunked_vmap as chunked_vmap
from ._memory import configure_memory as configure_memory
from ._patch import is_patched as is_patched
from ._patch import patch as patch
from ._patch import patched as patched
from ._patch import unpatch as unpatch
from ._planner import Plan as Plan
from ._planner import plan as plan
from ._postprocess import postprocess_samples as postprocess_samples
from ._strategies import STRATEGIES as STRATEGIES

try:  # the version is written once, in pyproject.toml
    __version__ = importlib.metadata.version("pymc-chunkpost")
except importlib.metadata.PackageNotFoundError:  # imported from a checkout that is not installed
    __version__ = "0+unknown"
