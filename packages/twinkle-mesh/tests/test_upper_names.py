"""Names twinkle-mesh leads to in other distributions (``twinkle.Plugin``, a registry's hub
component) import them only when used, and say which distribution to install if missing."""

from __future__ import annotations

import sys

import pytest

import twinkle
from twinkle.utils import Registry
from twinkle.utils.upper import import_upper


def test_a_missing_distribution_is_an_import_error_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "twinkle.hub.plugin", None)
    with pytest.raises(ImportError, match=r"twinkle.Plugin needs .*pip install twinkle-data"):
        twinkle.Plugin  # noqa: B018
    with pytest.raises(ImportError, match=r"loss 'ms://org/repo:MyLoss' needs twinkle.hub.plugin"):
        Registry("loss").get("ms://org/repo:MyLoss")


def test_a_module_that_exists_but_lacks_a_dependency_reports_the_dependency(tmp_path, monkeypatch):
    (tmp_path / "upper_with_missing_dep.py").write_text("import not_an_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        import_upper("upper_with_missing_dep", "twinkle-data", "test")
    assert info.value.name == "not_an_installed_dependency"


def test_other_unknown_attributes_of_twinkle_stay_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'Pluggin'"):
        twinkle.Pluggin  # noqa: B018
    assert "Plugin" not in twinkle.__all__  # importing * stays cheap
