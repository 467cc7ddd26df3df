"""benchmarks/: at most 14 scripts at its top, none importing a private module of the package
(docs/benchmarks.md); the probes beside them each have their line in probes/README.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def private_imports(text: str) -> list[str]:
    """Where `text` (a script, strings included: a child process's code counts) reaches a
    private module of the package: `pymc_chunkpost._x`, `from pymc_chunkpost import _x`, or
    `alias._x` where `import pymc_chunkpost as alias`."""
    found = re.findall(r"pymc_chunkpost\._(?!_)\w+(?:\.\w+)*", text)
    for names in re.findall(r"from\s+pymc_chunkpost\s+import\s+(\([^)]*\)|[^\n]*)", text):
        found += [f"from pymc_chunkpost import {n}" for n in re.findall(r"\b_(?!_)\w+", names)]
    for alias in re.findall(r"import\s+pymc_chunkpost\s+as\s+(\w+)", text):
        found += re.findall(rf"\b{alias}\._(?!_)\w+", text)
    return found


def test_private_imports_are_found():
    assert private_imports("from pymc_chunkpost._support.config import configured") == [
        "pymc_chunkpost._support.config"
    ]
    assert private_imports("from pymc_chunkpost import clear_caches, _disk\n") == [
        "from pymc_chunkpost import _disk"
    ]
    assert private_imports("from pymc_chunkpost import (\n    plan,\n    _postprocess,\n)") == [
        "from pymc_chunkpost import _postprocess"
    ]
    assert private_imports("import pymc_chunkpost as pc\npc._postprocess.run(f, x)") == [
        "pc._postprocess"
    ]
    public = "import pymc_chunkpost as pc\nfrom pymc_chunkpost import configured\npc.plan(f, x)"
    public += "\nwhere = pymc_chunkpost.__file__; pc.__version__"
    assert private_imports(public + "\nfrom pymc.sampling.jax import _postprocess_samples") == []


def test_at_most_14_scripts_and_none_imports_a_private_module():
    """A script is what one runs; `_cell.py`, the module the scripts share, is not one, and
    imports no private module either. `_internals.py` is the one module that does: the
    engine's steps the benchmarks time, named in one place."""
    files = sorted(BENCHMARKS.glob("*.py"))
    scripts = [p for p in files if not p.name.startswith("_")]
    assert len(scripts) <= 14, [p.name for p in scripts]
    private = {p.name: private_imports(p.read_text()) for p in files if p.name != "_internals.py"}
    assert {name: found for name, found in private.items() if found} == {}
    assert private_imports((BENCHMARKS / "_internals.py").read_text())


def test_every_probe_has_its_line_in_the_readme():
    readme = (BENCHMARKS / "probes" / "README.md").read_text()
    probes = sorted(p.name for p in (BENCHMARKS / "probes").glob("*.py"))
    assert probes
    assert [name for name in probes if f"- `{name}`:" not in readme] == []
    listed = re.findall(r"^- `(\w+\.py)`:", readme, flags=re.M)
    assert sorted(listed) == probes
