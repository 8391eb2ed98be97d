"""FedAvg's 2NN (McMahan et al. 2017, Sec. 3)."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.models import build_model
from fedaug.models.mlp import MLP


def test_the_papers_2nn_has_199210_parameters():
    # 784*200+200 + 200*200+200 + 200*10+10, as the FedAvg paper's "199,210 total parameters"
    model = build_model("mlp", 1, 10)
    assert sum(p.numel() for p in model.parameters()) == 199_210
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_hidden_widths_and_input_size():
    model = build_model("mlp", 3, 5, input_size=8, hidden=[16])
    assert [m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)] == [16, 5]
    assert model.feature_stages == ("fc1",)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 5)


@pytest.mark.parametrize("hidden", [(), (0,), (200, -1)])
def test_bad_hidden_widths_are_a_config_error(hidden):
    with pytest.raises(ConfigError, match=r"mlp\.hidden must be a non-empty list of positive widths"):
        MLP(784, 10, hidden)
