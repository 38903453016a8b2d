from PIL import Image

from tasks.convert.conversion import convert_to_image_directory
from tasks.storage.local_files import sha256_file
from tests.convert.sample_sources import write_flat
from tests.helpers import COLOURS, write_image


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


def test_long_escaped_names_keep_their_extension_and_stay_distinct(tmp_path):
    from tasks.contracts.image_directory import safe_name

    names = ["a:" * 100 + "1.png", "a:" * 100 + "2.png"]
    write_flat(tmp_path / "src", {name: "red" for name in names})
    image_dir = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    stored = sorted(r.path for r in image_dir.records())
    assert len(set(stored)) == 2 and all(p.endswith(".png") and len(p.encode()) <= 255 for p in stored)
    assert sorted(r.source_path for r in image_dir.records()) == sorted(names)
    assert safe_name("x" * 300 + ".JPEG").endswith(".JPEG") and len(safe_name("é" * 200 + ".jpg").encode()) <= 255
