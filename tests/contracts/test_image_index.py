"""The ImageDirectory's index (tasks/contracts/image_index.py): columns written in one pass, memory-mapped, and the
format 1 manifests (records in the JSON) still read."""

import random

import numpy as np

from tasks.contracts.image_directory import ImageDirectory, ImageDirectoryManifest
from tasks.contracts.image_index import INDEX_NAME, OPTIONAL_COLUMNS, ImageIndex, Row, Strings
from tasks.contracts.transformations import ImageTransformations
from tasks.vision.images import ImageFiles
from tasks.vision.transforms import eval_transform
from tests.contracts.index_rows import rows


def test_strings_sort_as_python_sorts_them_and_take_keeps_the_order_given():
    values = ["".join(random.Random(i).choices("aAzé猫/~.0", k=i % 13)) for i in range(3_000)]
    strings = ImageIndex.from_rows(Row(v, None, -1, "00" * 32, 0, 1, 1, "L") for v in values).path
    assert isinstance(strings, Strings) and list(strings) == values and strings[-1] == values[-1]
    order = strings.sorted_order()
    assert [values[i] for i in order] == sorted(values)
    picked = np.array([5, 2, 2999, 0])
    assert list(strings.take(picked)) == [values[i] for i in picked]


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
