"""The training loader whose every draw is a function of (seed, epoch, position), so a run resumed from a
checkpoint, at an epoch boundary or mid-epoch, sees the batches an uninterrupted run would have seen.

:class:`EpochSampler` shuffles with a generator seeded by ``seed + epoch`` (it is a ``DistributedSampler``,
so under DDP Lightning keeps it and each rank takes its shard) and yields ``(epoch, index)`` pairs: the
dataset seeds each image's augmentation from them (:meth:`~vitzoo.data.ImageDataset.__getitem__`), whatever
the worker that decodes it. :class:`ResumableLoader` counts the batches it handed out this epoch (its
``state_dict``, which the checkpoint carries: :class:`~vitzoo.training.resume.ExactResume`); given back
before the resumed run's first batch, the sampler skips those batches' indices.
:class:`RepeatAugEpochSampler` is timm's ``RepeatAugSampler`` (DeiT's repeated augmentation) drawn the same way.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, DistributedSampler

__all__ = ["EpochSampler", "RepeatAugEpochSampler", "ResumableLoader", "sample_seed"]


def sample_seed(seed: int, epoch: int, index: int, *draw: int) -> int:
    """The augmentation seed of image ``index`` in ``epoch`` of a run seeded ``seed`` (a 32-bit int); ``draw``
    tells apart the copies of an image that one epoch repeats."""
    return int(np.random.SeedSequence([seed % 2**64, epoch, index, *draw]).generate_state(1)[0])


class _Resumable:
    """What both samplers share: ``(epoch, index, ...)`` tuples from :meth:`_draws`, and :meth:`resume`."""

    skip = 0
    epoch: int

    def _draws(self, epoch: int) -> List[Tuple[int, ...]]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0
        super().set_epoch(epoch)

    def resume(self, epoch: int, skip: int) -> None:
        """Continue ``epoch`` after its first ``skip`` samples (once: the next epoch starts from its first)."""
        self.epoch, self.skip = int(epoch), int(skip)

    def __iter__(self) -> Iterator[Tuple[int, ...]]:
        epoch, skip, self.skip = self.epoch, self.skip, 0
        return iter(self._draws(epoch)[skip:])


class EpochSampler(_Resumable, DistributedSampler):
    """Shuffled ``(epoch, index)`` pairs of one rank's shard; :meth:`resume` skips what a stopped run consumed."""

    def __init__(self, dataset, *, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)

    def _draws(self, epoch: int) -> List[Tuple[int, int]]:
        return [(epoch, index) for index in DistributedSampler.__iter__(self)]


class RepeatAugEpochSampler(_Resumable, RepeatAugSampler, DistributedSampler):
    """timm's ``RepeatAugSampler`` (each image ``num_repeats`` times per epoch, the copies on different ranks,
    each rank drawing ``len(dataset) / world`` images) as ``(epoch, index, copy)`` triples: the copy number seeds
    each copy's augmentation apart. Shuffled from ``seed`` and the epoch (timm's from the epoch alone).

    A ``DistributedSampler`` by type (its ``__init__`` is not run: timm's sets the same attributes) so that
    Lightning keeps it under DDP instead of wrapping it in a distributed sampler of its own.
    """

    def __init__(self, dataset, *, num_replicas: int, rank: int, seed: int = 0, num_repeats: int = 3):
        RepeatAugSampler.__init__(
            self, dataset, num_replicas=num_replicas, rank=rank, shuffle=True, num_repeats=num_repeats
        )
        self.seed, self.drop_last = seed, False

    def _draws(self, epoch: int) -> List[Tuple[int, int, int]]:
        self.epoch = int(np.random.SeedSequence([self.seed % 2**64, epoch]).generate_state(1)[0])
        try:  # timm seeds its shuffle with self.epoch
            indices = list(RepeatAugSampler.__iter__(self))
        finally:
            self.epoch = epoch
        n = len(self.dataset) * self.num_repeats
        positions = range(self.rank, self.total_size, self.num_replicas)[: self.num_selected_samples]
        return [(epoch, index, (position % n) % self.num_repeats) for index, position in zip(indices, positions)]


class ResumableLoader(DataLoader):
    """A training ``DataLoader`` over an :class:`EpochSampler` whose position Lightning checkpoints."""

    def __init__(self, dataset, *, sampler: EpochSampler, batch_size: int, **kwargs):
        super().__init__(dataset, sampler=sampler, batch_size=batch_size, drop_last=True, **kwargs)
        self.batches_taken = 0

    def __iter__(self):
        self.batches_taken = self.sampler.skip // self.batch_size
        for batch in super().__iter__():
            self.batches_taken += 1
            yield batch

    def mid_epoch(self) -> bool:
        """Whether the epoch being drawn has batches left (and has begun)."""
        return 0 < self.batches_taken < len(self)

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.sampler.epoch, "batches_taken": self.batches_taken}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        epoch, taken = int(state["epoch"]), int(state["batches_taken"])
        if taken >= len(self):  # stopped after the epoch's last batch: the next one starts afresh
            epoch, taken = epoch + 1, 0
        self.sampler.resume(epoch, taken * self.batch_size)
