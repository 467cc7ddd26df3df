"""Optional dependencies: import them where they are used, and name the extra that has them.

The library itself needs only jax, pymc and tqdm. The `pymc-chunkpost` command's profiling
and demo need more (memray, matplotlib, numpyro, cloudpickle), which the `profile` extra
installs; a missing one is reported in one line that says what to install, not a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that has it."""


def require(module: str, extra: str = "profile") -> ModuleType:
    """Import `module`, or say which extra of pymc-chunkpost installs it.

    Args:
        module: the module to import, e.g. "memray".
        extra: the extra of `pymc-chunkpost` that depends on it.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: `module` (or its top-level package) is not installed. Other import
            errors (a broken installation) propagate unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.partition(".")[0]
        if error.name not in (module, top):
            raise  # the module is there, but something it imports is not: not ours to name
        raise MissingExtraError(
            f'{top} is not installed; install it with: pip install "pymc-chunkpost[{extra}]"'
        ) from None
