import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tasks.contracts.image_directory import ImageDirectory
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.split import Groups, split_image_directory, split_markdown
from tasks.errors import ClassTooSmallToSplitError, InvalidDatasetError, NotLabeledDatasetError, PipelineInputError
from tasks.near_duplicates import DEFAULT_DISTANCE
from tasks.storage.local_files import link_or_copy
from tests.helpers import COLOURS, sample_photos, write_burst, write_crops, write_image


def converted(tmp_path: Path, sizes: dict[str, int], copies: dict[str, str] | None = None) -> ImageDirectory:
    """An ImageDirectory with ``sizes[c]`` distinct images of class c, plus ``copies`` (new path -> copied path)."""
    source = tmp_path / "photos"
    for c, (name, n) in enumerate(sizes.items()):
        for i in range(n):
            write_image(source / name / f"{name}_{i}.png", COLOURS[name], size=8, seed=c * 100 + i)
    for new, original in (copies or {}).items():
        (source / new).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / original, source / new)
    return convert_to_image_directory(source, tmp_path / "converted")


def paths(image_dir: ImageDirectory) -> set[str]:
    return {r.path for r in image_dir.records()}


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_each_class_is_split_by_the_fraction_with_an_image_on_each_side(tmp_path):
    source = converted(tmp_path, {"red": 10, "green": 5, "blue": 2})
    first, second = split_image_directory(source, tmp_path / "train", tmp_path / "validation", 0.7, seed=1)
    assert first.manifest.counts == {"red": 7, "green": 4, "blue": 1}  # 3.5 of 5 rounds up
    assert second.manifest.counts == {"red": 3, "green": 1, "blue": 1}
    assert first.classes == second.classes == source.classes
    assert paths(first) | paths(second) == paths(source) and not paths(first) & paths(second)
    for side in (first, second):
        for image, index in side.samples():
            assert image.parent.name == side.manifest.class_folders[side.classes[index]]
            assert image.read_bytes() == (source.root / image.relative_to(side.root)).read_bytes()
    # Rounding alone would put both blue images on one side (1.6 of 2, 0.2 of 2): one stays on each.
    first, second = split_image_directory(source, tmp_path / "train", tmp_path / "validation", 0.8, seed=1)
    assert first.manifest.counts == {"red": 8, "green": 4, "blue": 1}
    first, second = split_image_directory(source, tmp_path / "train", tmp_path / "validation", 0.1, seed=1)
    assert first.manifest.counts == {"red": 1, "green": 1, "blue": 1}
    assert second.manifest.counts == {"red": 9, "green": 4, "blue": 1}


def test_a_class_too_small_for_both_sides_is_refused_by_name(tmp_path):
    source = converted(tmp_path, {"red": 4, "green": 1, "blue": 1}, copies={"blue/again.png": "blue/blue_0.png"})
    with pytest.raises(ClassTooSmallToSplitError) as refused:
        split_image_directory(source, tmp_path / "train", tmp_path / "validation", 0.8)
    assert isinstance(refused.value, InvalidDatasetError)
    message = str(refused.value)
    assert "'green' (1 image)" in message and "'blue' (2 images, 1 distinct group)" in message
    assert "at least 2 distinct images" in message and "'red'" not in message
    assert not (tmp_path / "train").exists() and not (tmp_path / "validation").exists()


def test_identical_images_land_on_one_side_whatever_the_seed(tmp_path):
    copies = {
        "red/copy_a.png": "red/red_0.png",
        "red/copy_b.png": "red/red_0.png",
        "blue/green_copy.png": "green/green_1.png",
    }
    source = converted(tmp_path, {"red": 4, "green": 3, "blue": 3}, copies)
    together = [{"red/red_0.png", "red/copy_a.png", "red/copy_b.png"}, {"green/green_1.png", "blue/green_copy.png"}]
    for seed in range(8):
        first, second = split_image_directory(source, tmp_path / "a", tmp_path / "b", 0.5, seed=seed)
        for group in together:
            assert group <= paths(first) or group <= paths(second)
        assert "identical or near-duplicate images carry different labels" in first.manifest.warnings[0]
    markdown = split_markdown(source, first, second)
    assert "Identical or near-duplicate images: 2 groups (5 images), each kept on one side" in markdown
    assert "0 of 13 images hashed): none" in markdown  # 8-pixel images: too small for a perceptual hash
    assert "1 of these groups carry different labels" in markdown
    assert "| red | 6 |" in markdown


def test_a_burst_lands_on_one_side_and_different_photos_are_not_grouped(tmp_path):
    """Real photos: each class holds a burst (a photo, a copy resized to half, that copy re-compressed) and four
    different pictures; the burst stays together whatever the seed, and nothing else is grouped."""
    photos = sample_photos()
    bursts, others = [], []
    for name in ("china", "flower"):
        bursts.append(set(write_burst(tmp_path / "photos" / name, name, photos[name])))
        others += write_crops(tmp_path / "photos" / name, name, photos[name])
    source = convert_to_image_directory(tmp_path / "photos", tmp_path / "converted")

    groups = Groups(source.index)
    assert sorted(int(groups.sizes[g]) for g in groups.near_duplicate()) == [3, 3]
    assert len(groups) == 2 + len(others), "a different picture was grouped"
    straddled = 0
    for seed in range(6):
        first, second = split_image_directory(source, tmp_path / "a", tmp_path / "b", 0.5, seed=seed)
        for burst in bursts:
            assert burst <= paths(first) or burst <= paths(second), seed
        assert first.manifest.split.near_duplicate_distance == DEFAULT_DISTANCE
        # Identical files only: the same bursts are split apart by some seed.
        apart = split_image_directory(source, tmp_path / "c", tmp_path / "d", 0.5, seed, near_duplicate_distance=-1)
        straddled += sum(not (burst <= paths(apart[0]) or burst <= paths(apart[1])) for burst in bursts)
    assert straddled > 0
    markdown = split_markdown(source, first, second)
    assert "perceptual hashes within 8 of 64 bits; 14 of 14 images hashed): 2 groups (6 images), e.g. " in markdown
    assert "'china/china.jpg' (china) ~ 'china/china_half.png' (china) ~ 'china/china_half_q40.jpg'" in markdown


def test_the_seed_decides_the_split(tmp_path):
    source = converted(tmp_path, {"red": 6, "green": 6, "blue": 6})
    first, _ = split_image_directory(source, tmp_path / "1" / "a", tmp_path / "1" / "b", 0.5, seed=1)
    again, _ = split_image_directory(source, tmp_path / "2" / "a", tmp_path / "2" / "b", 0.5, seed=1)
    other, _ = split_image_directory(source, tmp_path / "3" / "a", tmp_path / "3" / "b", 0.5, seed=2)
    assert paths(first) == paths(again)
    assert paths(first) != paths(other)


def test_sides_record_the_split_and_the_source_is_untouched(tmp_path):
    source = converted(tmp_path, {"red": 3, "green": 3})
    before = snapshot(source.root)
    first, second = split_image_directory(str(source.root), tmp_path / "train", tmp_path / "validation", 0.6, 5)
    assert snapshot(source.root) == before
    for side, name in ((first, "first"), (second, "second")):
        record = ImageDirectory(side.root).manifest.split
        assert record.side == name and record.fraction == 0.6 and record.seed == 5
        assert record.source == str(source.root.resolve())
        assert record.source_content_hash == source.manifest.content_hash
        assert side.manifest.source == source.manifest.source and side.manifest.conversion_hash is None
    image = first.records()[0].path
    assert (first.root / image).stat().st_ino == (source.root / image).stat().st_ino  # hard-linked, not copied


def test_a_rerun_reuses_the_sides_and_other_settings_replace_them(tmp_path):
    source = converted(tmp_path, {"red": 5, "green": 5})
    outputs = tmp_path / "train", tmp_path / "validation"
    first, _ = split_image_directory(source, *outputs, 0.6)
    written = (first.root / "image_directory.json").stat().st_mtime_ns
    split_image_directory(source, *outputs, 0.6)
    assert (first.root / "image_directory.json").stat().st_mtime_ns == written
    first, second = split_image_directory(source, *outputs, 0.8)
    assert first.manifest.split.fraction == 0.8 and len(first) == 8
    on_disk = {str(p.relative_to(second.root)) for p in second.root.rglob("*.png")}
    assert on_disk == paths(second)  # nothing left over from the earlier split


def test_unusable_settings_and_locations_are_refused(tmp_path):
    source = converted(tmp_path, {"red": 2, "green": 2})
    for fraction in (0, 1, 1.5):
        with pytest.raises(PipelineInputError, match="strictly between 0 and 1"):
            split_image_directory(source, tmp_path / "a", tmp_path / "b", fraction)
    with pytest.raises(InvalidDatasetError, match="must not contain each other"):
        split_image_directory(source, source.root / "train", tmp_path / "b", 0.5)
    with pytest.raises(InvalidDatasetError, match="must not contain each other"):
        split_image_directory(source, tmp_path / "a", tmp_path / "a" / "b", 0.5)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(InvalidDatasetError, match="is not an ImageDirectory"):
        split_image_directory(source, tmp_path / "mine", tmp_path / "b", 0.5)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    write_image(tmp_path / "flat" / "1.png", COLOURS["red"])
    unlabeled = convert_to_image_directory(tmp_path / "flat", tmp_path / "unlabeled", labeled=False)
    with pytest.raises(NotLabeledDatasetError):
        split_image_directory(unlabeled, tmp_path / "a", tmp_path / "b", 0.5)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a second filesystem")
def test_a_file_on_another_filesystem_is_copied(tmp_path):
    original = write_image(tmp_path / "red.png", COLOURS["red"])
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        if os.stat(other).st_dev == original.stat().st_dev:
            pytest.skip("/dev/shm is on the same filesystem as the test's folder")
        link_or_copy(original, Path(other) / "red" / "red.png")
        assert (Path(other) / "red" / "red.png").read_bytes() == original.read_bytes()
