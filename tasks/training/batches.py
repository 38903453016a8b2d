"""Batches for training: DistributedSampler's indices, never a batch of one."""

from __future__ import annotations

import math

from torch.utils.data import Sampler


class BatchesOfTwoOrMore(Sampler[list[int]]):
    """Batches of ``batch_size`` indices from ``sampler``, none holding a single image.

    BatchNorm in training mode needs more than one value per channel: one image at a size whose last feature
    map is 1 x 1 (ResNets at 32 px) raises "Expected more than 1 value per channel". A last batch of one joins
    the batch before it; a shard of one image is seen twice per epoch. (``batch_size`` 1 is left as asked.)
    """

    def __init__(self, sampler: Sampler[int], batch_size: int) -> None:
        self.sampler = sampler
        self.batch_size = batch_size

    def __iter__(self):
        indices = list(self.sampler)
        batches = [indices[start : start + self.batch_size] for start in range(0, len(indices), self.batch_size)]
        if self.batch_size > 1 and batches and len(batches[-1]) == 1:
            if len(batches) > 1:
                # Not `batches[-2] += batches.pop()`: -2 is read before the pop and the sum stored after it, so
                # the first of three batches would be replaced (its images never trained, others twice).
                last = batches.pop()
                batches[-1] = batches[-1] + last
            else:
                batches[-1] *= 2
        return iter(batches)

    def __len__(self) -> int:
        count = len(self.sampler)  # type: ignore[arg-type]
        batches = math.ceil(count / self.batch_size)
        merged = self.batch_size > 1 and count > 1 and count % self.batch_size == 1
        return batches - 1 if merged else batches
