"""Helpers shared by the methods (methods/_common.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedaug.methods._common import load_entries, plain_entries


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))


def entries(m: nn.Module, seed: int, keys=None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = m.state_dict()
    return {k: (torch.rand(v.shape, generator=g) * 5 if v.is_floating_point() else v + 3)
            for k, v in sd.items() if keys is None or k in keys}


@pytest.mark.parametrize("keys", [None, ["0.weight", "1.running_var", "3.bias"], ["1.num_batches_tracked"]])
def test_load_entries_equals_load_state_dict_strict_false(keys):
    fast, slow = model(), model()
    new = {**entries(fast, 1, keys), "not.in.the.model": torch.ones(2)}
    params_before = [id(p) for p in fast.parameters()]
    load_entries(fast, new)
    slow.load_state_dict(new, strict=False)
    for (k, a), (_, b) in zip(fast.state_dict().items(), slow.state_dict().items()):
        assert torch.equal(a, b), k
    assert [id(p) for p in fast.parameters()] == params_before  # copied into, not replaced


def test_load_entries_keeps_load_state_dicts_error_for_a_shape_mismatch():
    with pytest.raises(RuntimeError, match=r"size mismatch for 3\.bias"):
        load_entries(model(), {"3.bias": torch.ones(5)})


def test_a_module_with_its_own_loading_is_loaded_by_load_state_dict():
    class Doubling(nn.Linear):
        def _load_from_state_dict(self, state_dict, prefix, *args):
            state_dict = {k: v * 2 for k, v in state_dict.items()}
            super()._load_from_state_dict(state_dict, prefix, *args)

    m = nn.Sequential(Doubling(2, 2))
    load_entries(m, {"0.bias": torch.ones(2)})
    assert torch.equal(m[0].bias.detach(), torch.full((2,), 2.0))
    hooked = model()
    seen = []
    hooked[3].register_load_state_dict_post_hook(lambda module, keys: seen.append(module))
    load_entries(hooked, {"3.bias": torch.zeros(2)})
    assert seen == [hooked[3]]


class _Shared(nn.Module):
    """A module under two names, a non-persistent buffer, a None parameter and an empty child."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = self.a
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        self.register_buffer("kept", torch.ones(2))
        self.register_parameter("absent", None)
        self.inner = nn.Sequential(nn.BatchNorm1d(2), nn.Identity())


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "mobilenetv2_cifar", "unet2d"])
def test_plain_entries_are_state_dict_keep_vars_in_order(name):
    from fedaug.models.registry import build_model

    for m in (build_model(name, 3, 4), _Shared()):
        sd = m.state_dict(keep_vars=True)
        own = plain_entries(m)
        assert list(own) == list(sd) and all(own[k] is sd[k] for k in sd)


def test_plain_entries_defer_to_state_dict_where_it_would_do_more():
    class Extra(nn.Linear):
        def get_extra_state(self):
            return {"note": 1}

    class Saving(nn.Linear):
        def _save_to_state_dict(self, destination, prefix, keep_vars):
            super()._save_to_state_dict(destination, prefix, keep_vars)

    hooked = nn.Sequential(nn.Linear(2, 2))
    hooked[0].register_state_dict_post_hook(lambda *args: None)
    for m in (nn.Sequential(Extra(2, 2)), nn.Sequential(Saving(2, 2)), hooked):
        assert plain_entries(m) is None
