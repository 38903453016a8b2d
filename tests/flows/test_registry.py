"""The registry's command line (flows/registry.py) on both backends, a local folder and the real HTTP S3 endpoint:
what it prints, its one-line refusals, ``--json``, and a reader that goes away."""

import json
import os
import subprocess
import sys

import pytest

from tasks.registry import list_versions
from tests.helpers import NAME, register_test_model, registry_cli

pytestmark = pytest.mark.integration


def test_the_command_line(registry, trained_model):
    empty = registry_cli(registry, "list")
    assert empty.returncode == 0 and empty.stdout == ""
    assert f"no models in {registry}: none registered there yet" in empty.stderr
    for accuracy in (0.8, 0.93):
        register_test_model(registry, trained_model, accuracy=accuracy)
    assert registry_cli(registry, "list").stdout.split() == [NAME]
    moved = registry_cli(registry, "alias", "set", NAME, "production", "1")
    assert moved.returncode == 0 and f"{NAME}@production -> version 1" in moved.stdout
    assert "model card of colours-resnet18 not updated: no Prefect API configured" in moved.stdout
    assert "(was version 1)" in registry_cli(registry, "alias", "set", NAME, "production", "2").stdout
    assert registry_cli(registry, "tag", f"{NAME}/1", "reviewed=yes").returncode == 0
    assert registry_cli(registry, "archive", f"{NAME}/1").returncode == 0

    shown = json.loads(registry_cli(registry, "show", f"{NAME}@production").stdout)
    assert (shown["version"], shown["aliases"], shown["metrics"]["accuracy"]) == (2, ["production"], 0.93)
    lines = registry_cli(registry, "list", NAME).stdout.splitlines()
    assert lines[0].startswith(f"{NAME}/1\t") and "reviewed=yes" in lines[0] and lines[0].endswith("(archived)")
    assert lines[1].startswith(f"{NAME}/2\t") and "@production" in lines[1] and "accuracy 0.93" in lines[1]
    assert registry_cli(registry, "search", "--where", "accuracy>=0.9").stdout.split("\t")[0] == f"{NAME}/2"
    assert registry_cli(registry, "search", "--tag", "reviewed=yes", "--archived").stdout.split("\t")[0] == f"{NAME}/1"

    refused = registry_cli(registry, "delete", f"{NAME}/2")
    assert refused.returncode == 2 and "alias production points at it" in refused.stderr
    bad = registry_cli(registry, "search", "--where", "accuracy=>1")
    assert bad.returncode == 2 and "is not allowed: use <figure><op><number>" in bad.stderr
    unknown = registry_cli(registry, "search", "--where", "acc>=0.9")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "no version records the figure 'acc' (did you mean 'accuracy'?); figures: accuracy" in unknown.stderr
    typo = registry_cli(registry, "show", f"{NAME}x@production", in_process=False)  # the console a user sees
    assert typo.returncode == 2 and f"no model named '{NAME}x'" in typo.stderr and f"models: {NAME}" in typo.stderr

    # For scripts: --json; and a reader that goes away (`show ... | head`) is no error.
    listed = json.loads(registry_cli(registry, "--json", "list", NAME).stdout)
    assert [(v["version"], v["archived"]) for v in listed] == [(1, True), (2, False)]
    assert json.loads(registry_cli(registry, "--json", "search", "--where", "accuracy>=0.9").stdout)[0]["version"] == 2
    assert json.loads(registry_cli(registry, "--json", "list").stdout) == [NAME]
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command writes: its first write meets a broken pipe
    closed = subprocess.run(
        [sys.executable, "-m", "flows.registry", "--registry", registry, "show", f"{NAME}/2"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write_end)
    assert (closed.returncode, closed.stderr) == (0, "")
    assert not ({"FutureWarning", "EventsWorker"} & set(typo.stderr.split())), "no Prefect noise without a run"

    assert registry_cli(registry, "alias", "unset", NAME, "production").returncode == 0
    assert registry_cli(registry, "delete", f"{NAME}/2").stdout.startswith(f"deleted {NAME}/2")
    assert list_versions(registry, NAME) == [1]
