"""near_pairs against the all-pairs answer, and the distance's range."""

import numpy as np
import pytest

from tasks.errors import PipelineInputError
from tasks.near_duplicates import MAX_DISTANCE, check_distance, hamming, near_pairs


def clustered_hashes(count: int, seed: int = 0) -> np.ndarray:
    """Hashes in clusters: originals, copies one bit away, copies a few bits away, and unrelated ones; some 0."""
    rng = np.random.default_rng(seed)
    originals = rng.integers(1, 2**63, count // 4, dtype=np.uint64)
    one_bit = originals ^ (np.uint64(1) << rng.integers(0, 64, len(originals)).astype(np.uint64))
    sparse_noise = np.bitwise_and.reduce(rng.integers(0, 2**63, (4, len(originals)), dtype=np.uint64), axis=0)
    hashes = np.concatenate([originals, one_bit, originals ^ sparse_noise, rng.integers(1, 2**63, count // 4)])
    hashes[[5, 6, count // 2]] = 0  # not hashed
    return hashes.astype(np.uint64)


@pytest.mark.parametrize("distance", [0, 1, 3, 8, MAX_DISTANCE])
def test_near_pairs_are_every_pair_within_the_distance_and_no_other(distance):
    hashes = clustered_hashes(2000)
    bits = hamming(hashes[:, None], hashes[None, :])
    i, j = np.triu_indices(len(hashes), 1)
    within = (bits[i, j] <= distance) & (hashes[i] != 0) & (hashes[j] != 0)
    expected = np.stack([i[within], j[within]], axis=1)

    found = near_pairs(hashes, distance)

    assert len(expected) > 0
    np.testing.assert_array_equal(found, expected)


def test_minus_one_finds_nothing_and_zero_hashes_never_pair():
    hashes = np.array([7, 7, 0, 0], dtype=np.uint64)
    assert near_pairs(hashes, -1).shape == (0, 2)
    np.testing.assert_array_equal(near_pairs(hashes, 0), [[0, 1]])


@pytest.mark.parametrize("distance", [-2, MAX_DISTANCE + 1, 2.5, True, "8"])
def test_a_distance_out_of_range_is_one_clear_error(distance):
    with pytest.raises(PipelineInputError, match=f"near_duplicate_distance {distance!r} is not allowed.*0 to 11"):
        check_distance(distance)
