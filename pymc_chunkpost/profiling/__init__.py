"""Profiling tools: real PyMC fixtures, fresh-process memray runs, reports.

See `fixtures` (models and raw draws), `harness` (one case per process), `report` (tables
and plots) and the `pymc-chunkpost profile` command. The memory-bound tests that use them
live in the repository's top-level `profiling/` folder, which is not installed.
"""
