"""`PlannerConfig`: every heuristic named once, with its reason and evidence; read lazily."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest

from pymc_chunkpost import _config
from pymc_chunkpost._config import PlannerConfig, configured, current


def test_every_field_has_a_reason_and_an_anchor():
    """Each field is described in the class docstring, ending with its evidence's anchor in
    docs/strategies.md (named after the field)."""
    doc = PlannerConfig.__doc__ or ""
    for field in dataclasses.fields(PlannerConfig):
        anchor = field.name.replace("_", "-")
        entry = re.search(rf"^\s+{field.name}: (.*?)\(`#{anchor}`\)", doc, re.M | re.S)
        assert entry is not None and len(entry.group(1).split()) >= 8, field.name
        assert PlannerConfig.evidence(field.name) == f"docs/strategies.md#{anchor}"


def test_configured_replaces_and_restores():
    default = current()
    with configured(vmap_temp_bytes=0) as changed:
        assert current() is changed and changed.vmap_temp_bytes == 0
        with configured(tune_min_seconds=1.0):
            assert current().vmap_temp_bytes == 0 and current().tune_min_seconds == 1.0
        assert current() is changed
    assert current() is default
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.vmap_temp_bytes = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        with configured(no_such_heuristic=1):
            pass


def test_the_chunk_target_comes_from_the_cache_unless_set():
    default = PlannerConfig()
    expected = max(2 * _config.l2_cache_bytes(), 8 * 2**20)
    assert default.chunk_target() == expected
    assert PlannerConfig(target_chunk_bytes=2**20).chunk_target() == 2**20
    assert PlannerConfig(target_chunk_min_bytes=2**40).chunk_target() == 2**40


def test_importing_the_package_reads_no_sysfs():
    """The CPU's cache size is read when a chunk is first sized, not at import."""
    code = textwrap.dedent(
        """
        import sys
        opened = []
        sys.addaudithook(lambda event, args: event == "open" and opened.append(str(args[0])))
        import pymc_chunkpost
        assert not [p for p in opened if p.startswith("/sys/devices/system/cpu/cpu0/cache")], opened
        from pymc_chunkpost import _config
        _config.current().chunk_target()
        assert [p for p in opened if p.startswith("/sys/devices/system/cpu/cpu0/cache")], opened
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
