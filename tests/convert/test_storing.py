"""tasks/convert/storing.py with photos as phones store them: tagged photos stored upright (the orientation
recorded, the tag gone), untagged ones byte for byte, HEIC and AVIF stored as upright RGB JPEGs, hostile HEICs
quarantined with the reason."""

import os
import struct
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from PIL import Image, ImageOps

from deployments.local import PROJECT_ROOT
from tasks.contracts.image_directory import EXIF_ORIENTATION
from tasks.convert.conversion import convert_to_image_directory
from tasks.storage.local_files import sha256_file
from tests.convert.sample_sources import snapshot
from tests.helpers import COLOURS, orientation_exif, write_image, write_phone_photos


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
