"""The one road from device to host: blocking and started copies, and their counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainguard.probes.packing import DevicePack
from trainguard.transfer import (
    blocking_transfer_count,
    start_to_host,
    to_host,
    transfer_count,
)


def test_a_blocking_copy_counts_as_a_blocking_transfer() -> None:
    before, blocking = transfer_count(), blocking_transfer_count()
    host = to_host(torch.tensor([1.0, math.nan, math.inf]))
    assert host.dtype == np.float64
    assert host[0] == 1.0 and math.isnan(host[1]) and host[2] == math.inf
    assert (transfer_count() - before, blocking_transfer_count() - blocking) == (1, 1)


def test_a_started_copy_is_a_transfer_that_blocks_nothing() -> None:
    before, blocking = transfer_count(), blocking_transfer_count()
    copy = start_to_host(torch.tensor([2.0, -math.inf], dtype=torch.float16))
    assert copy.ready()
    host = copy.result()
    assert host.dtype == np.float64 and host[0] == 2.0 and host[1] == -math.inf
    assert (transfer_count() - before, blocking_transfer_count() - blocking) == (1, 0)


def test_a_pack_started_reads_as_the_pack_fetched() -> None:
    def pack() -> DevicePack:
        p = DevicePack(torch.device("cpu"))
        p.add("loss", torch.tensor(2.5))
        p.add("norms", torch.tensor([1.0, math.nan], dtype=torch.float64))
        return p

    fetched, started = pack().fetch(), pack().start_fetch().result()
    assert fetched.keys() == started.keys() == {"loss", "norms"}
    for key in fetched:
        np.testing.assert_array_equal(fetched[key], started[key])
    assert DevicePack().start_fetch().result() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_started_copy_from_cuda_lands_in_pinned_memory() -> None:
    values = torch.arange(1000, dtype=torch.float32, device="cuda")
    copy = start_to_host(values * 2)
    assert copy._host.is_pinned()
    np.testing.assert_array_equal(copy.result(), np.arange(1000) * 2.0)
