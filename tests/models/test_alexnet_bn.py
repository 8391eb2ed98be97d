"""AlexNet-BN against FedFA (ICLR 2023) Table 10 and Appendix E.6."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.layers.attach import stage_channels
from fedaug.models.alexnet_bn import AlexNetBN


def test_parameter_count_matches_the_papers_model_size():
    n = sum(p.numel() for p in AlexNetBN(3, 10).parameters())
    assert n == 12_974_154
    assert n * 4 / 2**20 == pytest.approx(49.5, abs=0.05)  # FedFA App. E.6: 49.5 MB per model (fp32)


def test_paper_input_256_gives_logits():  # shapes only: meta tensors compute no values
    with torch.device("meta"):
        assert AlexNetBN(3, 10)(torch.empty(32, 3, 256, 256)).shape == (32, 10)


def test_stage_channels_are_table_10s_ffa_widths():
    model = AlexNetBN(3, 10)
    assert stage_channels(model, torch.zeros(2, 3, 64, 64)) == {
        "conv1": 64, "conv2": 192, "conv3": 384, "conv4": 256, "conv5": 256,
    }  # fmt: skip


@pytest.mark.parametrize(("side", "ok"), [(63, True), (62, False)])  # three 3x3/2 poolings need >= 63
def test_smallest_input(side, ok):
    model = AlexNetBN(3, 10).eval()
    if ok:
        assert model(torch.zeros(1, 3, side, side)).shape == (1, 10)
    else:
        with pytest.raises(RuntimeError):
            model(torch.zeros(1, 3, side, side))


def test_hidden_width_is_configurable_and_checked():
    assert AlexNetBN(3, 10, hidden=64).fc3.in_features == 64
    with pytest.raises(ConfigError, match=r"alexnet_bn\.hidden"):
        AlexNetBN(3, 10, hidden=0)
