"""The trust boundary on Flower's message path (issue 21): a real ServerApp over ``InProcessGrid``.
Every attack of the in-process engine, plus replies whose Flower records are missing or malformed
and SuperNodes that describe themselves falsely: the culprit is rejected (or left out) with its
reason, the ServerApp never fails, the global state stays finite, and the run resumes."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from fedaug.config.schema import validate  # noqa: E402
from fedaug.core.errors import FedaugError  # noqa: E402
from fedaug.core.payload import TensorSpec  # noqa: E402
from fedaug.engine.server.exchange import exchange  # noqa: E402
from fedaug.engine.flower.client_app import METRICS, PHASE_TYPES, make_client_app  # noqa: E402
from fedaug.engine.flower.codec import PART  # noqa: E402
from fedaug.engine.flower.inprocess import run_in_process, server_identity, wire  # noqa: E402
from fedaug.engine.flower.server_app import FlowerFleet, describe_problems  # noqa: E402
from fedaug.engine.records.rundir import RunDir  # noqa: E402
from tests.engine.attacks import ATTACKS, attack_raw, finite  # noqa: E402
from tests.engine.flower.conftest import records  # noqa: E402


def hostile(rewrite, message_type: str, *, partition: int = 1, round: int = 1):
    """fedaug's ClientApp, except that ``rewrite(content)`` edits ``partition``'s reply to
    ``message_type`` in ``round``."""
    app = make_client_app()

    def client(msg, context):
        out = app(msg, context)
        header = msg.content.config_records.get("fedaug", {})
        if (msg.metadata.message_type == message_type and context.node_config["partition-id"] == partition
                and header.get("round") == round):
            rewrite(out.content)
        return out

    return client


def cfg_of(raw, tmp_path):
    return validate({**raw, "out_dir": str(tmp_path / "runs")})


def finish_again(cfg, run_dir: str) -> dict:
    """Drop the newest checkpoint and let a new Flower run (no attacker) finish the run."""
    RunDir(run_dir).checkpoints()[-1][1].unlink()
    return run_in_process(cfg, 3, resume_dir=run_dir)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_over_flower_is_rejected_and_the_run_resumes(tmp_path, name):
    attack = ATTACKS[name]
    cfg = cfg_of(attack_raw(attack), tmp_path)

    def rewrite(content):
        key = PART + attack.part
        content[key] = ArrayRecord(attack.corrupt(dict(content[key].to_torch_state_dict())))

    summary = run_in_process(cfg, 3, client=hostile(rewrite, PHASE_TYPES[attack.phase]))
    r1, r2 = records(summary["run_dir"])
    (culprit,) = r1["rejected"]
    assert culprit["client"] == 1 and re.search(attack.reason, culprit["reason"]), culprit
    assert r2["rejected"] == [] and summary["rounds"] == 2
    assert finite(RunDir(summary["run_dir"]).load_latest()["server"])
    again = finish_again(cfg, summary["run_dir"])
    assert again["rounds"] == 2 and [r["round"] for r in records(summary["run_dir"])] == [1, 2]


def _drop(key):
    return lambda content: content.__delitem__(key)


@pytest.mark.parametrize("message_type, rewrite, reason", [
    ("train", _drop(METRICS), r"the reply lacks its 'metrics' record"),
    ("train", _drop("state"), r"the reply lacks its 'state' record"),
    ("train", lambda c: c.__setitem__("state", ConfigRecord({"has_state": True, "bytes": "lots"})),
     r"bytes \(an integer >= 0\), got has_state=True, bytes='lots'"),
    ("train", lambda c: c.__setitem__(METRICS, MetricRecord({"loss": [1.0, 2.0], "steps": 2})),
     r"metric 'loss' must be a finite number"),
    ("train", _drop(PART + "fedavg"), r"part 'fedavg': missing"),
    ("evaluate", lambda c: c.__setitem__(PART + "meters", ArrayRecord({"bogus": torch.zeros(3)})),
     r"evaluation reply of client 1.*meters"),
])
def test_malformed_flower_replies_are_rejected_and_the_server_goes_on(tmp_path, message_type, rewrite, reason):
    summary = run_in_process(cfg_of(attack_raw(ATTACKS["fedavg weights of 1e30"]), tmp_path), 3,
                             client=hostile(rewrite, message_type))
    r1 = records(summary["run_dir"])[0]
    rejected = r1["rejected"] if message_type == "train" else r1["eval"]["rejected"]
    (culprit,) = rejected
    assert culprit["client"] == 1 and re.search(reason, culprit["reason"]), culprit
    assert summary["rounds"] == 2
    if message_type == "train":  # the bytes of a rejected upload travelled too: counted (issue 41)
        per_client = r1["comm"]["down"]["fedavg"] // 3  # every client receives the same weights and sends them back
        carried = 2 if "missing" in reason else 3  # client 1's reply lacks its weights, or carries them malformed
        assert r1["comm"]["up"]["fedavg"] == carried * per_client


def describing(change):
    """fedaug's ClientApp, except that partition 2's describe record is changed by ``change``."""
    app = make_client_app()

    def client(msg, context):
        out = app(msg, context)
        if msg.metadata.message_type == "query.describe" and context.node_config.get("partition-id") == 2:
            d = dict(out.content.config_records["describe"])
            change(d)
            out.content["describe"] = ConfigRecord(d)
        return out

    return client


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(num_train=-5), r"'num_train' must be an integer >= 1, got -5"),
    (lambda d: d.update(num_train=10**12), r"'num_train' = 1000000000000 is over trust.max_num_train"),
    (lambda d: d.update(num_train="many"), r"'num_train' must be an integer >= 1, got 'many'"),
    (lambda d: d.pop("task"), r"'task' must be a string, got None"),
    (lambda d: d.update(info="{not json"), r"'info' must be a JSON object"),
])
def test_a_supernode_that_describes_itself_falsely_is_left_out_with_the_reason(tmp_path, change, reason):
    cfg = cfg_of(attack_raw(ATTACKS["fedavg weights of 1e30"]), tmp_path)
    with pytest.raises(FedaugError, match=r"only 2 of 3 clients have a SuperNode.*SuperNode \d+ was left out: "
                                          r"its describe record is malformed \(.*" + reason):
        run_in_process(cfg, 3, client=describing(change), connect_timeout=0.5)


def test_describe_problems_accepts_an_honest_record():
    honest = {"client": 0, "num_partitions": 3, "name": "a", "num_train": 10, "num_val": 0, "num_test": 5,
              "task": "classification", "num_classes": 4, "input_shape": [1, 8, 8], "info": "{}"}
    assert describe_problems(honest, 10**9) == []
    assert describe_problems({**honest, "client": 3}, 10**9) == ["'client' = 3 is not below num_partitions = 3"]


def test_a_flower_run_whose_clients_keep_state_is_not_resumed(tmp_path):
    raw = attack_raw(ATTACKS["fedavg weights of 1e30"])
    raw["method"] = {"options": {"fedavg": {"bn": "local"}}}  # BatchNorm stays on the clients
    cfg = cfg_of(raw, tmp_path)
    summary = run_in_process(cfg, 3)
    with pytest.raises(FedaugError, match=r"keeps per-client state on its SuperNodes \(rounds 1-2\)"):
        finish_again(cfg, summary["run_dir"])


# --- fuzz: arbitrary reply records never raise out of the server ------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(max_size=5))
tensors = st.builds(lambda shape, fill, dtype: torch.full(shape, fill).to(dtype),
                    st.lists(st.integers(0, 3), max_size=3).map(tuple),
                    st.floats(allow_nan=True, width=32), st.sampled_from([torch.float32, torch.int64, torch.float64]))
names = st.sampled_from(["fedavg", "fedfa", "meters", "x", ""])
records_ = st.fixed_dictionaries({}, optional={
    "parts": st.dictionaries(names, st.dictionaries(st.text(max_size=12), tensors, max_size=3), max_size=3),
    "metrics": st.dictionaries(st.sampled_from(["loss", "steps", "task", "z"]),
                               st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, width=32)), max_size=4),
    "state": st.dictionaries(st.sampled_from(["has_state", "bytes", "junk"]), scalars, max_size=3),
})


class FuzzedGrid:
    """Stands in for Flower's Grid: answers every message with the fuzzed content."""

    def __init__(self, content):
        self.content = content

    def send_and_receive(self, messages, timeout=None):
        return [wire(Message(self.content, reply_to=m)) for m in messages]  # as over the network


def fuzz_content(rec) -> RecordDict:
    content = RecordDict()
    for name, part in rec.get("parts", {}).items():
        content[PART + name] = ArrayRecord({k: t for k, t in part.items()})
    if "metrics" in rec:
        content[METRICS] = MetricRecord(rec["metrics"])
    if "state" in rec:
        content["state"] = ConfigRecord({k: v for k, v in rec["state"].items() if v is not None})
    return content


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rec=records_, phase=st.sampled_from(["train", "query", "evaluate"]))
def test_fuzzed_replies_never_raise_out_of_the_decoder_or_the_validator(rec, phase):
    try:
        content = fuzz_content(rec)
    except Exception:  # Flower itself refuses to hold it: nothing can arrive like this
        return
    fleet = FlowerFleet(FuzzedGrid(content), {0: 1}, round_timeout=None)
    specs = {"fedavg": {"w": TensorSpec((2,), torch.float32)}} if phase != "evaluate" else {"meters": {}}
    with server_identity(1):
        out = exchange(phase, 1, 0.1, [0], fleet, [], {}, specs, lambda part: 1e6)
    assert len(out.replies) + len(out.rejected) == 1
    for rejection in out.rejected:
        assert rejection["client"] == 0 and rejection["reason"].startswith("round 1:")
