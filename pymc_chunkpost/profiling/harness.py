"""One profiling case per fresh process, measured with memray.

`python -m pymc_chunkpost.profiling.harness --model SPEC --case ours:chunked --capture run.bin
--result run.json [--chains C --draws D --seed S | --draws-npz raw.npz]` runs one case in this
process:

1. builds the model and `jax_fn`, and puts the raw draws on the device as jax arrays (outside
   the tracked region, so the peak is what post-processing adds, as after sampling);
2. post-processes them under `memray.Tracker`, donating them as pymc does after sampling
   (`donate_samples=True`): "ours:<strategy>" calls `pymc_chunkpost._engine.call.postprocess.run`,
   "pymc:vmap" / "pymc:scan" call pymc's `_postprocess_samples`;
3. after the tracker has stopped, compares every output with pymc's "vmap" on the same
   seeded draws (`np.allclose(rtol=1e-10, atol=1e-12)`), computed in blocks of draws so that
   the reference cannot run out of memory where the case did not;
4. writes a JSON result: memray's peak memory and allocation count, wall time of the tracked
   call (trace + compile + run), and XLA compile seconds (ours: `Plan.compile_seconds`;
   pymc's: `jax.jit(...).lower(...).compile()` of the same function, timed after the tracked
   call).

`run_case` is the parent side: it starts that process and reads the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CaseResult", "BASELINES", "case_names", "run_case"]

#: pymc's own strategies, run as baselines.
BASELINES: tuple[str, ...] = ("vmap", "scan")
#: Draws per block when computing pymc's reference.
_REFERENCE_BLOCK_DRAWS = 250
_RTOL, _ATOL = 1e-10, 1e-12
#: Lines of a failed child's output kept in `CaseResult.error`.
_ERROR_LINES = 8


@dataclasses.dataclass
class CaseResult:
    """What one fresh-process run measured.

    Attributes:
        case: "ours:<strategy>" or "pymc:<strategy>".
        ok: the child exited cleanly.
        peak_bytes: memray's high-water mark of the tracked call.
        output_bytes: the outputs' bytes: the floor that no strategy can go below.
        allocations: memray's count of allocations in the tracked call.
        wall_seconds: wall time of the tracked call (trace, compile and run).
        compile_seconds: XLA compile seconds (see module docstring for how).
        planning_seconds: ours only: planning, all candidate compiles included.
        plan: ours only: strategy and chunk size that ran.
        equal: every output `np.allclose` to pymc's "vmap"; None if not compared.
        max_abs_diff: the largest absolute difference to the reference.
        error: the child's last lines of output when it failed, one per line.
    """

    case: str
    ok: bool = False
    peak_bytes: int | None = None
    output_bytes: int | None = None
    allocations: int | None = None
    wall_seconds: float | None = None
    compile_seconds: float | None = None
    planning_seconds: float | None = None
    plan: str = ""
    equal: bool | None = None
    max_abs_diff: float | None = None
    error: str = ""


def case_names(strategies: Sequence[str], baselines: Sequence[str] = BASELINES) -> list[str]:
    """Case names: pymc's baselines first, then ours."""
    return [f"pymc:{s}" for s in baselines] + [f"ours:{s}" for s in strategies]


def run_case(
    model_spec: str,
    case: str,
    workdir: str | Path,
    *,
    chains: int | None = None,
    draws: int | None = None,
    seed: int = 0,
    draws_npz: str | Path | None = None,
    compare: bool = True,
    timeout: float | None = None,
) -> CaseResult:
    """Run one case in a fresh Python process and read back its result.

    Args:
        model_spec: a fixture name, `FILE.py:builder` or a cloudpickled model path.
        case: "ours:<strategy>" or "pymc:vmap" / "pymc:scan".
        workdir: where the memray capture and the JSON result go.
        chains: chains of seeded draws (the fixture's default if None).
        draws: draws per chain of seeded draws (the fixture's default if None).
        seed: seed of the draws.
        draws_npz: raw draws from a file instead of seeded ones.
        compare: compare with pymc's "vmap" after the tracked call.
        timeout: seconds before the child is killed.

    Returns:
        The result; `ok=False` with the child's output tail when it failed.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stem = case.replace(":", "_")
    result_path = workdir / f"{stem}.json"
    result_path.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pymc_chunkpost.profiling.harness",
        "--model",
        model_spec,
        "--case",
        case,
        "--capture",
        str(workdir / f"{stem}.bin"),
        "--result",
        str(result_path),
        "--seed",
        str(seed),
    ]
    if chains is not None:
        cmd += ["--chains", str(chains)]
    if draws is not None:
        cmd += ["--draws", str(draws)]
    if draws_npz is not None:
        cmd += ["--draws-npz", str(draws_npz)]
    if not compare:
        cmd += ["--no-compare"]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CaseResult(case, error=f"timed out after {timeout} s")
    if proc.returncode != 0 or not result_path.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-_ERROR_LINES:]
        return CaseResult(case, error="\n".join([f"exit code {proc.returncode}:", *tail]))
    return CaseResult(**json.loads(result_path.read_text()))


# --------------------------------------------------------------------------------------------
# The child.


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pymc_chunkpost.profiling.harness", description=__doc__
    )
    parser.add_argument("--model", required=True, help="fixture, FILE.py:builder or model.p")
    parser.add_argument("--case", required=True, help="ours:<strategy> or pymc:vmap|scan")
    parser.add_argument("--capture", required=True, help="memray capture file to write")
    parser.add_argument("--result", required=True, help="JSON result file to write")
    parser.add_argument("--chains", type=int, default=None)
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws-npz", default=None)
    parser.add_argument("--no-compare", dest="compare", action="store_false")
    return parser.parse_args(argv)


def _numpy_draws(
    model: Any,
    spec: str,
    chains: int | None,
    draws: int | None,
    seed: int,
    draws_npz: str | None,
) -> list[np.ndarray]:
    from .fixtures import FIXTURES, load_draws, raw_draws

    if draws_npz is not None:
        return load_draws(model, draws_npz)
    fixture = FIXTURES.get(spec)
    if fixture is not None:
        return fixture.raw_draws(model, chains, draws, seed)
    if chains is None or draws is None:
        raise ValueError("A user model needs `--draws-npz`, or both `--chains` and `--draws`.")
    return raw_draws(model, chains, draws, seed)


def _pymc_compile_seconds(jax_fn: Callable, strategy: str, specs: list) -> float:
    """XLA compile seconds of pymc's post-processing, as one jitted function."""
    import jax
    from pymc.sampling.jax import _postprocess_samples

    def process(samples):
        return _postprocess_samples(jax_fn, samples, None, strategy)

    lowered = jax.jit(process, donate_argnums=0 if strategy == "vmap" else None).lower(specs)
    tic = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - tic


def _compare(
    jax_fn: Callable, numpy_draws: list[np.ndarray], outputs: Sequence
) -> tuple[bool, float]:
    """Every output against pymc's "vmap" on the same draws, in blocks of draws."""
    import jax
    import numpy as np
    from pymc.sampling.jax import _postprocess_samples

    n_draws = numpy_draws[0].shape[1]
    ours = [np.asarray(y) for y in outputs]  # a view of the CPU buffer, no copy
    equal, worst = True, 0.0
    for start in range(0, n_draws, _REFERENCE_BLOCK_DRAWS):
        stop = min(start + _REFERENCE_BLOCK_DRAWS, n_draws)
        block = [jax.numpy.asarray(x[:, start:stop]) for x in numpy_draws]
        reference = _postprocess_samples(jax_fn, block, None, "vmap")
        for y, ref in zip(ours, reference):
            ref = np.asarray(ref)
            mine = y[:, start:stop]
            if mine.shape != ref.shape or mine.dtype != ref.dtype:
                return False, float("inf")
            equal &= bool(np.allclose(mine, ref, rtol=_RTOL, atol=_ATOL))
            if ref.size:
                worst = max(worst, float(np.max(np.abs(mine - ref))))
        del block, reference
    return equal, worst


def main(argv: Sequence[str] | None = None) -> int:
    """Run one case and write its JSON result."""
    args = _parse(argv)
    source, _, strategy = args.case.partition(":")
    from pymc_chunkpost import STRATEGIES

    valid = STRATEGIES if source == "ours" else BASELINES if source == "pymc" else ()
    if strategy not in valid:
        raise ValueError(
            f"Unknown case {args.case!r}: pass ours:<one of {', '.join(STRATEGIES)}> or "
            f"pymc:<one of {', '.join(BASELINES)}>."
        )

    import jax
    from pymc.sampling.jax import _postprocess_samples

    from pymc_chunkpost._engine.call.postprocess import run
    from pymc_chunkpost._support.extras import require

    memray = require("memray")

    from .fixtures import jax_fn as make_jax_fn
    from .fixtures import load_model

    model = load_model(args.model)
    fn = make_jax_fn(model)
    numpy_draws = _numpy_draws(
        model, args.model, args.chains, args.draws, args.seed, args.draws_npz
    )
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in numpy_draws]
    # Own copies on the device, so that donation can reuse them (as after sampling).
    samples = [jax.numpy.array(x, copy=True) for x in numpy_draws]
    jax.block_until_ready(samples)
    if not args.compare:
        del numpy_draws
    gc.collect()

    capture = Path(args.capture)
    capture.unlink(missing_ok=True)
    result: dict[str, Any] = {"case": args.case, "ok": True}
    with memray.Tracker(capture, file_format=memray.FileFormat.ALL_ALLOCATIONS):
        tic = time.perf_counter()
        if source == "ours":
            outputs, plan = run(fn, samples, None, strategy, True)
        else:
            outputs = _postprocess_samples(fn, samples, None, strategy, donate_samples=True)
        jax.block_until_ready(outputs)
        result["wall_seconds"] = time.perf_counter() - tic
    del samples
    metadata = memray.FileReader(capture).metadata
    result["peak_bytes"] = metadata.peak_memory
    result["allocations"] = metadata.total_allocations
    result["output_bytes"] = sum(int(y.nbytes) for y in outputs)

    if source == "ours":
        result["compile_seconds"] = plan.compile_seconds
        result["planning_seconds"] = plan.planning_seconds
        result["plan"] = plan.strategy + (
            f" (chunk {plan.chunk_size})" if plan.chunk_size is not None else ""
        )
    else:
        result["compile_seconds"] = _pymc_compile_seconds(fn, strategy, specs)
    if args.compare:
        result["equal"], result["max_abs_diff"] = _compare(fn, numpy_draws, outputs)
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
