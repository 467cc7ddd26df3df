"""Mechanism: a plan compiled (or loaded), run, and its outputs streamed to their home."""
