"""Near-duplicate images: a photo and its resized, re-compressed or burst twins, found by a perceptual hash.

``hashing.perceptual_hash`` is computed once per image at conversion, from the pixels conversion decodes anyway,
and stored in the index (column ``perceptual_hash``). ``grouping.near_pairs`` finds every pair whose hashes differ
in at most ``max_distance`` bits without comparing all pairs; the split keeps such images on one side, and label
validation reports them across two given folders (training images whose near-twin is in validation).
"""

from tasks.near_duplicates.grouping import (
    DEFAULT_DISTANCE,
    MAX_DISTANCE,
    check_distance,
    hamming,
    near_pairs,
)
from tasks.near_duplicates.hashing import HASH_BITS, MIN_SIDE, perceptual_hash

__all__ = [
    "DEFAULT_DISTANCE",
    "HASH_BITS",
    "MAX_DISTANCE",
    "MIN_SIDE",
    "check_distance",
    "hamming",
    "near_pairs",
    "perceptual_hash",
]
