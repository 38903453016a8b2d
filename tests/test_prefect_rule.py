"""The Prefect rule (docs/development.md, "The Prefect rule"): Prefect — ``prefect`` and every package of its own
(``prefect_aws``, ``prefect_docker``, …) — is imported, at a module's top or inside a function, only in modules whose
file name starts with ``prefect`` (each package's ``prefect_tasks.py``, and a ``prefect_<part>.py`` beside it), in the
fan-out engine's two Prefect modules (tasks/fanout/engine.py and reruns.py; its plain decisions.py is checked like
any other), in flows/ and in deployments/. Every other module of tasks/ imports without Prefect, and importing it
brings in no Prefect, not even through the modules it imports.

Two checks: every import statement of tasks/ is read (the files parsed, as tests/test_layers.py does, those inside
functions too); and one fresh Python, in which Prefect cannot be imported, imports every module of tasks/ outside
those places and tells which of them reached for Prefect, and through which of our modules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.test_layers import ROOT, imported_names, module_files

# Part of the rule: shared leaves that ask Prefect for something only while Prefect runs them, each with its reason.
EXCEPTIONS: dict[str, str] = {
    "tasks.retrying": "stage_task is the one task decorator of every prefect_tasks.py: it imports Prefect when it "
    "decorates, which only a Prefect module does; its retry rule beside it is plain",
    "tasks.progress": "run_logger gives a plain function (a download, a conversion) the run's logger, asking Prefect "
    "only when Prefect is already loaded: it never brings Prefect into a process (the training worker)",
}
# Modules that break the rule for now, each with its reason; an allowance no module needs any more fails the test.
ALLOWED: dict[str, str] = {}


# The fan-out engine submits and watches child flow runs: Prefect is what it is about.
FANOUT_ENGINE = frozenset({"tasks.fanout.engine", "tasks.fanout.reruns"})


def is_prefect(name: str) -> bool:
    """``prefect`` itself or one of its own packages (``prefect_aws``), by a module's dotted name."""
    top = name.partition(".")[0]
    return top == "prefect" or top.startswith("prefect_")


def prefect_place(module: str, path: Path) -> bool:
    """A module that may import Prefect: a ``prefect*`` file, the fan-out engine, flows/ and deployments/."""
    return (
        path.name.startswith("prefect") or module in FANOUT_ENGINE or module.split(".")[0] in ("flows", "deployments")
    )


def plain_modules() -> dict[str, Path]:
    """The modules of tasks/ that import without Prefect."""
    return {m: p for m, p in module_files().items() if m.split(".")[0] == "tasks" and not prefect_place(m, p)}


def prefect_imports(module: str, path: Path, modules: dict[str, Path]) -> list[int]:
    """The lines of the module that import Prefect, at its top or inside a function."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(is_prefect(name) for name in imported_names(node, module, modules))
    ]


# Run in a fresh Python: a finder ahead of every other refuses Prefect and records the chain of our modules whose
# imports reached for it; then every module named on stdin is imported. Prints what it found, as JSON.
REFUSE_PREFECT = """
import importlib, json, sys, traceback

ROOT = sys.argv[1]
reached, failed, importing = {}, {}, [None]


class RefusePrefect:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top != "prefect" and not top.startswith("prefect_"):
            return None
        ours = [f"{f.filename[len(ROOT) + 1:]}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                if f.filename.startswith(ROOT + "/tasks/")]
        reached.setdefault(importing[0], ours)
        raise ImportError(f"{name}: refused (Prefect is not imported here)")


sys.meta_path.insert(0, RefusePrefect())
for module in json.load(sys.stdin):
    importing[0] = module
    try:
        importlib.import_module(module)
    except Exception as error:
        if module not in reached:
            failed[module] = f"{type(error).__name__}: {error}"
importing[0] = "(the refusal's own check)"
try:
    import prefect.flows
except ImportError:
    pass
print(json.dumps({"reached": reached, "failed": failed, "prefect_loaded": "prefect" in sys.modules}))
"""


def test_prefect_is_imported_only_in_its_places():
    modules = module_files()
    found = {m: lines for m, p in plain_modules().items() if (lines := prefect_imports(m, p, modules))}
    offending = {m: lines for m, lines in found.items() if m not in EXCEPTIONS and m not in ALLOWED}
    stale = (set(EXCEPTIONS) | set(ALLOWED)) - set(found)
    assert not offending, (
        "Prefect imported outside prefect*.py, the fan-out engine, flows/ and deployments/ (move the code into the "
        "package's prefect_tasks.py or a prefect_<part>.py beside it):\n"
        + "\n".join(
            f"  {modules[m].relative_to(ROOT)}:{line}: {m} imports Prefect"
            for m, lines in sorted(offending.items())
            for line in lines
        )
    )
    assert not stale, f"allowed to import Prefect but no longer does, remove them: {sorted(stale)}"


def test_no_plain_module_brings_prefect_in_when_imported():
    names = sorted(m for m in plain_modules() if m not in ALLOWED)
    assert "tasks.training.worker" in names  # the torchrun worker, which never loads Prefect
    result = subprocess.run(
        [sys.executable, "-c", REFUSE_PREFECT, str(ROOT)],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["reached"].pop("(the refusal's own check)") == [], "the finder refuses Prefect"
    assert not found["reached"], (
        "importing these modules imports Prefect (our modules on the way, outermost first):\n"
        + ("\n".join(f"  {m}: {' → '.join(chain)}" for m, chain in sorted(found["reached"].items())))
    )
    assert not found["failed"], f"modules that did not import: {found['failed']}"
    assert not found["prefect_loaded"]


def test_the_walk_sees_prefect_imported_inside_a_function_and_the_places_are_told_apart(tmp_path):
    assert prefect_place("tasks.launch.prefect_tasks", ROOT / "tasks/launch/prefect_tasks.py")
    assert prefect_place("tasks.outages.prefect_events", ROOT / "tasks/outages/prefect_events.py")
    assert prefect_place("tasks.fanout.engine", ROOT / "tasks/fanout/engine.py")
    assert not prefect_place("tasks.fanout.decisions", ROOT / "tasks/fanout/decisions.py")
    assert is_prefect("prefect_aws.s3") and is_prefect("prefect") and not is_prefect("prefectural")
    assert not prefect_place("tasks.launch.multinode", ROOT / "tasks/launch/multinode.py")
    leaf = tmp_path / "leaf.py"
    leaf.write_text("import os\n\n\ndef logger():\n    from prefect.logging import get_run_logger\n")
    assert prefect_imports("tasks.leaf", leaf, {"tasks.leaf": leaf}) == [5]
