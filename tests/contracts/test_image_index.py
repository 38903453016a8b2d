"""The ImageDirectory's index (tasks/contracts/image_index.py): columns written in one pass, memory-mapped, and the
format 1 manifests (records in the JSON) still read."""

import hashlib
import json
import random

import numpy as np
import pytest

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory, ImageDirectoryManifest, ImageRecord
from tasks.contracts.image_index import INDEX_NAME, OPTIONAL_COLUMNS, ImageIndex, Row, Strings
from tasks.contracts.index_writer import IndexWriter
from tasks.contracts.transformations import ImageTransformations
from tasks.errors import InvalidDatasetError
from tasks.vision.images import ImageFiles
from tasks.vision.transforms import eval_transform

NAMES = ["a/b.png", "é/ü.jpg", "猫/1.png", "z.png", "A.png", "a/b~2.png", "ä.png", ""]


def rows(count: int, classes: int = 3) -> list[Row]:
    rng = random.Random(count)
    return [
        Row(
            path=f"{NAMES[i % 7]}.{i}",
            source_path=None if i % 4 == 0 else f"src/{i}.png",
            label=i % classes,
            sha256=hashlib.sha256(str(i % (count - 3)).encode()).hexdigest(),  # three images repeat a content
            size_bytes=rng.randrange(1 << 40),
            width=rng.randrange(1, 5000),
            height=rng.randrange(1, 5000),
            mode=rng.choice(["L", "RGB", "RGBA", "I;16"]),
        )
        for i in range(count)
    ]


def test_a_written_index_reads_back_row_for_row_and_relabelled(tmp_path):
    written = rows(10_000)  # more than the writer's buffer: several flushes
    writer = IndexWriter(tmp_path / INDEX_NAME)
    for row in written:
        writer.append(row)
    assert writer.count == 10_000
    writer.relabel = np.array([0, 0, 1], dtype=np.int32)  # class 1 left out: 2 becomes 1
    digest, content_hash = writer.finish(["x", "y"])
    assert content_hash is None  # not in path order: the caller hashes the index, sorted
    assert [p.name for p in tmp_path.iterdir()] == [INDEX_NAME]  # the scratch folder went
    index = ImageIndex.open(tmp_path / INDEX_NAME)
    assert isinstance(index.label, np.memmap) and len(index) == 10_000
    assert np.load(tmp_path / INDEX_NAME)["label"].tolist() == index.label.tolist()  # an ordinary .npz
    expected = [r._replace(label=[0, 0, 1][r.label]) for r in written]
    assert [index.row(i) for i in range(0, 10_000, 997)] == expected[::997]
    assert list(index.path) == [r.path for r in written]
    assert ImageIndex.from_rows(written).save(tmp_path / "again.npz") != digest  # the labels differ


def test_rows_written_in_path_order_are_hashed_as_they_are_copied_to_the_same_content_hash(tmp_path):
    written = sorted(rows(10_000), key=lambda r: r.path.encode())
    writer = IndexWriter(tmp_path / INDEX_NAME)
    for row in written:
        writer.append(row)
    writer.relabel = np.array([0, -1, 1], dtype=np.int32)
    _, content_hash = writer.finish(["x", "z"])
    relabelled = [r._replace(label=[0, -1, 1][r.label]) for r in written]
    assert content_hash == ImageIndex.open(tmp_path / INDEX_NAME).content_hash(["x", "z"])
    assert content_hash == ImageIndex.from_rows(relabelled[::-1]).content_hash(["x", "z"])  # order-free
    assert content_hash != ImageIndex.from_rows(relabelled).content_hash(["x", "y"])


def test_strings_sort_as_python_sorts_them_and_take_keeps_the_order_given():
    values = ["".join(random.Random(i).choices("aAzé猫/~.0", k=i % 13)) for i in range(3_000)]
    strings = ImageIndex.from_rows(Row(v, None, -1, "00" * 32, 0, 1, 1, "L") for v in values).path
    assert isinstance(strings, Strings) and list(strings) == values and strings[-1] == values[-1]
    order = strings.sorted_order()
    assert [values[i] for i in order] == sorted(values)
    picked = np.array([5, 2, 2999, 0])
    assert list(strings.take(picked)) == [values[i] for i in picked]


def format_1(tmp_path, records: list[ImageRecord]) -> dict:
    manifest = {
        "format_version": 1,
        "labeled": True,
        "classes": ["cat", "dog"],
        "counts": {"cat": 2, "dog": 1},
        "images": [r.model_dump() for r in records],
        "source": "/data/pets",
    }
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return manifest


def test_a_format_1_directory_opens_with_the_content_hash_it_always_had(tmp_path):
    records = [
        ImageRecord(path=p, label=label, sha256=h * 32, size_bytes=9, width=4, height=3, mode="RGB", source_path=s)
        for p, label, h, s in [("dog/b.png", "dog", "bb", None), ("cat/a.png", "cat", "aa", "x/a.png"), ("cat/c.png", "cat", "cc", "c")]
    ]  # fmt: skip
    (tmp_path / "old").mkdir()
    format_1(tmp_path / "old", records)
    old = ImageDirectory(tmp_path / "old")
    # Format 1's content hash: each record's path, label and sha256, in path order.
    digest = hashlib.sha256()
    for r in sorted(records, key=lambda r: r.path):
        digest.update(f"{r.path}\0{r.label}\0{r.sha256}\n".encode())
    assert old.content_hash == digest.hexdigest() and len(old) == 3
    assert old.records() == records
    assert [(p.name, label) for p, label in old.samples()] == [("b.png", 1), ("a.png", 0), ("c.png", 0)]

    (tmp_path / "new").mkdir()
    ImageDirectory.write(
        tmp_path / "new", ImageDirectoryManifest(**{**old.manifest.model_dump(), "format_version": 2}), records
    )
    new = ImageDirectory(tmp_path / "new")
    assert new.content_hash == old.content_hash and new.records() == records
    assert json.loads((tmp_path / "new" / MANIFEST_NAME).read_text())["image_count"] == 3


def test_a_manifest_of_an_unknown_format_or_without_its_index_asks_for_a_new_conversion(tmp_path):
    records = [ImageRecord(path="cat/a.png", label="cat", sha256="aa" * 32, size_bytes=1, width=1, height=1, mode="L")]
    manifest = ImageDirectoryManifest(labeled=True, classes=["cat"], counts={"cat": 1}, source="/x")
    ImageDirectory.write(tmp_path, manifest, records)
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**data, "format_version": 3}))
    with pytest.raises(InvalidDatasetError, match="format 3; this version reads formats 1 and 2: convert the images"):
        ImageDirectory(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    (tmp_path / INDEX_NAME).write_bytes(b"PK")
    with pytest.raises(InvalidDatasetError, match="its index .* cannot be read .*: convert the images again"):
        ImageDirectory(tmp_path).samples()


def test_a_rank_holds_no_python_object_per_image_of_an_image_directory(tmp_path):
    """What a training rank allocates for 20,000 images of an ImageDirectory (issue 23): the index is mapped, not
    read into objects, so ImageFiles over ``samples()`` allocates less than a tenth of ImageFolder's list (tracemalloc;
    bench.scale measures resident memory)."""
    import gc
    import tracemalloc

    written = rows(20_000, classes=10)
    manifest = ImageDirectoryManifest(labeled=True, classes=[str(c) for c in range(10)], counts={}, source="/x")
    ImageDirectory.write(tmp_path, manifest, ImageIndex.from_rows(written))
    transform = eval_transform(ImageTransformations(), 16, (0.5,) * 3, (0.25,) * 3)

    def allocated(build) -> int:
        gc.collect()
        tracemalloc.start()
        kept = build()
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        return size

    ours = allocated(lambda: ImageFiles(ImageDirectory(tmp_path).samples(), transform))
    imagefolder = allocated(lambda: ([(str(tmp_path / r.path), r.label) for r in written], [r.label for r in written]))
    print(f"ImageFiles over the index {ours} B, ImageFolder's lists {imagefolder} B for 20,000 images")
    assert ours < imagefolder / 10, (ours, imagefolder)
    dataset = ImageFiles(ImageDirectory(tmp_path).samples(), transform)
    assert len(dataset) == 20_000 and dataset.samples[123] == (tmp_path / written[123].path, written[123].label)


def test_an_index_written_before_the_later_columns_reads_them_as_not_recorded(tmp_path):
    written = ImageIndex.from_rows([r._replace(perceptual_hash=(1 << 63) + i) for i, r in enumerate(rows(20))])
    assert written.orientation.tolist() == [1] * 20, "rows default to stored as they were"
    assert written.perceptual_hash.dtype == np.uint64 and int(written.perceptual_hash[3]) == (1 << 63) + 3
    older = {name: array for name, array in written.columns().items() if name not in OPTIONAL_COLUMNS}
    np.savez(tmp_path / INDEX_NAME, **older)

    index = ImageIndex.open(tmp_path / INDEX_NAME)

    assert index.orientation.tolist() == [0] * 20 and index.perceptual_hash.tolist() == [0] * 20
    assert index.row(3) == rows(20)[3]._replace(orientation=0, perceptual_hash=0)
