from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import models  # noqa: E402


@pytest.fixture(scope="session")
def built():
    """Each test model and its jax_fn, built once per session (pytensor rewrites are slow)."""
    cache = {}

    def get(name):
        if name not in cache:
            builder = models.float32_model if name == "float32" else models.MODELS[name]
            model = builder()
            cache[name] = (model, models.jax_fn(model))
        return cache[name]

    return get
