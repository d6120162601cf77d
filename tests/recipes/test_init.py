"""Head initialisation: the std 0.02 recipe on real layers, against Kaiming's scale."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainguard.errors import ConfigError, UsageError
from trainguard.recipes import HEAD_STD, init_new_head, kaiming_like_std


def test_512_by_512_head_gets_std_002_and_zero_bias() -> None:
    torch.manual_seed(0)
    head = nn.Linear(512, 512)
    assert init_new_head(head) == [""]
    weight = head.weight.detach()
    # 262144 samples: the std's relative standard error is ~0.14%, the mean's 0.02 / 512.
    assert float(weight.std()) == pytest.approx(HEAD_STD, rel=0.02)
    assert abs(float(weight.mean())) < 5 * HEAD_STD / 512
    assert torch.count_nonzero(head.bias) == 0
    assert head.weight.requires_grad and head.weight.grad is None  # still a trainable leaf


def test_every_linear_in_a_head_is_initialised_and_nothing_else() -> None:
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 10))
    with torch.no_grad():
        head[1].weight.fill_(3.0)
    assert init_new_head(head, std=0.05) == ["0", "3"]
    for linear in (head[0], head[3]):
        assert float(linear.weight.detach().std()) == pytest.approx(0.05, rel=0.1)
        assert torch.count_nonzero(linear.bias) == 0
    assert torch.all(head[1].weight == 3.0)  # the norm is not a Linear: left alone


def test_zero_bias_false_keeps_biases() -> None:
    torch.manual_seed(0)
    head = nn.Linear(64, 4)
    bias = head.bias.detach().clone()
    init_new_head(head, zero_bias=False)
    assert torch.equal(head.bias, bias)


def test_small_head_init_starts_near_uniform_predictions_with_smaller_gradients() -> None:
    torch.manual_seed(0)
    features = F.layer_norm(torch.randn(64, 512), (512,))  # what a backbone hands a new head
    labels = torch.randint(0, 10, (64,))

    def loss_and_grad_norm(head: nn.Linear) -> tuple[float, float]:
        loss = F.cross_entropy(head(features), labels)
        loss.backward()
        return float(loss.detach()), float(head.weight.grad.norm())

    default = nn.Linear(512, 10)  # PyTorch's default scale, 1 / sqrt(3 * fan_in)
    recipe = nn.Linear(512, 10)
    init_new_head(recipe)
    default_loss, default_grad = loss_and_grad_norm(default)
    recipe_loss, recipe_grad = loss_and_grad_norm(recipe)
    assert abs(recipe_loss - math.log(10)) < 0.1
    assert recipe_loss < default_loss and recipe_grad < default_grad


def test_kaiming_like_std_matches_torch_kaiming_init() -> None:
    torch.manual_seed(0)
    weight = torch.empty(512, 512)
    assert kaiming_like_std(weight) == pytest.approx(math.sqrt(2 / 512))
    assert kaiming_like_std(weight, "linear") == pytest.approx(1 / math.sqrt(512))
    nn.init.kaiming_normal_(weight, nonlinearity="relu")
    assert float(weight.std()) == pytest.approx(kaiming_like_std(weight), rel=0.02)
    conv = torch.empty(16, 3, 3, 3)
    assert kaiming_like_std(conv) == pytest.approx(math.sqrt(2 / 27))
    # The head recipe is below Kaiming's scale for fan_in under 5000, above it beyond.
    assert HEAD_STD < kaiming_like_std(torch.empty(10, 4096))
    assert HEAD_STD > kaiming_like_std(torch.empty(10, 8192))


@pytest.mark.parametrize("std", [0, -0.02, math.nan, math.inf, True])
def test_bad_std_is_a_config_error(std) -> None:
    with pytest.raises(ConfigError, match="std"):
        init_new_head(nn.Linear(4, 4), std=std)


def test_bad_modules_and_weights_are_clear_errors() -> None:
    with pytest.raises(UsageError, match=r"no nn\.Linear"):
        init_new_head(nn.Sequential(nn.LayerNorm(4), nn.ReLU()))
    with pytest.raises(UsageError, match=r"torch\.nn\.Module"):
        init_new_head(torch.zeros(4, 4))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="at least 2 dimensions"):
        kaiming_like_std(torch.zeros(4))
    with pytest.raises(ConfigError, match="nonlinearity"):
        kaiming_like_std(torch.zeros(4, 4), "swish")
