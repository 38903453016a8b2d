"""tasks/convert/storing.py with photos as phones store them: tagged photos stored upright (the orientation
recorded, the tag gone), untagged ones byte for byte, HEIC and AVIF stored as upright RGB JPEGs, hostile HEICs
quarantined with the reason."""

import numpy as np
import pytest
from PIL import Image, ImageOps

from tasks.contracts.image_directory import EXIF_ORIENTATION
from tasks.convert.conversion import convert_to_image_directory
from tasks.storage.local_files import sha256_file
from tests.helpers import orientation_exif, write_phone_photos


def upright_pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"), dtype=np.int16)


def test_tagged_photos_are_stored_upright_and_untagged_ones_byte_for_byte(tmp_path):
    photos = write_phone_photos(tmp_path / "source" / "stripes")
    displayed = upright_pixels(photos[0])
    exif = orientation_exif(6)  # stored turned anticlockwise: displayed turned clockwise
    sideways = Image.fromarray(np.rot90(displayed.astype(np.uint8)).copy())
    sideways.save(tmp_path / "source" / "stripes" / "portrait.png", exif=exif)
    sideways.save(tmp_path / "source" / "stripes" / "portrait.webp", exif=exif, quality=90)

    image_dir = convert_to_image_directory(tmp_path / "source", tmp_path / "out")

    records = {record.path.split("/")[-1]: record for record in image_dir.records()}
    assert image_dir.manifest.quarantined == [] and len(records) == 10
    untagged = records["orientation-1.jpg"]
    assert untagged.orientation == 1 and untagged.sha256 == sha256_file(photos[0]), "a byte-for-byte copy"
    for orientation in range(2, 9):
        record = records[f"orientation-{orientation}.jpg"]
        stored = image_dir.root / record.path
        with Image.open(stored) as image:
            assert image.format == "JPEG" and image.getexif().get(EXIF_ORIENTATION) is None, "upright, no tag left"
        apart = np.abs(upright_pixels(stored) - upright_pixels(photos[orientation - 1])).mean()
        assert record.orientation == orientation and apart < 2, f"orientation {orientation}: {apart:.2f} apart"
        assert (record.width, record.height) == (48, 64) if orientation >= 5 else (64, 48)
    for name in ("portrait.png", "portrait.webp"):  # PNG as PNG, WebP as lossless WebP: the same pixels
        record = records[name]
        assert record.orientation == 6 and (record.width, record.height) == (64, 48)
        source = tmp_path / "source" / "stripes" / name
        assert np.array_equal(upright_pixels(image_dir.root / record.path), upright_pixels(source))
    assert np.array_equal(upright_pixels(tmp_path / "source" / "stripes" / "portrait.png"), displayed)


def test_heic_and_avif_are_stored_as_upright_rgb_jpegs(tmp_path):
    pytest.importorskip("pillow_heif", reason="pillow-heif is a dependency; a --no-deps host may lack it")
    folder = tmp_path / "source" / "phone"
    folder.mkdir(parents=True)
    picture = Image.open(write_phone_photos(tmp_path / "jpegs")[0]).convert("RGB")
    picture.save(folder / "IMG_0001.HEIC", quality=90)
    picture.save(folder / "IMG_0002.avif", quality=90)
    picture.save(folder / "IMG_0003.jpg", quality=90)

    image_dir = convert_to_image_directory(tmp_path / "source", tmp_path / "out")

    records = {record.source_path: record for record in image_dir.records()}
    assert image_dir.manifest.quarantined == []
    assert records["phone/IMG_0001.HEIC"].path == "phone/IMG_0001.HEIC.jpg"
    assert records["phone/IMG_0002.avif"].path == "phone/IMG_0002.avif.jpg"
    for record in records.values():
        with Image.open(image_dir.root / record.path) as stored:
            assert stored.format == "JPEG" and stored.mode == "RGB" and stored.size == (64, 48)
            apart = np.abs(np.asarray(stored, dtype=np.int16) - np.asarray(picture, dtype=np.int16)).mean()
        assert apart < 4, f"{record.path}: {apart:.2f} grey levels from the picture"


def test_hostile_heic_files_are_quarantined_with_the_reason(tmp_path):
    pytest.importorskip("pillow_heif", reason="pillow-heif is a dependency; a --no-deps host may lack it")
    folder = tmp_path / "source" / "phone"
    folder.mkdir(parents=True)
    Image.new("RGB", (64, 48), (200, 40, 40)).save(folder / "good.heic", quality=90)
    Image.new("RGB", (400, 300), (40, 200, 40)).save(folder / "huge.heic", quality=90)
    data = (folder / "good.heic").read_bytes()
    (folder / "truncated.heic").write_bytes(data[: len(data) // 2])
    (folder / "not-really.heic").write_bytes(b"ftypheic" + b"\x00" * 100)

    image_dir = convert_to_image_directory(tmp_path / "source", tmp_path / "out", max_image_pixels=64 * 48)

    reasons = {q.path: q.reason for q in image_dir.manifest.quarantined}
    assert [record.source_path for record in image_dir.records()] == ["phone/good.heic"]
    assert "over the limit of 3,072" in reasons["phone/huge.heic"]
    assert reasons["phone/truncated.heic"].startswith(("damaged or truncated image", "not an image"))
    assert reasons["phone/not-really.heic"].startswith(("damaged or truncated image", "not an image"))
