"""The package's version, read once from the installed metadata (written in pyproject.toml).

A module of its own, below everything that needs it (the tuning cache's key, the command
line, the public namespace), so that none of them imports the package's face for it.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("pymc-chunkpost")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
