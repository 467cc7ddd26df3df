"""The wheel holds the package and nothing else; the version is written once; plain-install deps.

The wheel is built from this checkout with hatchling (the build backend), as `pip wheel .`
would build it, and read back with `zipfile`.
"""

from __future__ import annotations

import email
import importlib.metadata
import re
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pymc_chunkpost

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("wheel")
    (path,) = WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"])
    with zipfile.ZipFile(path) as archive:
        yield archive


def _requirement_name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0].lower()


def test_wheel_holds_the_package_only(wheel):
    names = wheel.namelist()
    version = PYPROJECT["project"]["version"]
    dist_info = f"pymc_chunkpost-{version}.dist-info/"
    assert all(n.startswith(("pymc_chunkpost/", dist_info)) for n in names), names
    stray = [n for n in names if re.search(r"(^|/)(tests?/|conftest\.py|test_[^/]*\.py)", n)]
    assert stray == []
    assert not any(n.startswith(("profiling/", "benchmarks/", "docs/")) for n in names)
    # The profiling tools ship inside the package (the repository's profiling/ does not).
    for module in ("fixtures", "harness", "report"):
        assert f"pymc_chunkpost/profiling/{module}.py" in names
    entry_points = wheel.read(dist_info + "entry_points.txt").decode()
    assert "pymc-chunkpost = pymc_chunkpost.cli:main" in entry_points


def test_plain_install_needs_only_jax_pymc_tqdm(wheel):
    # numpyro, memray, matplotlib and cloudpickle come with extras; the `profile` extra
    # brings everything `pymc-chunkpost demo` imports (see cli.DEMO_MODULES).
    from pymc_chunkpost.cli import DEMO_MODULES

    (metadata_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_bytes(wheel.read(metadata_name))
    core, extras = set(), {}
    for requirement in metadata.get_all("Requires-Dist"):
        name = _requirement_name(requirement)
        marker = re.search(r"extra == ['\"]([\w-]+)['\"]", requirement)
        if marker:
            extras.setdefault(marker.group(1), set()).add(name)
        else:
            core.add(name)
    assert core == {"jax", "pymc", "tqdm"}
    assert set(DEMO_MODULES) | {"cloudpickle"} <= extras["profile"]
    assert "numpyro" in extras["numpyro"]


def test_version_comes_from_the_metadata():
    # Written once, in pyproject.toml; a stale editable install needs `pip install -e .`.
    assert pymc_chunkpost.__version__ == importlib.metadata.version("pymc-chunkpost")
    assert pymc_chunkpost.__version__ == PYPROJECT["project"]["version"]
    written = [
        path.name
        for path in (ROOT / "pymc_chunkpost").rglob("*.py")
        if re.search(r"__version__\s*=\s*['\"]\d+\.\d+", path.read_text())
    ]
    assert written == []


#: The package's layers, top to bottom: a module imports only from its own layer or below
#: (docs/architecture.md). Modules of one layer may import each other, without cycles.
LAYERS = [
    ("face", {"__init__", "cli", "profiling", "numpyro"}),
    (
        "routes",
        {
            "_patch",
            "_posthoc",
            "_loo",
            "_predictive",
            "_numpyro",
            "_numpyro_patch",
            "_route",
            "_sample_store",
        },
    ),
    ("graph", {"_graph", "_samplers", "_pymc_model"}),
    ("entry", {"_entry", "_postprocess", "_options"}),
    ("planner", {"_planner", "_resources", "_tuner", "_library_fusions", "_tuning"}),
    ("executor", {"_executor", "_program", "_host_output", "_disk_output", "_executable_store"}),
    ("mathematics", {"_strategies", "_chunked", "_jaxpr_eval", "_psis"}),
    ("data", {"_problem", "_types"}),
    ("shared", {"_cache", "_disk", "_memory", "_progress", "_config", "_compat", "_messages"}),
    ("leaves", {"_version", "_extras"}),
]
PACKAGE = ROOT / "pymc_chunkpost"


def _modules() -> dict[str, Path]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    modules["profiling"] = PACKAGE / "profiling" / "__init__.py"
    return modules


def _imports(path: Path) -> set[str]:
    """The package's modules that `path` imports, at module level or inside functions."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:  # from . import _a, _b
                found |= {alias.name for alias in node.names}
            else:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pymc_chunkpost."):
            found.add(node.module.split(".")[1])
    return found


def test_imports_point_down():
    layer = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
    modules = _modules()
    unplaced = sorted(set(modules) - set(layer))
    assert unplaced == [], f"place these modules in a layer: {unplaced}"
    upward = [
        f"{name} ({LAYERS[layer[name]][0]}) imports {target} ({LAYERS[layer[target]][0]})"
        for name, path in modules.items()
        for target in _imports(path)
        if target in layer and layer[target] < layer[name]
    ]
    assert upward == []


def test_no_function_is_longer_than_80_lines():
    """Every function's body, its docstring aside, nested functions included."""
    import ast

    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:] or body
            lines = (node.end_lineno or node.lineno) - body[0].lineno + 1
            if lines > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    assert long == []
