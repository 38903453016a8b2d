import os
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks import ImageDirectory, InvalidDatasetError, NotLabeledDatasetError, convert_to_image_directory
from tasks.fileio import sha256_file
from tasks.image_directory import MANIFEST_NAME, Normalisation
from tests.conftest import COLOURS, write_class_folders, write_image


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_class_folders_become_a_manifest_with_counts_and_hashes(colour_source, tmp_path):
    before = snapshot(colour_source)
    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    manifest = image_dir.manifest
    assert manifest.labeled and manifest.classes == sorted(COLOURS)
    assert manifest.counts == {name: 6 for name in COLOURS}
    assert len(image_dir) == 18 and manifest.quarantined == []
    for record in manifest.images:
        assert record.sha256 == before[record.path] == sha256_file(image_dir.root / record.path)
        assert (record.width, record.height, record.mode) == (16, 16, "RGB")
        assert record.path.startswith(record.label + "/") and record.source_path == record.path
    assert manifest.class_folders == {name: name for name in COLOURS} and manifest.normalisation is None
    assert snapshot(colour_source) == before, "the source must not change"
    assert ImageDirectory(tmp_path / "out").manifest == manifest


def test_zip_with_wrapper_folders_finds_the_class_folders(colour_source, tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in colour_source.rglob("*.png"):
            zf.write(path, f"export/photos/{path.relative_to(colour_source).as_posix()}")
        zf.writestr("__MACOSX/export/._junk.png", b"resource fork")
        zf.writestr("export/photos/.DS_Store", b"\0\0\0\1Bud1")
        zf.writestr("export/photos/red/Thumbs.db", b"\xd0\xcf\x11\xe0")
        zf.writestr("export/photos/red/._red_0.png", b"AppleDouble")
    image_dir = convert_to_image_directory(archive, tmp_path / "out")
    assert image_dir.classes == sorted(COLOURS) and len(image_dir) == 18
    assert image_dir.manifest.quarantined == [] and image_dir.manifest.source == str(archive)


def test_flat_folder_is_unlabeled(tmp_path):
    for i in range(3):
        write_image(tmp_path / "flat" / f"img{i}.JPG", (10, 20, 30), seed=i, fmt="JPEG")
    image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / "out")
    assert not image_dir.labeled and image_dir.classes == [] and len(image_dir) == 3
    assert all(label == -1 for _, label in image_dir.samples())


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


def test_image_directory_without_manifest_is_refused(tmp_path):
    with pytest.raises(InvalidDatasetError, match=MANIFEST_NAME):
        ImageDirectory(tmp_path)


def write_pixel_bomb(path: Path, side: int = 20_000) -> Path:
    """A valid 1-bit PNG of side x side pixels (2.2x Pillow's MAX_IMAGE_PIXELS) that is ~50 kB on disk."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    compressor, row = zlib.compressobj(9), b"\0" * (1 + side // 8)
    pixels = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def test_bad_files_are_quarantined_with_their_reason(colour_source, tmp_path):
    red, blue = colour_source / "red", colour_source / "blue"
    (red / "noise.png").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (red / "notes.jpg").write_text("this is text, not a JPEG")
    (red / "empty.png").write_bytes(b"")
    png = (blue / "blue_0.png").read_bytes()
    (blue / "truncated.png").write_bytes(png[: len(png) // 2])
    jpeg = write_image(tmp_path / "big.jpg", COLOURS["blue"], size=256, fmt="JPEG").read_bytes()
    (blue / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    write_pixel_bomb(blue / "bomb.png")
    (red / "README.txt").write_text("photos from the lab")
    before = snapshot(colour_source)

    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    reasons = {q.path: q.reason for q in image_dir.manifest.quarantined}
    assert reasons["red/noise.png"] == reasons["red/notes.jpg"] == "not an image: Pillow cannot identify the file's format"
    assert reasons["red/empty.png"] == "empty file (0 bytes)"
    assert reasons["blue/truncated.png"].startswith("damaged or truncated image")
    assert reasons["blue/truncated.jpg"].startswith("damaged or truncated image")
    assert reasons["blue/bomb.png"].startswith("over Pillow's decompression-bomb guard")
    assert reasons["red/README.txt"].startswith("not an image type this stage reads (.bmp, .jpeg")
    assert len(reasons) == 7 and image_dir.manifest.counts == {name: 6 for name in COLOURS}
    assert not (tmp_path / "out" / "red" / "notes.jpg").exists() and snapshot(colour_source) == before


def test_every_image_type_is_read_whatever_the_case_of_its_extension(tmp_path):
    formats = {".jpg": "JPEG", ".JPEG": "JPEG", ".png": "PNG", ".ppm": "PPM", ".BMP": "BMP", ".tif": "TIFF",
               ".Tiff": "TIFF", ".webp": "WEBP"}  # fmt: skip
    for i, (ext, fmt) in enumerate(formats.items()):
        write_image(tmp_path / "src" / "colour" / f"image{i}{ext}", COLOURS["red"], seed=i, fmt=fmt)
    (tmp_path / "src" / "grey").mkdir()
    Image.new("L", (12, 10), 128).save(tmp_path / "src" / "grey" / "image.PGM", format="PPM")
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    assert image_dir.manifest.counts == {"colour": 8, "grey": 1} and image_dir.manifest.quarantined == []
    grey = next(r for r in image_dir.manifest.images if r.label == "grey")
    assert (grey.width, grey.height, grey.mode) == (12, 10, "L")


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
    records = {r.path: r for r in image_dir.manifest.images}
    assert (records["wide.png"].width, records["wide.png"].height, records["wide.png"].mode) == (16, 8, "RGB")
    assert (records["small.webp"].width, records["small.webp"].height, records["small.webp"].mode) == (6, 12, "RGB")
    with Image.open(tmp_path / "out" / "wide.png") as stored:
        assert stored.size == (16, 8) and stored.mode == "RGB"
    assert records["wide.png"].sha256 == sha256_file(tmp_path / "out" / "wide.png")
    assert image_dir.manifest.normalisation == Normalisation(mode="RGB", max_side=16)
    with Image.open(tmp_path / "src" / "wide.png") as original:
        assert original.size == (64, 32) and original.mode == "L"


def write_flat(folder: Path, names_and_colours: dict[str, str]) -> Path:
    for i, (name, colour) in enumerate(names_and_colours.items()):
        write_image(folder / name, COLOURS[colour], seed=i)
    return folder


def test_flat_folder_with_a_labels_csv(tmp_path):
    write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "red", "c.png": "blue", "d.png": "blue", "e.png": "red"})
    labels = tmp_path / "labels.csv"
    labels.write_text("image,label\na.png,red\nb.png,red\nc.png,blue\nd.png,blue\nghost.png,blue\n")

    image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(labels))

    manifest = image_dir.manifest
    assert manifest.labeled and manifest.classes == ["blue", "red"] and manifest.counts == {"blue": 2, "red": 2}
    assert {r.path for r in manifest.images} == {"red/a.png", "red/b.png", "blue/c.png", "blue/d.png"}
    assert [(q.path, q.reason) for q in manifest.quarantined] == [("e.png", f"not named in the labels file {labels}")]
    assert any("1 images named in" in w and "'ghost.png'" in w for w in manifest.warnings)
    assert any("1 images are not in" in w and "'e.png'" in w for w in manifest.warnings)
    assert manifest.labels_source == str(labels)
    assert [label for _, label in image_dir.samples()] == [1, 1, 0, 0]


def test_labels_files_that_cannot_be_used_are_clear_errors(tmp_path):
    write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "blue"})
    cases = {
        "wrong.csv": ("file,class\na.png,red\n", "needs an 'image' and a 'label' column"),
        "nothing.csv": ("image,label\nx.png,red\ny.png,blue\n", "none of the 2 images named in the labels file"),
        "twice.csv": ("image,label\na.png,red\na.png,blue\n", "gives 'a.png' two labels, 'red' and 'blue'"),
        "list.json": ('["a.png", "red"]', "must be one JSON object"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InvalidDatasetError, match=message):
            convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / name))
    with pytest.raises(InvalidDatasetError, match="does not exist"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "missing.csv"))
    assert not (tmp_path / "out").exists()


def test_labels_json_inside_a_zip_is_found_beside_an_images_folder(tmp_path):
    write_flat(tmp_path / "export" / "images", {"1.png": "red", "2.png": "green", "3.png": "red"})
    archive = tmp_path / "set.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((tmp_path / "export").rglob("*.png")):
            zf.write(path, f"wrapper/{path.relative_to(tmp_path / 'export').as_posix()}")
        zf.writestr("wrapper/labels.json", '{"images/1.png": "red", "2.png": "green", "3.png": "red"}')
    image_dir = convert_to_image_directory(archive, tmp_path / "out")
    assert image_dir.manifest.counts == {"green": 1, "red": 2} and image_dir.manifest.labels_source == "labels.json"
    assert {r.path for r in image_dir.manifest.images} == {"red/images/1.png", "green/images/2.png", "red/images/3.png"}


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


def test_labeled_flag_forces_unlabeled_or_requires_labels(colour_source, tmp_path):
    unlabeled = convert_to_image_directory(colour_source, tmp_path / "score", labeled=False)
    assert not unlabeled.labeled and len(unlabeled) == 18 and "red/red_0.png" in {r.path for r in unlabeled.manifest.images}
    write_flat(tmp_path / "flat", {"a.png": "red"})
    with pytest.raises(NotLabeledDatasetError, match="neither class folders nor a labels file"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labeled=True)


async def artifacts_and_run_count(flow_run_id, task_run_id) -> tuple[dict[str, str], int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import ArtifactSort

    # Every filter spelled out: this server answers 422 to the nulls the client sends for the ones left out.
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            flow_run_filter=FlowRunFilter(), task_run_filter=TaskRunFilter(), limit=10, sort=ArtifactSort.CREATED_DESC,
        )  # fmt: skip
        task_run = await client.read_task_run(task_run_id)
    return {a.key: str(a.data) for a in artifacts}, task_run.run_count


def test_convert_task_reports_quarantine_and_is_not_retried_on_bad_input(prefect_server, colour_source, tmp_path):
    import asyncio

    from prefect import flow

    from tasks.convert import convert

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
