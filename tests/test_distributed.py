"""Two processes under `jax.distributed` on localhost, against pymc's own post-processing.

Each process runs `tests/distributed_worker.py`: 2 CPU devices of its own, global draws
assembled from its own chains, and every output shard it can address compared with pymc's
`_postprocess_samples` of the whole draws (computed here, once). See docs/distributed.md.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import distributed_worker as worker
import models
import numpy as np
import pytest
from helpers import reference

import pymc_chunkpost

pytestmark = pytest.mark.slow  # several processes under jax.distributed

TIMEOUT_SECONDS = 120
N_PROCESSES = 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(pymc_chunkpost.__file__).parent.parent)  # the package under test
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)  # the worker sets its own device count
    # The coordinator is on the loopback: no proxy may stand in between.
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


@pytest.fixture(scope="module")
def results(built, tmp_path_factory):
    """Both workers' reports, after both exited."""
    folder = tmp_path_factory.mktemp("distributed")
    model, jax_fn = built(worker.MODEL)
    raw = models.raw_draws(model, worker.CHAINS, worker.DRAWS, seed=0)
    expected = {f"out{j}": np.asarray(out) for j, out in enumerate(reference(jax_fn, raw))}
    np.savez(folder / "reference.npz", **expected)
    port, env = _free_port(), _environment()
    processes, logs = [], []
    for i in range(N_PROCESSES):
        log = open(folder / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        command = [
            sys.executable,
            worker.__file__,
            str(i),
            str(N_PROCESSES),
            str(port),
            str(folder / "reference.npz"),
            str(folder / f"result{i}.json"),
        ]
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
    try:
        for process in processes:
            process.wait(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
    reports = []
    for i, process in enumerate(processes):
        text = (folder / f"worker{i}.log").read_text()[-3000:]
        path = folder / f"result{i}.json"
        assert process.returncode == 0 and path.exists(), (
            f"worker {i} exited with {process.returncode} (killed after "
            f"{TIMEOUT_SECONDS} s if negative):\n{text}"
        )
        reports.append(json.loads(path.read_text()))
    return reports


def _runs(report):
    return [c for c in report["checks"] if c["layout"] != "replicated"]


@pytest.mark.parametrize("process", range(N_PROCESSES))
def test_every_addressable_shard_equals_pymc(results, process):
    report = results[process]
    assert not report["errors"], report["errors"][0]
    assert report["global_devices"] == 2 * worker.LOCAL_DEVICES
    runs = _runs(report)
    assert len(runs) == len(worker.RUNS)
    for check in runs:
        what = f"{check['layout']}/{check['strategy']}/{check['options']}"
        assert check["equal"], (what, check["mismatches"])
        assert check["shards_compared"] > 0, what


@pytest.mark.parametrize("process", range(N_PROCESSES))
def test_outputs_stay_where_the_draws_are(results, process):
    for check in _runs(results[process]):
        what = f"{check['layout']}/{check['strategy']}/{check['options']}"
        assert check["same_sharding"], what
        assert check["draws_as_expected"], what
        if check["layout"] == "local":  # each process's own chains, on a device of its own
            assert check["n_devices"] == 1 and all(check["fully_addressable"]), what
        else:  # global arrays: one shard per device of both processes, nothing gathered
            assert check["n_devices"] == 2 * worker.LOCAL_DEVICES, what
            assert not any(check["fully_addressable"]), what


@pytest.mark.parametrize("process", range(N_PROCESSES))
def test_draws_copied_to_every_process_are_refused(results, process):
    (check,) = [c for c in results[process]["checks"] if c["layout"] == "replicated"]
    assert check["equal"], check["message"]
