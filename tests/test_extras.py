"""`require`: a missing optional module names the extra that installs it; nothing else is hidden."""

from __future__ import annotations

import sys

import pytest

from pymc_chunkpost._support.extras import MissingExtraError, require


def test_an_installed_module_is_returned():
    import json

    assert require("json") is json


@pytest.mark.parametrize("module", ["memray", "matplotlib.pyplot"])
def test_a_missing_module_names_the_extra(monkeypatch, module):
    top = module.partition(".")[0]
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, top, None)  # `import top` now fails, as if not installed
    with pytest.raises(MissingExtraError) as error:
        require(module, "profile")
    message = str(error.value)
    assert message.splitlines() == [message]
    assert message == (
        f'{top} is not installed; install it with: pip install "pymc-chunkpost[profile]"'
    )
    assert isinstance(error.value, ImportError)


def test_a_module_whose_own_import_is_missing_is_not_blamed_on_the_extra(tmp_path, monkeypatch):
    (tmp_path / "broken_tool.py").write_text("import not_a_module_anywhere_42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as error:
        require("broken_tool")
    assert not isinstance(error.value, MissingExtraError)
    assert error.value.name == "not_a_module_anywhere_42"
