"""The evaluation meters keep their sums on the logits' device: adding batches reads nothing on the host (a GPU
synchronisation each), and the sums are the bits of the host accumulation of Python floats they replace; the
server reads a reply's counts at once (meters_of) and gets the same results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedaug.engine.protocol import meters_part
from fedaug.engine.server.evaluation import meters_of
from fedaug.metrics.classification import ClassificationMeter
from fedaug.metrics.segmentation import SegmentationMeter, segmentation_loss
from fedaug.metrics.tasks import make_task


def updated(meter, data, monkeypatch):
    """``meter`` after adding ``data``'s batches, which fails where it reads a tensor on the host."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a meter read a tensor on the host while adding a batch")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
            m.setattr(torch.Tensor, name, refuse)
        for logits, y in data:
            meter.update(logits, y)
    return meter


def batches(seed: int, shape: tuple[int, ...], k: int, n: int = 5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, k, *shape, generator=g) * 3, torch.randint(0, k, (b, *shape), generator=g))
            for b in torch.randint(1, 9, (n,), generator=g).tolist()]


def test_classification_sums_are_the_host_sums_and_need_no_read(monkeypatch):
    data = batches(0, (), 7)
    state = updated(ClassificationMeter(), data, monkeypatch).state()
    loss_sum, correct = 0.0, 0
    for logits, y in data:  # the accumulation the meter replaced
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    assert state["loss_sum"].dtype == torch.float64 and float(state["loss_sum"]) == loss_sum  # the same bits
    assert int(state["correct"]) == correct and state["count"] == sum(len(y) for _, y in data)


def test_segmentation_sums_are_the_host_sums_and_need_no_read(monkeypatch):
    data = batches(1, (4, 5), 3)
    state = updated(SegmentationMeter(3), data, monkeypatch).state()
    loss_sum = 0.0
    for logits, y in data:
        loss_sum += float(segmentation_loss(logits, y)) * y.shape[0]
    assert float(state["loss_sum"]) == loss_sum
    pred = torch.cat([l.argmax(1).flatten() for l, _ in data])
    true = torch.cat([y.flatten() for _, y in data])
    assert torch.equal(state["tp"], torch.bincount(true[pred == true], minlength=3).double())
    assert torch.equal(state["pred"], torch.bincount(pred, minlength=3).double())


@pytest.mark.parametrize("name, k, shape", [("classification", 7, ()), ("segmentation", 3, (4, 5))])
def test_the_server_reads_a_reply_at_once_and_gets_the_clients_results(monkeypatch, name, k, shape):
    task = make_task(name, k)
    sent = {}
    for split, seed in (("val", 2), ("test", 3)):
        sent[split] = task.meter()
        for logits, y in batches(seed, shape, k):
            sent[split].update(logits, y)
    part = meters_part(sent)
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or original(t))
    got = meters_of(task, part)
    assert len(reads) == 1
    monkeypatch.undo()
    assert {s: m.result() for s, m in got.items()} == {s: m.result() for s, m in sent.items()}
