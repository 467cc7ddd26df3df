"""The README's advice for CPU users holds: asked for before JAX starts, the device count
survives the 100 host devices that `import pymc.sampling.jax` asks for, and XLA's CPU
compute pool shrinks with it (docs/strategies.md, "pymc's 100 host devices")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc"),
    pytest.mark.slow,  # fresh Pythons with other device counts
]

# Prints the device count and the number of XLA CPU compute threads after one computation.
PROBE = """
import os, sys
if sys.argv[1] == "config":
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
import pymc.sampling.jax
import jax, jax.numpy as jnp
(jnp.ones((64, 64)) @ jnp.ones((64, 64))).block_until_ready()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(jax.device_count(), sum(n == "tf_XLAEigen" for n in names))
"""


def _probe(route: str, xla_flags: str | None) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    done = subprocess.run(
        [sys.executable, "-c", PROBE, route], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    devices, threads = done.stdout.split()[-2:]
    return int(devices), int(threads)


@pytest.mark.parametrize(
    "route, xla_flags",
    [
        ("config", None),
        ("flags", "--xla_force_host_platform_device_count=4"),  # the last flag: pymc keeps it
    ],
)
def test_asking_for_four_devices_beats_pymcs_hundred(route, xla_flags):
    devices, threads = _probe(route, xla_flags)
    assert devices == 4
    assert threads <= max(4, os.cpu_count() or 1)


def test_pymc_alone_gives_a_hundred_devices_and_threads():
    """What the advice is for: without it, a compute thread per forced device."""
    devices, threads = _probe("none", None)
    assert devices == 100
    assert threads >= 100
