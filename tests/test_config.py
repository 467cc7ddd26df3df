"""`PlannerConfig`: every heuristic named once, with its reason and its evidence."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest

from pymc_chunkpost._support.config import EVIDENCE, PlannerConfig, configured, current


def test_every_field_has_a_reason_and_evidence():
    """Each field is described in the class docstring, in a sentence or more, and `EVIDENCE`
    names the heading of docs/ that holds its measurements (tests/test_docs_links.py checks
    that each one exists)."""
    doc = PlannerConfig.__doc__ or ""
    names = [field.name for field in dataclasses.fields(PlannerConfig)]
    for name in names:
        entry = re.search(rf"^ {{8}}{name}: (.*?)(?=^ {{8}}\w+: |^ {{4}}\S|\Z)", doc, re.M | re.S)
        assert entry is not None and len(entry.group(1).split()) >= 10, name
    assert sorted(EVIDENCE) == sorted(names)
    assert all(re.fullmatch(r"docs/\w+\.md#[\w-]+", where) for where in EVIDENCE.values())


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


def test_planning_reads_no_sysfs():
    """The chunk target is a fixed working set: nothing reads the CPU's cache size, at import
    or when a chunk is sized."""
    code = textwrap.dedent(
        """
        import sys
        opened = []
        sys.addaudithook(lambda event, args: event == "open" and opened.append(str(args[0])))
        import jax
        import numpy as np
        import pymc_chunkpost as pc
        pc.plan(lambda x: [x * 2.0], [np.ones((2, 50, 3))], "cpu", memory_budget=2**30)
        assert not [p for p in opened if p.startswith("/sys/devices/system/cpu/")], opened
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
