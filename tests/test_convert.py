import zipfile
from pathlib import Path

import pytest

from tasks import ImageDirectory, InvalidDatasetError, convert_to_image_directory
from tasks.fileio import sha256_file
from tasks.image_directory import MANIFEST_NAME
from tests.conftest import COLOURS, write_image


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
        assert record.path.startswith(record.label + "/")
    assert snapshot(colour_source) == before, "the source must not change"
    assert ImageDirectory(tmp_path / "out").manifest == manifest


def test_zip_with_wrapper_folders_finds_the_class_folders(colour_source, tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in colour_source.rglob("*.png"):
            zf.write(path, f"export/photos/{path.relative_to(colour_source).as_posix()}")
        zf.writestr("__MACOSX/export/._junk.png", b"resource fork")
    image_dir = convert_to_image_directory(archive, tmp_path / "out")
    assert image_dir.classes == sorted(COLOURS) and len(image_dir) == 18


def test_flat_folder_is_unlabeled(tmp_path):
    for i in range(3):
        write_image(tmp_path / "flat" / f"img{i}.JPG", (10, 20, 30), seed=i, fmt="JPEG")
    image_dir = convert_to_image_directory(tmp_path / "flat", tmp_path / "out")
    assert not image_dir.labeled and image_dir.classes == [] and len(image_dir) == 3
    assert all(label == -1 for _, label in image_dir.samples())


def test_unreadable_files_are_quarantined_not_fatal(colour_source, tmp_path):
    (colour_source / "red" / "notes.jpg").write_text("this is text, not a JPEG")
    (colour_source / "red" / "empty.png").write_bytes(b"")
    whole = (colour_source / "blue" / "blue_0.png").read_bytes()
    (colour_source / "blue" / "truncated.png").write_bytes(whole[: len(whole) // 2])

    image_dir = convert_to_image_directory(colour_source, tmp_path / "out")

    reasons = {q.path: q.reason for q in image_dir.manifest.quarantined}
    assert set(reasons) == {"red/notes.jpg", "red/empty.png", "blue/truncated.png"}
    assert all(reason.startswith("not a readable image") for reason in reasons.values())
    assert image_dir.manifest.counts == {name: 6 for name in COLOURS}
    assert not (tmp_path / "out" / "red" / "notes.jpg").exists()


def test_zip_slip_member_is_refused_and_nothing_escapes(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("cats/a.png", write_image(tmp_path / "a.png", (1, 2, 3)).read_bytes())
        zf.writestr("../../escaped.png", b"x")
    with pytest.raises(InvalidDatasetError, match="outside the archive"):
        convert_to_image_directory(archive, tmp_path / "deep" / "out")
    assert not (tmp_path / "escaped.png").exists() and not (tmp_path / "deep" / "out").exists()


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
