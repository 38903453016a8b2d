import zipfile

import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import NotLabeledDatasetError
from tests.convert.sample_sources import reasons_by_path, write_flat
from tests.helpers import COLOURS, write_class_folders, write_image


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


def test_labeled_flag_forces_unlabeled_or_requires_labels(colour_source, tmp_path):
    unlabeled = convert_to_image_directory(colour_source, tmp_path / "score", labeled=False)
    assert not unlabeled.labeled and len(unlabeled) == 18 and "red/red_0.png" in {r.path for r in unlabeled.records()}
    write_flat(tmp_path / "flat", {"a.png": "red"})
    with pytest.raises(NotLabeledDatasetError, match="neither class folders nor a labels file"):
        convert_to_image_directory(tmp_path / "flat", tmp_path / "out", labeled=True)


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
