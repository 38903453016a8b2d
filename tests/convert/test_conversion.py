import logging
import os
import struct
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from PIL import Image

from deployments.local import PROJECT_ROOT
from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory, Normalisation
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.storage.local_files import sha256_file
from tests.helpers import COLOURS, artifacts_and_run_count, write_class_folders, write_image


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


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
    assert (
        reasons["red/noise.png"] == reasons["red/notes.jpg"] == "not an image: Pillow cannot identify the file's format"
    )
    assert reasons["red/empty.png"] == "empty file (0 bytes)"
    assert reasons["blue/truncated.png"].startswith("damaged or truncated image")
    assert reasons["blue/truncated.jpg"].startswith("damaged or truncated image")
    assert reasons["blue/bomb.png"].startswith("over Pillow's decompression-bomb guard")
    assert reasons["red/README.txt"].startswith("not an image type this stage reads (.avif, .bmp, .heic, .heif, .jpeg")
    assert len(reasons) == 7 and image_dir.manifest.counts == {name: 6 for name in COLOURS}
    assert not (tmp_path / "out" / "red" / "notes.jpg").exists() and snapshot(colour_source) == before


def test_every_image_type_is_read_whatever_the_case_of_its_extension(tmp_path):
    formats = {
        ".jpg": "JPEG",
        ".JPEG": "JPEG",
        ".png": "PNG",
        ".ppm": "PPM",
        ".BMP": "BMP",
        ".tif": "TIFF",
        ".Tiff": "TIFF",
        ".webp": "WEBP",
    }
    for i, (ext, fmt) in enumerate(formats.items()):
        write_image(tmp_path / "src" / "colour" / f"image{i}{ext}", COLOURS["red"], seed=i, fmt=fmt)
    (tmp_path / "src" / "grey").mkdir()
    Image.new("L", (12, 10), 128).save(tmp_path / "src" / "grey" / "image.PGM", format="PPM")
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    assert image_dir.manifest.counts == {"colour": 8, "grey": 1} and image_dir.manifest.quarantined == []
    grey = next(r for r in image_dir.records() if r.label == "grey")
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
    records = {r.path: r for r in image_dir.records()}
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
    assert {r.path for r in image_dir.records()} == {"red/a.png", "red/b.png", "blue/c.png", "blue/d.png"}
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
    assert {r.path for r in image_dir.records()} == {"red/images/1.png", "green/images/2.png", "red/images/3.png"}


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
    assert not unlabeled.labeled and len(unlabeled) == 18 and "red/red_0.png" in {r.path for r in unlabeled.records()}
    write_flat(tmp_path / "flat", {"a.png": "red"})
    with pytest.raises(NotLabeledDatasetError, match="neither class folders nor a labels file"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labeled=True)


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


def reasons_by_path(image_dir: ImageDirectory) -> dict[str, str]:
    return {q.path: q.reason for q in image_dir.manifest.quarantined}


def test_links_are_followed_only_inside_the_source_and_every_skipped_entry_is_reported(colour_source, tmp_path):
    outside = write_image(tmp_path / "private" / "secret.png", COLOURS["red"], seed=50)
    write_image(tmp_path / "elsewhere" / "purple_0.png", COLOURS["blue"], seed=51)
    red = colour_source / "red"
    (red / "alias.png").symlink_to("red_0.png")
    (colour_source / "verdant").symlink_to("green", target_is_directory=True)
    (red / "secret.png").symlink_to(outside)
    (colour_source / "purple").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (red / "gone.png").symlink_to("no-such-file.png")
    (red / "loop").symlink_to("..", target_is_directory=True)
    os.mkfifo(red / "pipe.png")

    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    manifest, reasons = image_dir.manifest, reasons_by_path(image_dir)
    assert manifest.counts == {"blue": 6, "green": 6, "red": 7, "verdant": 6}, "links inside the source are read"
    assert reasons["red/secret.png"].startswith(f"link to {str(outside)!r}, outside the source")
    assert reasons["purple"].startswith(f"link to {str(tmp_path / 'elsewhere')!r}, outside the source")
    assert reasons["red/gone.png"] == "broken link to 'no-such-file.png': its target does not exist"
    assert reasons["red/loop"].startswith("link to '..', a folder that holds it: following it would loop")
    assert reasons["red/pipe.png"].startswith("a FIFO, not a regular file")
    assert len(reasons) == 5 and "purple" not in manifest.classes
    assert any(w.startswith("5 hidden entries, links or special files were skipped") for w in manifest.warnings)
    assert not any("without images" in w for w in manifest.warnings), "a skipped folder link is no empty class"
    stored = {p.read_bytes() for p in (tmp_path / "out").rglob("*.png")}
    assert outside.read_bytes() not in stored, "nothing from outside the source is copied"


def write_zero_png(path: Path, width: int, height: int, colour_type: int = 2) -> Path:
    """A valid 8-bit PNG of black pixels (colour type 2: RGB) that compresses to almost nothing."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    compressor, row = zlib.compressobj(9), b"\0" * (1 + width * {0: 1, 2: 3}[colour_type])
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def peak_memory_of_conversion(source: Path, output: Path, **options) -> tuple[float, dict]:
    """Convert in a fresh process: its peak resident memory above what it held once imported (MB), and the manifest."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from tasks.memory import peak_rss_mb\n"
        "from tasks.convert.conversion import convert_to_image_directory\n"
        "before = peak_rss_mb()\n"
        "image_dir = convert_to_image_directory(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))\n"
        "print(json.dumps({'growth': peak_rss_mb() - before, 'manifest': image_dir.manifest.model_dump()}))\n"
    )
    # A fixed mmap threshold hands every freed image block back at once: the peak then shows the pixels held
    # together, not what glibc's per-thread heaps keep after each decode.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**17)}
    result = subprocess.run(
        [sys.executable, "-c", script, str(source), str(output), json.dumps(options)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    return report["growth"], report["manifest"]


@pytest.mark.slow
def test_a_huge_file_and_large_dimension_pngs_are_refused_from_their_header_in_bounded_memory(colour_source, tmp_path):
    huge = colour_source / "red" / "huge.jpg"
    with open(huge, "wb") as handle:
        handle.truncate(2**30)  # sparse: 1 GiB that costs no disk
    bomb = write_zero_png(tmp_path / "bomb.png", 9_500, 9_500, colour_type=0)  # over Pillow's warning, under its error
    for i in range(4):
        (colour_source / "blue" / f"wide_{i}.png").write_bytes(bomb.read_bytes())
    growth, manifest = peak_memory_of_conversion(colour_source, tmp_path / "out", threads=4)

    reasons = {q["path"]: q["reason"] for q in manifest["quarantined"]}
    assert reasons["red/huge.jpg"] == "not an image: Pillow cannot identify the file's format"
    assert (
        reasons["blue/wide_0.png"] == "9500x9500 pixels (90,250,000), over the limit of 50,000,000 (max_image_pixels)"
    )
    assert manifest["counts"] == {name: 6 for name in COLOURS}
    assert growth < 100, f"converting grew the process by {growth:.0f} MB"


@pytest.mark.slow
def test_images_under_the_pixel_cap_share_a_decode_memory_budget(tmp_path):
    big = write_zero_png(tmp_path / "big.png", 4_000, 4_000)  # 16 MP: 64 MB decoded
    (tmp_path / "src").mkdir()
    for i in range(4):
        (tmp_path / "src" / f"{i}.png").write_bytes(big.read_bytes())
    write_image(tmp_path / "src" / "small.png", COLOURS["red"])
    growth, manifest = peak_memory_of_conversion(
        tmp_path / "src", tmp_path / "out", threads=4, decode_memory_bytes=70 * 2**20
    )
    assert manifest["image_count"] == 5 and manifest["quarantined"] == []
    assert growth < 120, f"4 threads decoding 64 MB images one at a time grew the process by {growth:.0f} MB"

    capped = convert_to_image_directory(tmp_path / "src", tmp_path / "again", max_image_pixels=10**7).manifest
    assert len(capped.quarantined) == 4 and capped.image_count == 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_raised_pixel_cap_records_pillows_decompression_bomb_warning(tmp_path):
    write_zero_png(tmp_path / "src" / "wide.png", 10_000, 9_000, colour_type=0)
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out", max_image_pixels=10**8)
    assert len(image_dir) == 1
    assert any(
        w.startswith("Pillow's DecompressionBombWarning: 1 stored images") and "'wide.png'" in w
        for w in image_dir.manifest.warnings
    )


def test_stray_files_beside_wrapper_folders_do_not_hide_the_class_folders(colour_source, tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in colour_source.rglob("*.png"):
            zf.write(path, f"export/photos/set/{path.relative_to(colour_source).as_posix()}")
        zf.writestr("export/README.md", "# Lab photos")
        zf.writestr("export/photos/LICENSE", "CC-BY")
    image_dir = convert_to_image_directory(archive, tmp_path / "out")

    assert image_dir.classes == sorted(COLOURS) and len(image_dir) == 18
    reasons = reasons_by_path(image_dir)
    assert set(reasons) == {"export/README.md", "export/photos/LICENSE"}
    assert all(r.startswith("beside the wrapper folders above 'export/photos/set'") for r in reasons.values())
    assert any(w.startswith("2 files beside the wrapper folders") for w in image_dir.manifest.warnings)
    red_0 = next(r for r in image_dir.records() if r.path == "red/red_0.png")
    assert red_0.source_path == "export/photos/set/red/red_0.png"


def test_names_equal_once_normalised_are_merged_and_never_overwrite_each_other(tmp_path):
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    write_image(tmp_path / "src" / nfc / "1.png", COLOURS["red"], seed=1)
    write_image(tmp_path / "src" / nfd / "1.png", COLOURS["red"], seed=2)
    write_image(tmp_path / "src" / "tea" / "A.png", COLOURS["green"], seed=3)
    write_image(tmp_path / "src" / "tea" / "a.png", COLOURS["green"], seed=4)

    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")

    manifest = image_dir.manifest
    assert manifest.classes == [nfc, "tea"] and manifest.counts == {nfc: 2, "tea": 2}
    assert sorted(r.path for r in image_dir.records()) == [f"{nfc}/1.png", f"{nfc}/1~2.png", "tea/A.png", "tea/a~2.png"]
    for record in image_dir.records():
        assert record.sha256 == sha256_file(image_dir.root / record.path)
        assert record.sha256 == sha256_file(tmp_path / "src" / record.source_path), "each record is its own file"
    assert (
        f"class folders {ascii(nfd)} and {ascii(nfc)} differ only in Unicode normalisation (NFC/NFD): merged "
        f"into one class {nfc!r}" in manifest.warnings
    )
    assert any(w.startswith("2 files whose names collide") for w in manifest.warnings)


def test_storing_an_image_never_overwrites_one_already_stored(tmp_path):
    from tasks.convert.plan import SourceFile
    from tasks.convert.storing import DecodeBudget, StoreSettings, store_image

    settings = StoreSettings(None, 10**6, DecodeBudget(2**20))
    first, second = (write_image(tmp_path / f"{i}.png", COLOURS["red"], seed=i) for i in range(2))
    store_image(
        SourceFile(first, PurePosixPath("0.png"), PurePosixPath("0.png"), None),
        "x.png",
        tmp_path / "out",
        settings,
    )
    with pytest.raises(FileExistsError):
        store_image(
            SourceFile(second, PurePosixPath("1.png"), PurePosixPath("1.png"), None),
            "x.png",
            tmp_path / "out",
            settings,
        )
    assert sha256_file(tmp_path / "out" / "x.png") == sha256_file(first)


def test_hidden_class_folders_are_classes_and_other_hidden_entries_are_reported(colour_source, tmp_path):
    write_class_folders(colour_source, 2, classes=("red",), seed=5)
    (colour_source / "red").rename(colour_source / ".net")
    write_image(colour_source / "blue" / ".secret.png", COLOURS["blue"], seed=60)
    for i in range(2):
        write_image(colour_source / "green" / ".thumbs" / f"{i}.png", COLOURS["green"], seed=61 + i)
    (colour_source / ".git").mkdir()
    (colour_source / ".git" / "HEAD").write_text("ref: refs/heads/main")

    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    assert image_dir.classes == [".net", "blue", "green"] and image_dir.manifest.class_folders[".net"] == "%2Enet"
    assert image_dir.manifest.counts == {".net": 6, "blue": 6, "green": 6}
    reasons = reasons_by_path(image_dir)
    assert reasons["blue/.secret.png"] == "hidden file (its name starts with '.'): skipped"
    assert reasons["green/.thumbs"].startswith("hidden folder (its name starts with '.'), skipped with the 2 files")
    assert reasons[".git"].startswith("hidden folder (its name starts with '.'), skipped with the 1 files")
    assert len(reasons) == 3

    flat = write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "blue", ".cache/c.png": "green"})
    unlabeled = convert_to_image_directory(flat, tmp_path / "flat-out")
    assert not unlabeled.labeled and len(unlabeled) == 2 and set(reasons_by_path(unlabeled)) == {".cache"}


def test_long_escaped_names_keep_their_extension_and_stay_distinct(tmp_path):
    from tasks.contracts.image_directory import safe_name

    names = ["a:" * 100 + "1.png", "a:" * 100 + "2.png"]
    write_flat(tmp_path / "src", {name: "red" for name in names})
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    stored = sorted(r.path for r in image_dir.records())
    assert len(set(stored)) == 2 and all(p.endswith(".png") and len(p.encode()) <= 255 for p in stored)
    assert sorted(r.source_path for r in image_dir.records()) == sorted(names)
    assert safe_name("x" * 300 + ".JPEG").endswith(".JPEG") and len(safe_name("é" * 200 + ".jpg").encode()) <= 255


def test_a_single_folder_of_images_is_unlabeled_when_scoring(tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(3):
            zf.write(write_image(tmp_path / "loose" / f"{i}.png", COLOURS["red"], seed=i), f"photos/{i}.png")
    training = convert_to_image_directory(archive, tmp_path / "train")
    assert training.labeled and training.classes == ["photos"], "for training a single folder is one class"

    scoring = convert_to_image_directory(archive, tmp_path / "score", single_class="unlabeled")
    assert not scoring.labeled and sorted(r.path for r in scoring.records()) == ["0.png", "1.png", "2.png"]
    assert sorted(r.source_path for r in scoring.records()) == ["photos/0.png", "photos/1.png", "photos/2.png"]
    forced = convert_to_image_directory(archive, tmp_path / "forced", labeled=True, single_class="unlabeled")
    assert forced.labeled and forced.classes == ["photos"]


def test_labels_files_in_common_encodings_are_read_and_others_named(tmp_path):
    write_flat(tmp_path / "flat", {"a.png": "red", "b.png": "blue"})
    text = "image,label\na.png,café\nb.png,thé\n"
    encodings = {
        "cp1252.csv": text.encode("cp1252"),
        "utf16.csv": text.encode("utf-16"),
        "bom.csv": text.encode("utf-8-sig"),
        "utf32.csv": text.encode("utf-32"),
    }
    for name, data in encodings.items():
        (tmp_path / name).write_bytes(data)
        image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / f"out-{name}", labels=str(tmp_path / name))
        assert image_dir.classes == ["café", "thé"], name
    (tmp_path / "nobom.csv").write_bytes(text.encode("utf-16-le"))
    with pytest.raises(InvalidDatasetError, match="NUL bytes: UTF-16 without a byte-order mark.*Accepted: UTF-8"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "nobom.csv"))
    (tmp_path / "bad.csv").write_bytes(b"image,label\na.png,\x81\n")
    with pytest.raises(InvalidDatasetError, match=r"neither UTF-8 nor Windows-1252 \(byte 0x81 at offset 18\)"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labels=str(tmp_path / "bad.csv"))


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
