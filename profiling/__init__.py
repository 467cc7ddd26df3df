"""Profiling harness: real PyMC fixtures, fresh-process memray runs, reports.

See `profiling.fixtures` (models and raw draws), `profiling.harness` (one case per process),
`profiling.report` (tables and plots) and the `pymc-chunkpost profile` command.
"""
