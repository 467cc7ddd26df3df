"""`configure_memory`: XLA's GPU client settings, validated, with a warning when too late."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import pymc_chunkpost as pc

NAMES = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def test_sets_and_returns_the_settings():
    import jax

    jax.devices()  # start a backend: the settings can no longer take effect here
    with pytest.warns(RuntimeWarning, match="already initialised"):
        settings = pc.configure_memory(preallocate=False, mem_fraction=0.9, allocator="platform")
    assert settings == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
        "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
    }
    assert {name: os.environ[name] for name in NAMES} == settings


def test_nothing_given_sets_nothing_and_does_not_warn(recwarn):
    assert pc.configure_memory() == {}
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert not any(name in os.environ for name in NAMES)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mem_fraction": 0}, "mem_fraction"),
        ({"mem_fraction": 1.5}, "mem_fraction"),
        ({"mem_fraction": "0.5"}, "mem_fraction"),
        ({"preallocate": "no"}, "preallocate"),
        ({"allocator": "magic"}, "allocator"),
    ],
)
def test_bad_values_set_nothing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pc.configure_memory(**{"allocator": "bfc", **kwargs})
    assert not any(name in os.environ for name in NAMES)


def test_before_jax_starts_there_is_no_warning_and_jax_sees_it():
    code = (
        "import warnings, os, json; warnings.simplefilter('error');"
        "import pymc_chunkpost as pc;"
        "s = pc.configure_memory(preallocate=False, mem_fraction=0.5);"
        "import jax; jax.devices();"
        "print(json.dumps({k: os.environ[k] for k in s}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
    }


def test_freed_heap_goes_back_to_the_os():
    """What `_executor.obtain` calls after XLA's compiler has freed its working memory."""
    import ctypes
    import ctypes.util

    from pymc_chunkpost._support.memory import release_freed_heap
    from pymc_chunkpost.profiling.proc import status_bytes

    if not release_freed_heap():
        pytest.skip("this C library has no malloc_trim")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 48 MiB of heap blocks (below the mmap threshold), written, then freed behind a block
    # that keeps the heap's top in place: the C library keeps their pages resident.
    size = 64 * 2**10
    blocks = [libc.malloc(size) for _ in range(768)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    pin = libc.malloc(size)
    before = status_bytes("VmRSS")
    for block in blocks:
        libc.free(block)
    freed = status_bytes("VmRSS")
    release_freed_heap()
    after = status_bytes("VmRSS")
    libc.free(pin)
    assert before - freed < 16 * 2**20  # freeing alone returns (almost) nothing
    assert freed - after > 32 * 2**20
