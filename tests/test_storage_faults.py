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
import json, os, sys
from pathlib import Path
from tasks import convert_to_image_directory
from tasks.errors import OutputStorageError
from tasks.image_directory import Normalisation
output, source, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    folder = convert_to_image_directory(source, output / "images", normalisation=Normalisation(mode=mode) if mode else None)
    print(json.dumps({"images": len(folder.manifest.images), "quarantined": [q.model_dump() for q in folder.manifest.quarantined]}))
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
from tasks.scores_table import write_scores
output, rows = Path(sys.argv[1]), int(sys.argv[2])
(output / "scores.csv").write_text("an older, complete table")
table = pd.DataFrame({"image": [f"img-{i:07d}.png" for i in range(rows)], "Scored Labels": "cat"})
try:
    write_scores(table, str(output / "scores.csv"))
    print(json.dumps({"written": True}))
except OutputStorageError as error:
    print(json.dumps({"error": str(error), "left": sorted(os.listdir(output)), "old": (output / "scores.csv").read_text()}))
"""


def on_tmpfs(mount: Path, size: str, code: str, *args: str) -> dict:
    """Run ``code`` with ``mount`` then ``args`` as its arguments, on a tmpfs of ``size`` mounted at ``mount`` (in
    a mount namespace of its own); what it printed last, as JSON."""
    mount.mkdir()
    script = 'mount -t tmpfs -o size="$0" tmpfs "$1" && m="$1" && py="$2" && code="$3" && shift 3 && exec "$py" -c "$code" "$m" "$@"'
    return run_script(["unshare", "-rm", "sh", "-c", script, size, str(mount), sys.executable], code, *args)


def run_script(launcher: list[str], code: str, *args: str) -> dict:
    """``launcher`` then ``-c code args`` (launcher ending in a Python); what the script printed last, as JSON."""
    result = subprocess.run(
        [*launcher, code, *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def convert_on_tmpfs(source: Path, mount: Path, size: str, mode: str = "") -> dict:
    """The conversion of ``source`` into a tmpfs of ``size`` mounted at ``mount``."""
    return on_tmpfs(mount, size, CONVERT, str(source), mode)


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


def test_a_disk_that_fills_mid_way_stops_the_conversion_quarantining_no_image(tmp_path, tmpfs):
    # 60 images of about 10 KB (600 KB: the check before the work lets them in a 1 MB disk), stored as RGB
    # (about 30 KB each, 1.8 MB): the disk fills about half-way.
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    outcome = convert_on_tmpfs(source, tmpfs, "1m", mode="RGB")
    assert "quarantined" not in outcome, outcome
    error = outcome["error"]
    assert error.startswith(f"cannot write the converted images to {tmpfs / 'images'}: [Errno 28] No space left")
    assert "MB free there" in error and "more needed" in error
    assert outcome["left"] == []  # no manifest, no half-filled folder a later stage could take as finished


def test_a_disk_too_small_for_the_images_is_refused_before_any_work(tmp_path, tmpfs):
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    outcome = convert_on_tmpfs(source, tmpfs, "256k")
    assert outcome["error"].startswith(f"not enough space for the conversion at {tmpfs}/.images.staging-")
    assert "0.6 MB needed" in outcome["error"] and "0.2 MB free" in outcome["error"], outcome["error"]
    assert outcome["left"] == []


def test_the_same_conversion_succeeds_once_there_is_room(tmp_path, tmpfs):
    source = write_noise(tmp_path / "photos", per_class=30, side=100)
    outcome = convert_on_tmpfs(source, tmpfs, "4m", mode="RGB")
    assert outcome == {"images": 60, "quarantined": []}


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
from tasks.model_directory import TrainingMetrics
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


def test_a_checkpoint_that_does_not_fit_says_so_in_its_first_line(tmpfs):
    outcome = on_tmpfs(tmpfs, "256k", SAVE_CHECKPOINT, "save")
    first = outcome["error"].splitlines()[0]
    assert first.startswith(f"cannot write the epoch 0 checkpoint to {tmpfs / 'checkpoint.pt'}: [Errno 28] No space")
    assert "about 0.5 MB needed" in first and "MB free there" in first
    assert outcome["left"] == []  # no half-written checkpoint for a resumed run to trip on


def test_training_refuses_before_the_first_epoch_where_two_checkpoints_cannot_fit(tmpfs):
    outcome = on_tmpfs(tmpfs, "1m", SAVE_CHECKPOINT, "check")
    assert outcome["error"].startswith(f"not enough space for training's checkpoints at {tmpfs}: about 1.3 MB needed")
