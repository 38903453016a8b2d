"""BatchesOfTwoOrMore: DistributedSampler's shards cut into batches, never one of a single image."""

import pytest
from torch.utils.data import DistributedSampler

from tasks.training.batches import BatchesOfTwoOrMore


@pytest.mark.parametrize("images", [1, 2, 5, 16, 17, 33])
@pytest.mark.parametrize("batch_size", [1, 2, 4, 16])
def test_every_index_is_dealt_in_batches_of_two_or_more_and_len_tells_their_number(images, batch_size):
    sampler = DistributedSampler(range(images), num_replicas=1, rank=0, shuffle=True, seed=1)
    batches = list(BatchesOfTwoOrMore(sampler, batch_size))
    assert len(batches) == len(BatchesOfTwoOrMore(sampler, batch_size))
    if batch_size > 1:
        assert all(len(batch) >= 2 for batch in batches), batches
    dealt = [i for batch in batches for i in batch]
    # Each image once; a shard of a single image twice (a batch of one would fail BatchNorm in training mode).
    assert sorted(set(dealt)) == list(range(images)) and len(dealt) == (2 if images == 1 < batch_size else images)


def test_a_last_batch_of_one_joins_the_batch_before_it():
    batches = list(BatchesOfTwoOrMore(range(9), 4))
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]
