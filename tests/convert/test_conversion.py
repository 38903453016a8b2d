import logging
import os

import pytest
from PIL import Image

from deployments.local import PROJECT_ROOT
from tasks.contracts.image_directory import ImageDirectory, Normalisation
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import sha256_file
from tests.convert.sample_sources import snapshot, write_flat
from tests.helpers import COLOURS, artifacts_and_run_count, write_class_folders, write_image


def test_class_folders_become_a_manifest_with_counts_and_hashes(colour_source, tmp_path):
    before = snapshot(colour_source)
    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    manifest = image_dir.manifest
    assert manifest.labeled and manifest.classes == sorted(COLOURS)
    assert manifest.counts == {name: 6 for name in COLOURS}
    assert len(image_dir) == 18 and manifest.quarantined == []
    for record in image_dir.records():
        assert record.sha256 == before[record.path] == sha256_file(image_dir.root / record.path)
        assert (record.width, record.height, record.mode) == (16, 16, "RGB")
        assert record.path.startswith(record.label + "/") and record.source_path == record.path
    assert manifest.class_folders == {name: name for name in COLOURS} and manifest.normalisation is None
    assert snapshot(colour_source) == before, "the source must not change"
    assert ImageDirectory(tmp_path / "out").manifest == manifest


def test_refuses_to_overwrite_a_folder_that_is_not_an_image_directory(colour_source, tmp_path):
    precious = tmp_path / "out" / "thesis.txt"
    precious.parent.mkdir()
    precious.write_text("do not delete")
    with pytest.raises(InvalidDatasetError, match="not an ImageDirectory"):
        convert_to_image_directory(colour_source, tmp_path / "out")
    assert precious.read_text() == "do not delete"


def test_reconverting_replaces_a_previous_image_directory(colour_source, tmp_path):
    convert_to_image_directory(colour_source, tmp_path / "out")
    write_image(colour_source / "green" / "extra.png", COLOURS["green"], seed=99)
    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")
    assert image_dir.manifest.counts["green"] == 7
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_no_images_at_all_is_a_clear_error(tmp_path):
    (tmp_path / "src" / "cats").mkdir(parents=True)
    (tmp_path / "src" / "cats" / "readme.txt").write_text("no images here")
    with pytest.raises(InvalidDatasetError, match="no readable images"):
        convert_to_image_directory(tmp_path / "src", tmp_path / "out")


def test_missing_source_and_nested_output_are_refused(colour_source, tmp_path):
    with pytest.raises(InvalidDatasetError, match="does not exist"):
        convert_to_image_directory(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(InvalidDatasetError, match="must not contain each other"):
        convert_to_image_directory(colour_source, colour_source / "out")


def test_content_hash_follows_files_and_labels(colour_source, tmp_path):
    first = convert_to_image_directory(colour_source, tmp_path / "a").manifest.content_hash
    again = convert_to_image_directory(colour_source, tmp_path / "b").manifest.content_hash
    (colour_source / "red" / "red_0.png").rename(colour_source / "blue" / "red_0.png")
    moved = convert_to_image_directory(colour_source, tmp_path / "c").manifest.content_hash
    assert first == again != moved


def test_unchanged_source_reuses_the_output_and_a_changed_one_rebuilds_it(colour_source, tmp_path):
    first = convert_to_image_directory(colour_source, tmp_path / "out")
    inode = (tmp_path / "out").stat().st_ino
    again = convert_to_image_directory(colour_source, tmp_path / "out")
    assert (tmp_path / "out").stat().st_ino == inode and again.manifest == first.manifest

    (colour_source / "red" / "red_0.png").write_bytes((colour_source / "red" / "red_1.png").read_bytes())
    changed = convert_to_image_directory(colour_source, tmp_path / "out")
    assert (tmp_path / "out").stat().st_ino != inode
    assert changed.manifest.conversion_hash != first.manifest.conversion_hash
    assert changed.manifest.content_hash != first.manifest.content_hash

    normalised = convert_to_image_directory(colour_source, tmp_path / "out", normalisation=Normalisation(max_side=8))
    assert normalised.manifest.conversion_hash != changed.manifest.conversion_hash


def test_normalisation_converts_to_rgb_and_bounds_the_longer_side(tmp_path):
    (tmp_path / "src").mkdir()
    Image.new("L", (64, 32), 200).save(tmp_path / "src" / "wide.png")
    Image.new("RGBA", (6, 12), (1, 2, 3, 4)).save(tmp_path / "src" / "small.webp")
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out", normalisation=Normalisation(max_side=16))
    records = {r.path: r for r in image_dir.records()}
    assert (records["wide.png"].width, records["wide.png"].height, records["wide.png"].mode) == (16, 8, "RGB")
    assert (records["small.webp"].width, records["small.webp"].height, records["small.webp"].mode) == (6, 12, "RGB")
    with Image.open(tmp_path / "out" / "wide.png") as stored:
        assert stored.size == (16, 8) and stored.mode == "RGB"
    assert records["wide.png"].sha256 == sha256_file(tmp_path / "out" / "wide.png")
    assert image_dir.manifest.normalisation == Normalisation(mode="RGB", max_side=16)
    with Image.open(tmp_path / "src" / "wide.png") as original:
        assert original.size == (64, 32) and original.mode == "L"


def test_awkward_class_names_stay_readable_and_get_safe_folders(tmp_path):
    names = ["golden retriever", "猫", "café", ".net", "a:b?", "CON", "Cat", "cat"]
    write_flat(tmp_path / "flat", {f"{i}.png": "red" for i in range(len(names))})
    (tmp_path / "labels.csv").write_text("image,label\n" + "".join(f'{i}.png,"{n}"\n' for i, n in enumerate(names)))

    image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "labels.csv"))

    folders = image_dir.manifest.class_folders
    assert sorted(image_dir.classes) == sorted(names)
    assert folders["golden retriever"] == "golden retriever" and folders["猫"] == "猫" and folders["café"] == "café"
    assert (folders[".net"], folders["a:b?"], folders["CON"]) == ("%2Enet", "a%3Ab%3F", "%43ON")
    assert folders["Cat"].casefold() != folders["cat"].casefold()
    on_disk = {p.name for p in (tmp_path / "out").iterdir() if p.is_dir()}
    assert on_disk == set(folders.values()) and not any(n.startswith(".") for n in on_disk)
    for path, index in image_dir.samples():
        assert path.is_file() and path.parent.name == folders[image_dir.classes[index]]


def test_empty_class_folder_and_single_class_are_warnings(tmp_path):
    write_class_folders(tmp_path / "src", 2, classes=("red",))
    (tmp_path / "src" / "blue").mkdir()
    (tmp_path / "src" / "green").mkdir()
    (tmp_path / "src" / "green" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    assert image_dir.classes == ["red"]
    assert image_dir.manifest.warnings == [
        "class folders without images, left out: 'blue'",
        "classes whose every image was quarantined, left out: 'green'",
        "only one class ('red'): training a classifier needs at least two",
    ]


def test_convert_task_reports_quarantine_and_is_not_retried_on_bad_input(prefect_server, colour_source, tmp_path):
    import asyncio

    from prefect import flow

    from tasks.convert.prefect_tasks import convert

    (colour_source / "red" / "notes.jpg").write_text("text")

    @flow
    def run(source: str):
        # The state, not the exception: the flow reports which run failed and how often it ran.
        state = convert(source, str(tmp_path / "out" / os.path.basename(source)), "train", return_state=True)
        return state.is_completed(), state.state_details.flow_run_id, state.state_details.task_run_id

    completed, *ids = run(str(colour_source))
    artifacts, runs = asyncio.run(artifacts_and_run_count(*ids))
    assert completed and runs == 1
    assert set(artifacts) == {"train-images", "train-quarantined"} and "red/notes.jpg" in artifacts["train-quarantined"]

    completed, *ids = run(str(tmp_path / "no-such-folder"))
    assert not completed and asyncio.run(artifacts_and_run_count(*ids)) == ({}, 1)


def test_an_image_directory_given_as_a_source_converts_without_its_manifest(colour_source, tmp_path):
    first = convert_to_image_directory(colour_source, tmp_path / "first")
    again = convert_to_image_directory(first.root, tmp_path / "again")
    assert again.manifest.quarantined == [] and again.manifest.counts == first.manifest.counts


def test_an_existing_file_as_output_is_refused_and_left_alone(colour_source, tmp_path):
    (tmp_path / "out.txt").write_text("keep me")
    with pytest.raises(InvalidDatasetError, match="is an existing file, not a folder"):
        convert_to_image_directory(colour_source, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "keep me"


def test_a_long_conversion_logs_a_progress_line_while_it_runs(colour_source, tmp_path, monkeypatch, caplog):
    import tasks.progress

    monkeypatch.setattr(tasks.progress, "PROGRESS_SECONDS", 0.001)  # the default is 10 s: every line, at once
    with caplog.at_level("INFO", logger="tasks.convert.conversion"):
        convert_to_image_directory(colour_source, tmp_path / "out", threads=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"converting {colour_source}: ")]
    assert lines, [r.getMessage() for r in caplog.records]
    counts = [line for line in lines if " images stored " in line]
    assert counts and counts[-1].endswith("(0 by an earlier attempt), 0 quarantined"), lines


KILLED_AFTER_50 = """
import os, signal, sys
import tasks.convert.storing as storing

store, calls = storing.store_image, []


def store_then_die(*args, **kwargs):
    calls.append(1)
    if len(calls) == 51:  # the 51st image: the process dies as a power cut would take it
        os.kill(os.getpid(), signal.SIGKILL)
    return store(*args, **kwargs)


storing.store_image = store_then_die
from tasks.convert.conversion import convert_to_image_directory

convert_to_image_directory(sys.argv[1], sys.argv[2], threads=1)
"""


@pytest.mark.integration
def test_a_conversion_killed_mid_way_goes_on_from_the_images_it_stored(tmp_path):
    import subprocess
    import sys

    source = write_class_folders(tmp_path / "photos", per_class=40)
    output = tmp_path / "images"
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_50, source, output], cwd=PROJECT_ROOT, check=False)
    assert killed.returncode == -9 and not output.exists()
    (partial,) = tmp_path.glob(".images.partial-*")
    assert len((partial / ".stored.jsonl").read_text().split()) == 50

    said, logger = logging.Handler(), logging.getLogger("tasks.convert.conversion")
    said.messages, said.emit = [], lambda record: said.messages.append(record.getMessage())
    logger.addHandler(said)
    level, logger.level = logger.level, logging.INFO
    try:
        resumed = convert_to_image_directory(source, output, threads=1)
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    assert f"{output}: 50 images stored by an earlier attempt are reused" in said.messages
    assert len(resumed) == 120 and resumed.manifest.counts == {c: 40 for c in COLOURS}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "photos"]  # the partial folder became the output
    assert sorted(p.name for p in output.iterdir()) == [
        "blue",
        "green",
        "image_directory.json",
        "image_index.npz",
        "red",
    ]
    fresh = convert_to_image_directory(source, tmp_path / "fresh")
    assert resumed.content_hash == fresh.content_hash and resumed.records() == fresh.records()
