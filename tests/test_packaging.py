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


#: The package's layers, top to bottom, each a folder (or, at the top, the public modules): a
#: module imports only from its own layer or below (docs/architecture.md). Modules of one layer
#: may import each other, without cycles. The pymc and NumPyro routes are one layer of two
#: folders that never import each other.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("face", ("__init__.py", "cli.py", "numpyro.py", "profiling/")),
    ("routes", ("_pymc/", "_numpyro/")),
    ("statistics", ("_stats/",)),
    ("seam", ("_frontend/",)),
    ("engine: the call", ("_engine/call/",)),
    ("engine: plan", ("_engine/plan/",)),
    ("engine: execute", ("_engine/execute/",)),
    ("engine: kernels", ("_engine/kernels/",)),
    ("engine: data", ("_engine/data/",)),
    ("store", ("_store/",)),
    ("support", ("_support/",)),
]
#: Folders of one layer that must not import each other.
SIBLINGS = {("_pymc/", "_numpyro/"), ("_numpyro/", "_pymc/")}
PACKAGE = ROOT / "pymc_chunkpost"
MAX_LINES = 700


def _room(path: Path) -> str:
    """The entry of `LAYERS` that holds `path` (a module of the package)."""
    rel = path.relative_to(PACKAGE).as_posix()
    rooms = [room for _, rooms in LAYERS for room in rooms if rel == room or rel.startswith(room)]
    assert rooms, f"place {rel} in a folder of LAYERS"
    return max(rooms, key=len)


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name below the package ("_engine.plan.tuner")."""
    return {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent == PACKAGE or p.parent.name == "profiling"
    }


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports, at module level or inside functions."""
    import ast

    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if path == PACKAGE / "__init__.py":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = package[: len(package) - (node.level - 1)]
            stem = [*base, *(node.module.split(".") if node.module else [])]
            targets = [".".join([*stem, alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pymc_chunkpost."):
            stem = node.module.split(".")[1:]
            targets = [".".join([*stem, alias.name]) for alias in node.names]
        else:
            continue
        for target in targets:  # the module itself, or the module a name is taken from
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found - {name}


def _folder_inits() -> list[Path]:
    """The `__init__.py` of each folder below the top (profiling's aside): docstrings only."""
    return [
        p
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and p.parent.name != "profiling"
    ]


def test_every_module_sits_in_a_layer_folder():
    inits = set(_folder_inits())
    for path in PACKAGE.rglob("*.py"):
        if path not in inits:
            _room(path)


def test_folders_say_what_they_hold_and_import_nothing():
    import ast

    for path in _folder_inits():
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.relative_to(PACKAGE)}: say what the folder holds"
        assert len(tree.body) == 1, f"{path.relative_to(PACKAGE)}: a docstring only"


def test_imports_point_down():
    index = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}
    modules = _modules()
    upward, across = [], []
    for name, path in modules.items():
        room = _room(path)
        for target in _imports(name, path, modules):
            there = _room(modules[target])
            if index[there] < index[room]:
                upward.append(f"{name} ({room}) imports {target} ({there})")
            elif (room, there) in SIBLINGS:
                across.append(f"{name} ({room}) imports {target} ({there})")
    assert upward == []
    assert across == []


def test_no_module_is_over_700_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


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
