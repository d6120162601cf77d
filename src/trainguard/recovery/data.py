"""Keeping suspect data out after a rollback.

The Guard records which data produced the steps a rollback blamed (`guard.skipped_data`). What a
"data id" is depends on the loop: by default it is the running position of the batch (the number
of `guard.step` calls so far), which a resumable pipeline can skip; a loop that passes
`guard.step(loss, data_ids=indices)` with the dataset indices of the batch gets sample-level
skipping through `SkippingSampler`, which leaves those samples out of every later epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any, Protocol


class _HasSkippedData(Protocol):
    @property
    def skipped_data(self) -> set[Any]: ...


class SkippingSampler:
    """Wraps a sampler of dataset indices and leaves out the indices the Guard blamed.

        sampler = SkippingSampler(RandomSampler(dataset), guard)
        loader = DataLoader(dataset, sampler=sampler, batch_size=32)
        for indices, batch in ...:  # pass the batch's dataset indices as data_ids
            guard.step(loss, batch=batch, data_ids=indices)

    The set is read at every iteration, so indices blamed during an epoch are left out from the
    next epoch on (and from the rest of the current one).
    """

    def __init__(self, sampler: Iterable[int], source: _HasSkippedData) -> None:
        self.sampler = sampler
        self.source = source

    def __iter__(self) -> Iterator[int]:
        for index in self.sampler:
            if index not in self.source.skipped_data:
                yield index

    def __len__(self) -> int:
        if not isinstance(self.sampler, Sized):
            raise TypeError("the wrapped sampler has no length")
        return len(self.sampler)


def flatten_ids(data_ids: Any) -> list[Any]:
    """A batch's data ids as a flat list of hashable values (tensors and arrays included)."""
    if data_ids is None:
        return []
    tolist = getattr(data_ids, "tolist", None)
    if callable(tolist):
        data_ids = tolist()
    if isinstance(data_ids, (list, tuple)):
        return [item for value in data_ids for item in flatten_ids(value)]
    return [data_ids]
