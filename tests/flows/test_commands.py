"""``image-classifier <command>`` (flows/cli.py ``main``): the commands listed, each reaching its module's
``main(argv)`` under its own name, a mistake in the command's name one line and exit status 2. In-process: the
console script itself (pyproject.toml) is run from a shell by tests/test_docs_commands.py."""

from __future__ import annotations

import sys
import types

import pytest

from flows.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: image-classifier")
    assert all(f"\n    {name} " in out for name in ("train", "score", "registry", "runs")), out


@pytest.mark.parametrize("argv", [["trian"], []])
def test_an_unknown_or_missing_command_is_one_line_and_exit_status_2(capsys, argv):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("image-classifier: error: "), err
    assert "train" in err if argv else "required: COMMAND" in err


@pytest.mark.parametrize("command", ["train", "score", "registry", "runs"])
def test_each_command_is_its_module_s_command_line_named_after_it(capsys, command):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: image-classifier {command} ")


def test_a_command_s_mistake_is_its_own_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--epochs", "0"])
    assert done.value.code == 2 and capsys.readouterr().err == "error: epochs: Input should be greater than 0\n"


def test_the_registry_command_returns_its_exit_status(capsys, tmp_path):
    assert main(["registry", "--registry", str(tmp_path / "registry"), "list"]) == 0
    assert capsys.readouterr().err.startswith("no models in ")
    assert main(["registry", "--registry", str(tmp_path / "registry"), "show", "nope/1"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_one_more_command_is_one_entry_and_a_main_without_prog_still_runs(monkeypatch):
    # A stand-in module (in sys.modules) for a command added later whose main takes argv only, as flows.runs' will.
    called = []
    module = types.ModuleType("tests_extra_command")
    module.main = lambda argv: called.append(argv) or 0
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(COMMANDS, "extra", (module.__name__, "a command added later"))
    assert main(["extra", "--keep", "3"]) == 0 and called == [["--keep", "3"]]


@pytest.mark.integration  # a fresh Python: what it imports
def test_the_flows_import_without_torch_so_a_mistake_is_answered_at_once():
    """torch comes in when scoring or the ONNX export needs it, in the flow's own thread: a command line that stops
    at a mistake, `prefect deploy` reading the flows' parameters and a train-node run waiting for its rendezvous
    never load it (it more than doubles `import flows.pipeline`'s CPU time)."""
    import subprocess

    heavy = "{'torch', 'torchvision'}"
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, flows.pipeline, flows.score, flows.train_node, flows.sweep, flows.sweep_trial; "
            f"print(sorted({heavy} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "[]", loaded
