"""The public Python API (flows/__init__.py PUBLIC): every name imports from ``flows`` and is the object its module
defines; the names ``from tasks import …`` gave before round three's move say where they went."""

import importlib
import subprocess
import sys

import pytest

import flows
from tasks import _MOVED


def test_every_public_name_imports_from_flows_and_is_the_defining_module_s():
    for name, module in flows.PUBLIC.items():
        assert getattr(flows, name) is getattr(importlib.import_module(module), name), name
    assert sorted(flows.__all__) == sorted(flows.PUBLIC)
    with pytest.raises(AttributeError):
        flows.no_such_name  # noqa: B018


def test_importing_flows_imports_neither_prefect_nor_torch():
    code = "import sys, flows; print(sorted({'prefect', 'torch'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_an_old_import_names_its_new_place():
    for name, place in _MOVED.items():
        with pytest.raises(ImportError, match=f"use 'from {place} import {name}'"):
            exec(f"from tasks import {name}")
        if place != "flows":
            assert hasattr(importlib.import_module(place), name), name
        else:
            assert name in flows.PUBLIC
    from tasks import convert  # a package still imports as one

    assert convert.__name__ == "tasks.convert"


def test_the_old_registry_command_says_where_it_moved_in_one_line():
    from deployments.local import PROJECT_ROOT

    moved = subprocess.run(
        [sys.executable, "-m", "tasks.registry", "list"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=False
    )
    assert moved.returncode == 2 and moved.stdout == ""
    assert moved.stderr == (
        "python -m tasks.registry: moved; the registry's command line is `image-classifier registry …` "
        "(or `python -m flows.registry …`), with the same arguments\n"
    )
