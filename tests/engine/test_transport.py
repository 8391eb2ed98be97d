"""Nests of tensors between the server and a worker process (engine/transport.py)."""

from __future__ import annotations

import threading
from multiprocessing import Pipe

import torch

from fedaug.engine.fleet.transport import Channel


def pair() -> tuple[Channel, Channel]:
    a, b = Pipe()
    return Channel(a), Channel(b)


def roundtrip(sender: Channel, receiver: Channel, obj, **kw):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("got", receiver.recv()))  # a big message fills the pipe
    t.start()
    sender.send(obj, **kw)
    t.join(timeout=30)
    return out["got"]


def test_every_dtype_and_shape_arrives_equal():
    g = torch.Generator().manual_seed(0)
    nest = {
        "w": torch.randn(3, 4, generator=g), "bf16": torch.randn(5, generator=g).bfloat16(),
        "half": torch.randn(2, 2, generator=g).half(), "i64": torch.randint(-9, 9, (7,), generator=g),
        "bool": torch.rand(6, generator=g) > 0.5, "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
        "strided": torch.randn(4, 6, generator=g)[:, ::2], "big": torch.randn(300_000, generator=g),
        "meta": ["text", 3, 1.5, None, (torch.arange(3),)],
    }
    a, b = pair()
    got = roundtrip(a, b, nest)
    for k, v in nest.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    assert got["meta"][:4] == ["text", 3, 1.5, None] and torch.equal(got["meta"][4][0], torch.arange(3))


def test_a_tensor_sent_again_unchanged_travels_as_a_reference_until_reset():
    w = torch.randn(1000)
    a, b = pair()
    first = roundtrip(a, b, {"w": w, "again": w})
    assert first["w"] is first["again"]  # once within one message
    second = roundtrip(a, b, {"w": w})
    assert second["w"] is first["w"]  # and across messages: the receiver's tensor again
    w.add_(1.0)  # changed in place: its bytes travel again
    third = roundtrip(a, b, {"w": w})
    assert third["w"] is not first["w"] and torch.equal(third["w"], w)
    a.reset()
    b.reset()
    fourth = roundtrip(a, b, {"w": w})
    assert fourth["w"] is not third["w"] and torch.equal(fourth["w"], w)


def test_what_is_not_remembered_is_sent_whole_every_time():
    w = torch.randn(10)
    a, b = pair()
    one, two = roundtrip(a, b, w, remember=False), roundtrip(a, b, w, remember=False)
    assert one is not two and torch.equal(one, two) and not a._sent
