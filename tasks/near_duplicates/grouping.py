"""Pairs of 64-bit hashes within a Hamming distance, found without comparing every pair.

Multi-index hashing (Norouzi, Punjani and Fleet, 2012): the 64 bits are cut into three blocks (22, 21 and 21
bits). Two hashes within ``t`` bits of each other differ in at most ``t // 3`` bits in at least one block (were
each block ``t // 3 + 1`` apart, the whole would be over ``t``). So a hash's candidates are the hashes whose block
equals one of its own block's values with at most ``t // 3`` bits flipped: looked up in a table of the block's
values, then checked whole. A 21-bit block value is shared by N / 2 million hashes when they are well spread, so
the work grows with N (times the flips tried: 1 + b + b(b-1)/2 per block at t // 3 = 2), not with N squared.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from tasks.errors import PipelineInputError

# Different photos are rarely within 8 bits of each other, while copies resized, re-compressed or cropped by a
# few percent mostly are (bench/near_duplicates.py gives both rates on real photos).
DEFAULT_DISTANCE = 8
# Past it, a block's lookups try 1,794 values each (t // 3 = 3), and unrelated photos begin to group (same bench).
MAX_DISTANCE = 11
_BLOCKS = ((0, 22), (22, 21), (43, 21))  # (first bit, width)
_CHUNK = 8192  # hashes looked up at once (bounds the probe arrays' memory: 8,192 x 254 values at t = 8)


def check_distance(distance: int, name: str = "near_duplicate_distance") -> None:
    if isinstance(distance, bool) or not isinstance(distance, int) or not -1 <= distance <= MAX_DISTANCE:
        raise PipelineInputError(
            f"{name} {distance!r} is not allowed: give the largest number of differing bits (0 to {MAX_DISTANCE}) "
            f"between two images' 64-bit perceptual hashes for them to count as near-duplicates, e.g. "
            f"{DEFAULT_DISTANCE}, or -1 to keep only identical files together"
        )


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Differing bits between two arrays of uint64 hashes, element by element."""
    return np.bitwise_count(np.bitwise_xor(a, b)).astype(np.int64)


def _flips(width: int, radius: int) -> np.ndarray:
    """Every ``width``-bit mask with at most ``radius`` bits set."""
    masks = [0]
    for r in range(1, radius + 1):
        masks += [sum(1 << bit for bit in bits) for bits in combinations(range(width), r)]
    return np.array(masks, dtype=np.int64)


def near_pairs(hashes: np.ndarray, max_distance: int) -> np.ndarray:
    """(i, j) rows, i < j, for each pair of nonzero ``hashes`` (uint64; 0 means "not hashed") at most
    ``max_distance`` bits apart; each pair once, sorted."""
    check_distance(max_distance, "max_distance")
    hashes = np.asarray(hashes, dtype=np.uint64)
    hashed = np.flatnonzero(hashes)
    if max_distance < 0 or len(hashed) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    values = hashes[hashed]
    found = []
    for first_bit, width in _BLOCKS:
        keys = ((values >> np.uint64(first_bit)) & np.uint64((1 << width) - 1)).astype(np.int64)
        order = np.argsort(keys, kind="stable")
        counts = np.bincount(keys, minlength=1 << width).astype(np.int32)  # half the cache lines of int64
        starts = np.cumsum(counts, dtype=np.int64) - counts
        flips = _flips(width, max_distance // len(_BLOCKS))
        for begin in range(0, len(values), _CHUNK):
            mine = np.arange(begin, min(begin + _CHUNK, len(values)))
            probes = keys[mine, None] ^ flips[None, :]
            # A pair whose block values differ is found from the smaller value's side only; equal values from
            # both (flip 0), and the pair is kept once below.
            owners, flip = np.nonzero(probes >= keys[mine, None])
            probes = probes[owners, flip]
            hit = np.flatnonzero(counts[probes])
            owners, probes = owners[hit], probes[hit]
            sizes = counts[probes]
            first = np.repeat(mine[owners], sizes)
            within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            second = order[np.repeat(starts[probes], sizes) + within]
            keep = (first != second) & (hamming(values[first], values[second]) <= max_distance)
            found.append(np.stack([first[keep], second[keep]], axis=1))
    pairs = np.unique(np.sort(np.concatenate(found), axis=1), axis=0)
    return hashed[pairs]
