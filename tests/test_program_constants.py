"""No compiled program carries data of the observations' size: the data are arguments, and
nothing in a program lets XLA fold an array of that size into a constant at compile time.

Each route runs once in a fresh process on a model of `ROWS` observations, XLA dumping every
program it compiles (`--xla_dump_to`); the dumps are read here:
- no constant, before or after XLA's optimisations, holds more than `BOUND` values;
- no logical reduction (and/or) reads more than `BOUND` values: XLA folds one whose values it
  can prove (pymc's check `mu >= 0` of `mu = exp(...)`) value by value in its HLO evaluator,
  for minutes at 20,000 observations (docs/decisions.md); a count folds in one step.
"""

from __future__ import annotations

import math
import re

import pytest
from helpers import run_script

BOUND = 64  # values; the worker's data are 700 values a column
# HLO text, as XLA dumps it (`%name`) and as jax prints it (`name`).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?(\S+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\((.*)$")
_REGION_ROOT = re.compile(r"^\s*ROOT %?\S+ = pred\[\]\S* (and|or)\(")


def _header(line: str) -> bool:
    """Whether `line` opens a computation (`%region_0.1 (...) -> ... {`, `ENTRY main.2 {`)."""
    return line[:1] not in (" ", "") and line.rstrip().endswith("{") and "HloModule" not in line


def _size(dims: str) -> int:
    return math.prod(int(d) for d in dims.split(",") if d)


def findings(text: str, reductions: bool = True) -> list[str]:
    """The constants of over `BOUND` values in one HLO module's text and, with `reductions`,
    its logical reductions of over `BOUND` values computed in the program, outside loops (a
    parameter, and the values a loop's body and condition carry, are never constants: an
    eager `jnp.all` of an array, a sampler's rejection loop).
    Reductions are read in the program as handed to XLA (after its fusions, a loop's body
    calls computations that are not named as the loop's)."""
    found, shapes, opcodes, logical, loops = [], {}, {}, set(), set()
    computation = None
    for line in text.splitlines():
        if _header(line):
            computation = line.replace("ENTRY ", "").lstrip("%").split()[0]
        if _REGION_ROOT.match(line) and computation is not None:
            logical.add(computation)
        loops.update(re.findall(r"(?:condition|body)=%?([\w.-]+)", line))
    for line in text.splitlines():
        if _header(line):
            computation = line.replace("ENTRY ", "").lstrip("%").split()[0]
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, _, dims, opcode, rest = match.groups()
        shapes[name], opcodes[name] = _size(dims), opcode
        if opcode == "constant" and _size(dims) > BOUND:
            found.append(f"a constant of {_size(dims)} values: {line.strip()[:160]}")
        if reductions and opcode in ("reduce", "reduce-window") and computation not in loops:
            operand = rest.split(",")[0].strip().lstrip("%")
            applied = re.search(r"to_apply=%?([\w.-]+)", rest)
            computed = opcodes.get(operand) != "parameter"  # a parameter is never folded
            if (
                applied
                and applied.group(1) in logical
                and computed
                and shapes.get(operand, 0) > BOUND
            ):
                found.append(
                    f"a logical reduction of {shapes[operand]} values: {line.strip()[:160]}"
                )
    return found


@pytest.mark.parametrize("routes", ["pymc", "numpyro"])
def test_no_program_holds_data_sized_constants(tmp_path, routes):
    pytest.importorskip(routes)
    dump = tmp_path / "dump"
    done = run_script(
        "tests/constants_worker.py",
        routes,
        env={
            "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
            "PYMC_CHUNKPOST_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), done.stderr[-3000:]
    modules = sorted(dump.glob("*.txt"))
    programs = [m for m in modules if m.name.endswith("before_optimizations.txt")]
    assert len(programs) >= 3, [m.name for m in modules]  # every route compiled something
    found = {}
    for module in modules:
        if "buffer-assignment" in module.name:
            continue
        before = module.name.endswith("before_optimizations.txt")
        found[module.name] = findings(module.read_text(), reductions=before)
    found = {name: f for name, f in found.items() if f}
    assert not found, found


_BAD = """HloModule jit_run

%region_0.1 (a: pred[], b: pred[]) -> pred[] {
  %a = pred[] parameter(0)
  %b = pred[] parameter(1)
  ROOT %and.5 = pred[] and(%a, %b)
}

%body.2 (t: pred[5,700]) -> pred[5,700] {
  %t = pred[5,700]{1,0} parameter(0)
  %true.1 = pred[] constant(true)
  %any.1 = pred[5]{0} reduce(%t, %true.1), dimensions={1}, to_apply=%region_0.1
  ROOT %t.2 = pred[5,700]{1,0} broadcast(%any.1), dimensions={0}
}

ENTRY %main.3 (x.1: f32[5,700]) -> pred[5] {
  %x.1 = f32[5,700]{1,0} parameter(0)
  %exp.1 = f32[5,700]{1,0} exponential(%x.1)
  %constant.2 = f32[700]{0} constant({...})
  %ge.6 = f32[5,700]{1,0} broadcast(%constant.2), dimensions={1}
  %ge.7 = pred[5,700]{1,0} compare(%exp.1, %ge.6), direction=GE
  %loop.1 = pred[5,700]{1,0} while(%ge.7), condition=%region_0.1, body=%body.2
  %constant.3 = pred[] constant(true)
  %flags.1 = pred[5,700]{1,0} parameter(1)
  %eager.1 = pred[5]{0} reduce(%flags.1, %constant.3), dimensions={1}, to_apply=%region_0.1
  ROOT %reduce_and.7 = pred[5]{0} reduce(%ge.7, %constant.3), dimensions={1}, to_apply=%region_0.1
}
"""


def test_the_check_finds_what_it_looks_for():
    """The reader is not blind: in a program (XLA's dump format) with a data-sized constant,
    an and-reduction over data, another inside a loop's body and one of a parameter, it
    finds the first two; without reductions asked for, the constant alone."""
    found = findings(_BAD)
    assert [f.split(":")[0] for f in found] == [
        "a constant of 700 values",
        "a logical reduction of 3500 values",
    ], found
    assert "reduce_and.7" in found[1]
    assert [f.split(":")[0] for f in findings(_BAD, reductions=False)] == [
        "a constant of 700 values"
    ]
    assert (
        findings(
            _BAD.replace("f32[700]{0} constant", "f32[64]{0} constant").replace(
                "pred[5,700]{1,0} compare", "pred[5,12]{1,0} compare"
            )
        )
        == []
    )
