"""What a step's own batch explains of a gradient's rise: a smaller batch's noise, a harder
batch's steeper slopes; nothing for a larger or easier one, or when nothing is known."""

from __future__ import annotations

import json
import math

import pytest

from trainguard.detect.batch_noise import MIN_LOSSES, BatchNoise


def test_a_batch_of_a_quarter_of_the_typical_elements_explains_twice_the_ratio() -> None:
    noise = BatchNoise(50)
    for _ in range(20):
        assert noise.log_discount(512, None) == 0.0
    assert math.exp(noise.log_discount(128, None)) == pytest.approx(2.0)
    assert noise.typical == 512
    assert noise.log_discount(1024, None) == 0.0  # a larger batch is given nothing


def test_a_loss_four_times_the_typical_one_explains_twice_the_ratio() -> None:
    noise = BatchNoise(50)
    for _ in range(MIN_LOSSES - 1):
        assert noise.log_discount(None, 2.0) == 0.0
    assert noise.log_discount(None, 8.0) == 0.0  # not enough losses seen to judge yet
    noise = BatchNoise(50)
    for _ in range(MIN_LOSSES):
        noise.log_discount(None, 2.0)
    assert math.exp(noise.log_discount(None, 8.0)) == pytest.approx(2.0)
    assert noise.log_discount(None, 1.0) == 0.0  # an easier batch is given nothing


def test_both_explain_together() -> None:
    noise = BatchNoise(50)
    for _ in range(MIN_LOSSES):
        noise.log_discount(400, 1.0)
    assert math.exp(noise.log_discount(100, 4.0)) == pytest.approx(4.0)
    assert (math.exp(noise.size_part), math.exp(noise.loss_part)) == pytest.approx((2.0, 2.0))


@pytest.mark.parametrize("elements, loss", [(None, None), (0, math.nan), (None, math.inf),
                                            (None, -1.0), (None, 0.0)])
def test_nothing_known_explains_nothing(elements: int | None, loss: float | None) -> None:
    noise = BatchNoise(50)
    for _ in range(MIN_LOSSES):
        noise.log_discount(512, 1.0)
    before = noise.state_dict()
    assert noise.log_discount(elements, loss) == 0.0
    assert noise.state_dict() == before  # and is not remembered


def test_a_state_round_trip_explains_the_same() -> None:
    noise = BatchNoise(50)
    for i in range(30):
        noise.log_discount(256 + 8 * i, 1.0 + 0.01 * i)
    again = BatchNoise(50)
    again.load_state_dict(json.loads(json.dumps(noise.state_dict())))
    assert again.log_discount(64, 3.0) == noise.log_discount(64, 3.0) > 0
