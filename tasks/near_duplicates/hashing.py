"""One image's 64-bit perceptual hash (imagehash's DCT hash): close for a photo and its resized, re-compressed or
slightly cropped copies, far for different photos (bench/near_duplicates.py measures both)."""

from __future__ import annotations

import imagehash
import numpy as np
from PIL import Image

HASH_BITS = 64
# The hash is read off a 32x32 reduction of the image. Smaller images carry too little for it to tell apart
# pictures rather than shapes: hashed anyway, 1,503 pairs of different 8x8 digits of one class are within 8 bits
# (bench/near_duplicates.py). They get no hash (0), and are grouped by identical bytes only.
MIN_SIDE = 32
_WORKING_SIDE = 128  # larger images are box-reduced to about this first (cheap), then resized by imagehash


def perceptual_hash(image: Image.Image) -> int:
    """The 64-bit DCT perceptual hash of a loaded, upright ``image`` as an unsigned integer; 0 for an image under
    ``MIN_SIDE`` pixels on a side, or one Pillow cannot turn grey (0 means "not hashed")."""
    if min(image.size) < MIN_SIDE:
        return 0
    try:
        grey = image.convert("L")
        if (factor := min(grey.size) // _WORKING_SIDE) >= 2:
            grey = grey.reduce(factor)
        bits = imagehash.phash(grey).hash.ravel()
    except (OSError, ValueError):
        return 0
    return int(np.packbits(bits).view(">u8")[0])
