from pathlib import Path

import pytest
import torch

from tasks.contracts.transformations import ImageTransformations
from tasks.errors import UnreadableImageError
from tasks.vision.images import ImageFiles
from tasks.vision.transforms import eval_transform
from tests.helpers import write_class_folders


def test_decoded_images_are_kept_in_memory_up_to_the_budget(tmp_path):
    source = write_class_folders(tmp_path / "images", per_class=3)
    samples = [(path, 0) for path in sorted(source.rglob("*.png"))]
    transform = eval_transform(ImageTransformations(), 32, (0.5,) * 3, (0.5,) * 3)
    uncached = [image for image, _ in ImageFiles(samples, transform)]
    per_image = 3 * 32 * 32
    cached = ImageFiles(samples, transform, cache_bytes=5 * per_image + 7)
    assert cached.cache_capacity == 5 and cached.cached_images == 0
    first = [image for image, _ in cached]
    assert cached.cached_images == 5
    for path, _ in samples:
        path.unlink()  # later epochs read the first five from memory, the rest from disk
    assert all(torch.equal(a, b) for a, b in zip(uncached, first))
    assert all(torch.equal(cached[i][0], uncached[i]) for i in range(5))
    with pytest.raises(UnreadableImageError, match="no such file"):
        cached[5]


def test_a_rank_holds_its_image_list_in_no_more_memory_than_imagefolder_does(tmp_path):
    """What a training rank keeps per image (issue 23): ImageFiles over 5,000 samples allocates at most what
    torchvision's ImageFolder keeps for the same list ((path string, class) tuples and a target list), counted by
    tracemalloc."""
    import gc
    import tracemalloc

    names = [(str(tmp_path / f"class-{i % 10}" / f"{i:07d}.png"), i % 10) for i in range(5_000)]
    transform = eval_transform(ImageTransformations(), 16, (0.5,) * 3, (0.25,) * 3)
    # pathlib interns each name's parts: the interpreter's table of interned strings grows once, here, not inside
    # the first measurement.
    interned = [Path(name) for name, _ in names]

    def allocated(build) -> int:
        """Memory still held once ``build`` has made what it keeps from (Path, int) samples, as
        ``ImageDirectory.samples()`` gives them, and the samples are let go."""
        tracemalloc.start()
        samples = [(Path(name), c) for name, c in names]
        kept = build(samples)
        del samples
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        return size

    ours = allocated(lambda samples: ImageFiles(samples, transform))
    imagefolder = allocated(lambda samples: ([(str(p), c) for p, c in samples], [c for _, c in samples]))
    print(f"ImageFiles {ours / 5_000:.0f} B per image, ImageFolder {imagefolder / 5_000:.0f} B")
    assert ours <= imagefolder, (ours, imagefolder)
    del interned
