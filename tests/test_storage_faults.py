"""Storage faults are never taken for bad images or half results: a real small filesystem (a tmpfs mounted in a
private mount namespace with `unshare`) that fills up mid-way, and a source file this process may not read."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deployments.local import PROJECT_ROOT

CONVERT = """
import json, logging, os, sys
from pathlib import Path
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import OutputStorageError
from tasks.contracts.image_directory import Normalisation
output, source, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
said = []
logging.getLogger("tasks.convert.conversion").addHandler(logging.Handler())
logging.getLogger("tasks.convert.conversion").handlers[0].emit = lambda record: said.append(record.getMessage())
logging.getLogger("tasks.convert.conversion").setLevel(logging.INFO)
try:
    folder = convert_to_image_directory(source, output / "images", normalisation=Normalisation(mode=mode) if mode else None)
    print(json.dumps({"images": len(folder), "quarantined": [q.model_dump() for q in folder.manifest.quarantined],
                      "said": said, "left": sorted(os.listdir(output)), "files": sorted(p.name for p in folder.root.rglob("*"))}))
except OutputStorageError as error:
    print(json.dumps({"error": str(error), "left": sorted(os.listdir(output))}))
"""


def can_mount_tmpfs() -> str | None:
    """None when `unshare` can mount a tmpfs here, else why not."""
    if not shutil.which("unshare"):
        return "no unshare command on this host"
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True, text=True
    )
    return None if probe.returncode == 0 else f"cannot mount a tmpfs in a private namespace: {probe.stderr.strip()}"


WRITE_SCORES = """
import json, os, sys
from pathlib import Path
import pandas as pd
from tasks.errors import OutputStorageError
from tasks.contracts.scores_table import write_scores
output, rows = Path(sys.argv[1]), int(sys.argv[2])
(output / "scores.csv").write_text("an older, complete table")
table = pd.DataFrame({"image": [f"img-{i:07d}.png" for i in range(rows)], "Scored Labels": "cat"})
try:
    write_scores(table, str(output / "scores.csv"))
    print(json.dumps({"written": True}))
except OutputStorageError as error:
    print(json.dumps({"error": str(error), "left": sorted(os.listdir(output)), "old": (output / "scores.csv").read_text()}))
"""


def on_tmpfs(mount: Path, size: str, code: str, *args: str, then: str = "") -> dict | list[dict]:
    """Run ``code`` with ``mount`` then ``args`` as its arguments, on a tmpfs of ``size`` mounted at ``mount`` (in
    a mount namespace of its own); what it printed, as JSON. With ``then`` (a size), the tmpfs is then grown to it
    and ``code`` run again: both outcomes."""
    mount.mkdir()
    run = '"$py" -c "$code" "$m" "$@"'
    again = f' && mount -o remount,size={then} "$m" && {run}' if then else ""
    script = f'mount -t tmpfs -o size="$0" tmpfs "$1" && m="$1" && py="$2" && code="$3" && shift 3 && {run}{again}'
    launcher = ["unshare", "-rm", "sh", "-c", script, size, str(mount), sys.executable]
    return run_script(launcher, code, *args, outcomes=2 if then else 1)


def run_script(launcher: list[str], code: str, *args: str, outcomes: int = 1) -> dict | list[dict]:
    """``launcher`` then ``-c code args`` (launcher ending in a Python); what the script printed last, as JSON
    (the last ``outcomes`` lines, when more than one)."""
    result = subprocess.run(
        [*launcher, code, *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        # A guard against a hang, not a speed check: beside the suite's other files on a few cores these trainings
        # take many times what they take alone.
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()[-outcomes:]]
    return lines[0] if outcomes == 1 else lines


def convert_on_tmpfs(source: Path, mount: Path, size: str, mode: str = "", then: str = "") -> dict | list[dict]:
    """The conversion of ``source`` into a tmpfs of ``size`` mounted at ``mount`` (then, grown to ``then``, again)."""
    return on_tmpfs(mount, size, CONVERT, str(source), mode, then=then)


def write_noise(folder: Path, per_class: int, side: int) -> Path:
    """Two classes of grey noise PNGs (they barely compress: about side² bytes each, three times that in RGB)."""
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8), "L").save(folder / label / f"{i}.png")
    return folder


@pytest.fixture
def tmpfs(tmp_path):
    if reason := can_mount_tmpfs():
        pytest.skip(reason)
    return tmp_path / "mount"


def test_a_disk_that_fills_mid_way_stops_the_conversion_and_a_rerun_goes_on_from_what_was_stored(tmp_path, tmpfs):
    # 60 images of about 10 KB (600 KB: the check before the work lets them in a 1 MB disk), stored as RGB
    # (about 30 KB each, 1.8 MB): the disk fills about half-way. Then it grows to 4 MB and the same call runs again.
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    stopped, resumed = convert_on_tmpfs(source, tmpfs, "1m", mode="RGB", then="4m")
    assert "quarantined" not in stopped, stopped
    error = stopped["error"]
    assert error.startswith(f"cannot write the converted images to {tmpfs / 'images'}: [Errno 28] No space left")
    assert "MB free there" in error and "more needed" in error
    # No manifest, no folder a later stage could take as finished: only the hidden partial folder it goes on from.
    assert len(stopped["left"]) == 1 and stopped["left"][0].startswith(".images.partial-"), stopped
    kept = int(error.split("The ")[-1].split(" images stored so far are kept in")[0])
    assert 10 < kept < 60, error
    assert resumed["images"] == 60 and resumed["quarantined"] == [], resumed
    assert resumed["said"] == [f"{tmpfs / 'images'}: {kept} images stored by an earlier attempt are reused"]
    assert resumed["left"] == ["images"]  # the partial folder became the output
    assert ".stored.jsonl" not in resumed["files"] and "image_directory.json" in resumed["files"]


def test_a_disk_too_small_for_the_images_is_refused_before_any_work(tmp_path, tmpfs):
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    outcome = convert_on_tmpfs(source, tmpfs, "256k")
    assert outcome["error"].startswith(f"not enough space for the conversion at {tmpfs}/.images.partial-")
    assert "0.6 MB needed" in outcome["error"] and "0.2 MB free" in outcome["error"], outcome["error"]
    assert [name[:16] for name in outcome["left"]] == [".images.partial-"]  # empty: nothing was stored


UNPACK = """
import json, sys, tempfile
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import OutputStorageError
tempfile.tempdir = sys.argv[1]  # as TMPDIR would: the archive is unpacked on the small disk
try:
    convert_to_image_directory(sys.argv[2], sys.argv[3])
    print(json.dumps({"converted": True}))
except OutputStorageError as error:
    print(json.dumps({"error": str(error)}))
"""


def test_an_archive_unpacked_onto_a_full_temporary_disk_is_a_storage_fault_not_a_damaged_archive(tmp_path, tmpfs):
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    archive = Path(shutil.make_archive(str(tmp_path / "photos"), "zip", source))
    outcome = on_tmpfs(tmpfs, "256k", UNPACK, str(archive), str(tmp_path / "images"))
    assert outcome["error"].startswith(f"no space left to unpack {archive} into the temporary folder {tmpfs}/")
    assert "[Errno 28] No space left on device" in outcome["error"] and "TMPDIR" in outcome["error"]
    assert not (tmp_path / "images").exists()


def test_a_source_file_this_process_may_not_read_is_unreadable_not_damaged(tmp_path):
    source = write_noise(tmp_path / "photos", per_class=2, side=16)
    locked = source / "cat" / "0.png"
    locked.chmod(0)
    # As root, file modes do not bind: the conversion runs without the capabilities that override them.
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if drop and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: no way to make a file unreadable to the conversion")
    outcome = run_script([*drop, sys.executable, "-c"], CONVERT, str(tmp_path), str(source), "")
    assert outcome["images"] == 3
    assert outcome["quarantined"] == [{"path": "cat/0.png", "reason": "unreadable file: [Errno 13] Permission denied"}]


def test_a_scores_table_that_does_not_fit_fails_clearly_and_leaves_the_complete_one_in_place(tmp_path, tmpfs):
    outcome = on_tmpfs(tmpfs, "256k", WRITE_SCORES, "50000")  # about 1 MB of CSV
    assert outcome["error"].startswith(f"cannot write the scores table {tmpfs / 'scores.csv'}: [Errno 28]")
    assert "MB needed" in outcome["error"] and "MB free there" in outcome["error"]
    assert outcome["left"] == ["scores.csv"] and outcome["old"] == "an older, complete table"


SAVE_CHECKPOINT = """
import json, sys
from pathlib import Path
import torch
from torch import nn
from tasks.errors import OutputStorageError
from tasks.contracts.model_directory import TrainingMetrics
from tasks.training.checkpoint import check_space_for_checkpoints, save_checkpoint
output, step = Path(sys.argv[1]), sys.argv[2]
model = nn.Linear(256, 256)  # 257 KB of weights
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(1, 256)).sum().backward()
optimizer.step()  # the momentum buffers: as much again
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
try:
    if step == "check":
        check_space_for_checkpoints(output, model)
    else:
        save_checkpoint(output / "checkpoint.pt", model, optimizer, scheduler, TrainingMetrics(), ["a", "b"], {})
    print(json.dumps({"saved": True}))
except OutputStorageError as error:
    print(json.dumps({"error": str(error), "left": sorted(p.name for p in output.iterdir())}))
"""


@pytest.mark.integration  # a Python of its own in a mount namespace with a small tmpfs
def test_a_checkpoint_that_does_not_fit_says_so_in_its_first_line(tmpfs):
    outcome = on_tmpfs(tmpfs, "256k", SAVE_CHECKPOINT, "save")
    first = outcome["error"].splitlines()[0]
    assert first.startswith(f"cannot write the epoch 0 checkpoint to {tmpfs / 'checkpoint.pt'}: [Errno 28] No space")
    assert "about 0.5 MB needed" in first and "MB free there" in first
    assert outcome["left"] == []  # no half-written checkpoint for a resumed run to trip on


@pytest.mark.integration  # a Python of its own in a mount namespace with a small tmpfs
def test_training_refuses_before_the_first_epoch_where_two_checkpoints_cannot_fit(tmpfs):
    outcome = on_tmpfs(tmpfs, "1m", SAVE_CHECKPOINT, "check")
    assert outcome["error"].startswith(f"not enough space for training's checkpoints at {tmpfs}: about 1.3 MB needed")


TRAIN_TILL_FULL = """
import json, shutil, sys
from pathlib import Path
from tasks.errors import OutputStorageError
from tasks.launch.torchrun_launcher import launch_training
from tasks.model.untrained import write_untrained_model_directory
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
mount, train, validation, spec = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
spec = write_untrained_model_directory(spec, ModelSpec(architecture="shufflenet_v2_x0_5", pretrained=False))
output, filler, outcome = mount / "model", mount / "filler", {}
params = TrainingParams(epochs=2, batch_size=4, processes_per_node=1, device="cpu")
quiet = lambda level, line: None
launch_training(TrainingFolders(train, validation, spec, output), params.model_copy(update={"epochs": 1}), log=quiet)

def fill_once_training_starts(level, line):
    # Logged after the check for room and before the first batch: the next save is a whole epoch away.
    if "INFO training shufflenet_v2_x0_5 on" in line and not filler.exists():
        filler.write_bytes(bytes(shutil.disk_usage(mount).free - 256 * 1024))

try:
    launch_training(TrainingFolders(train, validation, spec, output), params, log=fill_once_training_starts)
except OutputStorageError as error:
    outcome["error"] = str(error)
    outcome["left"] = sorted(p.name for p in output.rglob("*.tmp"))
filler.unlink()
lines = []
model = launch_training(TrainingFolders(train, validation, spec, output), params, log=lambda level, line: lines.append(line))
outcome["epochs"] = len(model.metrics().epochs)
outcome["resumed"] = [line.split("INFO ")[-1] for line in lines if "resuming from" in line]
print(json.dumps(outcome))
"""


@pytest.mark.slow
def test_a_training_whose_disk_fills_says_so_first_and_a_rerun_resumes_from_its_last_checkpoint(
    tmp_path, tmpfs, digits_image_dirs
):
    # 300 images: an epoch takes long enough for the disk to be filled while it runs.
    train, validation = digits_image_dirs
    outcome = on_tmpfs(tmpfs, "16m", TRAIN_TILL_FULL, str(train), str(validation), str(tmp_path / "spec"))
    first = outcome["error"].splitlines()[0]
    checkpoint = tmpfs / "model" / "checkpoints" / "last.pt"
    # Epoch 2's first write fails: its best weights when it is the best epoch so far (written first), else its
    # checkpoint (which epoch is best varied between runs of this test).
    written = [f"the epoch 2 best weights to {tmpfs / 'model' / 'model.pt'}", f"the epoch 2 checkpoint to {checkpoint}"]
    assert any(first.startswith(f"cannot write {what}: [Errno 28] No space left") for what in written), first
    assert "MB needed" in first and "MB free there" in first, first
    assert outcome["left"] == []  # the epoch 1 checkpoint is whole; no half-written one beside it
    assert outcome["epochs"] == 2
    assert outcome["resumed"] == [f"resuming from {checkpoint} after epoch 1"]


REGISTER = """
import json, os, sys
from tasks.errors import OutputStorageError
from tasks.contracts.model_directory import ModelDirectory
from tasks.registry import list_versions, register_model
registry = os.path.join(sys.argv[1], "registry")
try:
    register_model(registry, "photos", ModelDirectory(sys.argv[2]), metrics={}, params={}, datasets={})
    print(json.dumps({"registered": True}))
except OutputStorageError as error:
    files = sorted(os.path.relpath(os.path.join(d, f), registry) for d, _, fs in os.walk(registry) for f in fs)
    print(json.dumps({"error": str(error), "versions": [r.version for r in list_versions(registry, "photos")], "files": files}))
"""


def test_registration_on_a_full_disk_registers_nothing_and_says_so_first(trained_model, tmpfs):
    size = sum(f.stat().st_size for f in trained_model.iterdir() if f.is_file())
    outcome = on_tmpfs(tmpfs, str(size // 2), REGISTER, str(trained_model))
    first = outcome["error"].splitlines()[0]
    assert first.startswith(f"nothing was registered: cannot write photos's files to the registry {tmpfs}/registry")
    assert "[Errno 28] No space left on device" in first and "MB needed" in first, first
    assert outcome["versions"] == []
    # Only the claim of version 1 stays (its number is never reused); no model file is left behind.
    assert [f for f in outcome["files"] if f != "photos/1/claim.json"] == [], outcome["files"]
