"""fedaug's ServerApp and ClientApp over Flower's message path in one process: same numbers as the
in-process engine, per-client state in context.state, departures recorded, bad node configs named."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from flwr.app import ArrayRecord  # noqa: E402

from fedaug.config.load import dump_toml, load_config, read_toml  # noqa: E402
from fedaug.core.errors import FedaugError  # noqa: E402
from fedaug.core.serialize import load_tensors, save_tensors  # noqa: E402
from fedaug.engine.protocol import METERS  # noqa: E402
from fedaug.engine.flower.codec import PART  # noqa: E402
from fedaug.engine.flower.client_app import make_client_app  # noqa: E402
from fedaug.engine.flower.inprocess import partition_configs, run_in_process  # noqa: E402
from fedaug.engine.records.rundir import RunDir  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.engine.flower.conftest import METHODS, records  # noqa: E402


@pytest.mark.parametrize("method", sorted(METHODS))
def test_flower_path_gives_the_in_process_engines_numbers(tmp_cfg, method):
    cfg = tmp_cfg(method, participation=0.67)  # 2 of 3 clients a round: sampling matters
    expected, run_dir = run_experiment(cfg, quiet=True)
    got = run_in_process(cfg, 3)
    assert records(got["run_dir"]) == records(run_dir.path)  # every round: sampled, losses, bytes, eval
    for key in ("final", "best", "comm_total", "clients", "metric", "rounds"):
        assert got[key] == expected[key], key
    if method == "flea":  # the post-aggregation query went over Flower messages and was counted
        assert all(r["after_aggregate"]["up"]["flea"] > 0 for r in records(got["run_dir"]))


def test_a_run_from_before_the_auto_defaults_resumes_over_flower_from_an_app_of_its_config_toml(tmp_cfg):
    """A run written before train.cuda_graph and data.on_device became "auto" holds neither in its config.toml nor
    in its checkpoints (it ran with false). An app written from that config.toml (``fedaug flower app
    PATH/config.toml``) reads them as "auto", which on this CPU is the experiment of false: the run resumes, to the
    numbers of the run not interrupted."""
    cfg = tmp_cfg("fedfa", rounds=3)
    full = run_in_process(cfg, 3)
    part = RunDir(full["run_dir"])
    for _, ckpt in part.checkpoints()[1:]:
        ckpt.unlink()
    stored = read_toml(part.path / "config.toml")
    del stored["train"]["cuda_graph"], stored["data"]["on_device"]
    (part.path / "config.toml").write_text(dump_toml(stored))
    for _, ckpt in part.checkpoints():
        payload = load_tensors(ckpt)
        del payload["config"]["train"]["cuda_graph"], payload["config"]["data"]["on_device"]
        save_tensors(ckpt, payload)
    want = records(part.path)
    other, _ = load_config(str(part.path / "config.toml"), ["train.lr=0.5"], [])
    with pytest.raises(FedaugError, match=r"was made with another config than this Flower app's \(train\.lr: 0\.05 -> "
                                          r"0\.5\); resume it with an app written from its config\.toml"):
        run_in_process(other, 3, resume_dir=str(part.path))
    assert records(part.path) == want  # nothing written
    app_cfg, _ = load_config(str(part.path / "config.toml"), [], [])
    assert app_cfg.train.cuda_graph == "auto"
    again = run_in_process(app_cfg, 3, resume_dir=str(part.path))
    assert again["rounds"] == 3 and records(part.path) == want
    assert (again["final"], again["best"]) == (full["final"], full["best"])


def test_per_client_state_lives_in_context_state(tmp_cfg):
    cfg = tmp_cfg("fedavg-bn-local")
    seen = []

    def client(msg, context):
        reply = app(msg, context)
        if msg.metadata.message_type == "train":
            seen.append((context.node_config["partition-id"], sorted(context.state)))
        return reply

    app = make_client_app()
    run_in_process(cfg, 3, client=client)
    assert {cid for cid, _ in seen} == {0, 1, 2}
    assert all(keys == ["fedaug.state.arrays", "fedaug.state.tree"] for _, keys in seen)


def failing(fail_client: int, fail_round: int, *, silent: bool = False):
    """fedaug's ClientApp, except that one client raises (or never answers) when training ``fail_round``."""
    app = make_client_app()

    def client(msg, context):
        header = msg.content.config_records.get("fedaug", {})
        if (msg.metadata.message_type == "train" and context.node_config["partition-id"] == fail_client
                and header.get("round") == fail_round):
            if silent:
                return None
            raise RuntimeError("disk full")
        return app(msg, context)

    return client


def test_a_client_that_fails_mid_run_is_recorded_and_the_run_completes(tmp_cfg):
    cfg = tmp_cfg("fedfa")
    summary = run_in_process(cfg, 3, client=failing(fail_client=1, fail_round=2))
    r1, r2 = records(summary["run_dir"])
    assert r1["dropped"] == [] and set(r1["train"]["clients"]) == {"0", "1", "2"}
    (drop,) = r2["dropped"]
    assert drop["client"] == 1 and drop["phase"] == "train" and drop["reason"] == "error"
    assert "disk full" in drop["detail"]
    assert r2["sampled"] == [0, 1, 2] and set(r2["train"]["clients"]) == {"0", "2"}
    assert summary["rounds"] == 2 and set(r2["eval"]["clients"]) == {"client0", "client1", "client2"}


def test_a_client_that_never_answers_times_out_and_the_run_completes(tmp_cfg):
    cfg = tmp_cfg("fedfa")
    summary = run_in_process(cfg, 3, client=failing(fail_client=2, fail_round=1, silent=True), round_timeout=0.3)
    r1, r2 = records(summary["run_dir"])
    (drop,) = r1["dropped"]
    assert (drop["client"], drop["phase"], drop["reason"]) == (2, "train", "timeout")
    assert drop["detail"] == "no reply to 'train' within the round timeout (run config round-timeout = 0.3 s)"
    assert set(r1["train"]["clients"]) == {"0", "1"} and r2["dropped"] == []


def test_too_few_replies_stop_the_run_naming_who_dropped_when_asked_to_stop(tmp_cfg):
    cfg = tmp_cfg("fedfa", min_clients=3, on_empty_round="stop")
    with pytest.raises(FedaugError, match=r"round 2: only 2 of 3 .*min_clients=3.*client 1 dropped \(error"):
        run_in_process(cfg, 3, client=failing(fail_client=1, fail_round=2))


def test_too_few_replies_keep_the_previous_state_by_default_and_the_run_finishes(tmp_cfg):
    summary = run_in_process(tmp_cfg("fedfa", min_clients=3), 3, client=failing(fail_client=1, fail_round=2))
    r1, r2 = records(summary["run_dir"])
    assert summary["rounds"] == 2 and "aggregate" not in r1 and [d["client"] for d in r2["dropped"]] == [1]
    assert r2["aggregate"] == [{"phase": "train", "kept": "previous", "reason": (
        "round 2: only 2 of 3 uploads passed validation, fewer than train.min_clients=3")}]


@pytest.mark.parametrize("configs, message", [
    ([{"partition-id": 0, "num-partitions": 2}, {"partition-id": 1, "num-partitions": 2}],
     r"num-partitions=2, but dataset 'synthetic' with these options has 3 clients; start 3 SuperNodes"),
    ([{"partition-id": 0, "num-partitions": 3}, {"partition-id": 0, "num-partitions": 3},
      {"partition-id": 2, "num-partitions": 3}], r"partition-id 0 is claimed by SuperNodes \d+ and \d+"),
    ([{"num-partitions": 3}] * 3, r"'partition-id' must be an integer, got None.*--node-config 'partition-id=K"),
    ([{"partition-id": k, "num-partitions": 3, "data-dir": "/data/site"} for k in range(3)],
     r"data-dir='/data/site', but dataset 'synthetic' reads no local directory; datasets that do: .*cifar10"),
])
def test_bad_node_configs_fail_with_the_fix(tmp_cfg, configs, message):
    with pytest.raises(FedaugError, match=message):
        run_in_process(tmp_cfg("fedfa"), 3, node_configs=configs)


def test_a_registered_supernode_that_never_answers_does_not_hold_up_the_run(tmp_cfg):
    app = make_client_app()

    def client(msg, context):  # a stale registration: a node with no client behind it
        return None if context.node_config.get("stale") else app(msg, context)

    configs = [*partition_configs(3), {"stale": True}]
    summary = run_in_process(tmp_cfg("fedfa"), 3, client=client, node_configs=configs, connect_timeout=1.0)
    assert summary["rounds"] == 2 and all(r["dropped"] == [] for r in records(summary["run_dir"]))


def test_missing_supernodes_fail_after_the_connect_timeout(tmp_cfg):
    with pytest.raises(FedaugError, match=r"only 2 of 3 clients have a SuperNode after 0.2 s \(partition ids seen: \[0, 1\]\)"):
        run_in_process(tmp_cfg("fedfa"), 3, node_configs=partition_configs(3)[:2], connect_timeout=0.2)



def test_sites_read_their_data_dir_and_match_the_engine_reading_the_same_root(tmp_path, monkeypatch):
    import pickle

    import numpy as np

    from fedaug.config.schema import validate
    from tests.conftest import tiny_raw

    monkeypatch.setenv("FEDAUG_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "site-data"  # a CIFAR-10 layout (python batches), as each site would hold it
    root.mkdir()
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", 20) for i in range(1, 6)), ("test_batch", 20)]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(np.arange(n) % 10)}
        (root / name).write_bytes(pickle.dumps(batch))
    raw = tiny_raw(rounds=1, local_steps=1)
    raw["data"] = {"name": "cifar10", "options": {"partition": "iid", "num_clients": 2, "min_size": 1}}
    raw["out_dir"] = str(tmp_path / "runs")
    site_cfg = validate(raw)  # the server's config names no directory: each site names its own
    raw["data"]["options"]["root"] = str(root)
    _, run_dir = run_experiment(validate(raw), quiet=True)
    sites = [{"partition-id": k, "num-partitions": 2, "data-dir": str(root)} for k in range(2)]
    got = run_in_process(site_cfg, 2, node_configs=sites, quiet=True)
    assert records(got["run_dir"]) == records(run_dir.path)
    assert "local files in" in str(got["data_info"]["sources"])


def corrupting_evaluation(fn):
    """fedaug's ClientApp, except that ``fn(partition id, msg)`` may rewrite evaluation messages: the
    incoming one before the app sees it, and the reply the app returns."""
    app = make_client_app()

    def client(msg, context):
        if msg.metadata.message_type != "evaluate":
            return app(msg, context)
        return fn(context.node_config["partition-id"], app, msg, context)

    return client


def test_malformed_evaluation_replies_over_flower_are_rejected_with_reasons(tmp_cfg):
    def corrupt(pid, app, msg, context):
        out = app(msg, context)
        if pid == 1:  # a negative count in its meters
            meters = dict(out.content[PART + METERS].to_torch_state_dict())
            meters["test.count"] = torch.tensor(-5)
            out.content[PART + METERS] = ArrayRecord(meters)
        elif pid == 2:  # no meters at all
            del out.content[PART + METERS]
        return out

    summary = run_in_process(tmp_cfg("fedfa"), 3, client=corrupting_evaluation(corrupt))
    for rec in records(summary["run_dir"]):
        ev = rec["eval"]
        assert [(x["client"], x["phase"]) for x in ev["rejected"]] == [(1, "evaluate"), (2, "evaluate")]
        assert "negative test.count" in ev["rejected"][0]["reason"]
        assert "missing" in ev["rejected"][1]["reason"]
        assert list(ev["clients"]) == ["client0"]
        assert ev["comm"]["down"]["fedavg"] > 0  # the evaluation downlink (the weights) was counted


def test_a_malformed_evaluation_downlink_over_flower_drops_that_client_naming_the_fault(tmp_cfg):
    def corrupt(pid, app, msg, context):
        if pid == 0:  # one weight tensor arrives with the wrong length
            part = dict(msg.content[PART + "fedavg"].to_torch_state_dict())
            key = sorted(part)[0]
            part[key] = torch.zeros(part[key].numel() + 1)
            msg.content[PART + "fedavg"] = ArrayRecord(part)
        return app(msg, context)

    summary = run_in_process(tmp_cfg("fedfa"), 3, client=corrupting_evaluation(corrupt))
    for rec in records(summary["run_dir"]):
        (drop,) = rec["eval"]["dropped"]
        assert (drop["client"], drop["phase"], drop["reason"]) == (0, "evaluate", "error")
        assert "part 'fedavg'" in drop["detail"] and "shape" in drop["detail"]
        assert set(rec["eval"]["clients"]) == {"client1", "client2"}


@pytest.mark.parametrize(("workers", "group", "said"), [(2, 1, r"workers=2, devices=\[\] and train\.group_clients=1"),
                                                     (1, 3, r"workers=1, devices=\[\] and train\.group_clients=3")])
def test_workers_and_groups_are_the_in_process_engines_and_flower_says_they_change_nothing(tmp_cfg, workers, group,
                                                                                           said):
    from fedaug.config.schema import validate

    raw = tmp_cfg("fedavg-bn-local").to_dict()
    cfg = validate({**raw, "workers": workers, "train": {**raw["train"], "group_clients": group}})
    with pytest.warns(UserWarning, match=said + r" arrange the in-process engine's clients; on Flower every SuperNode "
                                                r"runs its own client, and they change nothing here"):
        got = run_in_process(cfg, 3)
    assert got["rounds"] == cfg.train.rounds


def test_finetuned_and_sampled_evaluation_give_the_same_numbers_over_flower(tmp_cfg):
    """eval.finetune_steps sends the training downlinks under finetune/<name> in the evaluation
    message; over Flower's records they arrive as in-process, and so do the fine-tuned figures."""
    cfg = tmp_cfg("fedfa", participation=0.67)
    cfg.eval.finetune_steps, cfg.eval.clients = 2, "sampled"
    expected, run_dir = run_experiment(cfg, quiet=True)
    got = run_in_process(cfg, 3)
    assert records(got["run_dir"]) == records(run_dir.path)
    final = got["final"]["eval"]
    assert final["finetuned"] == expected["final"]["eval"]["finetuned"] and len(final["clients"]) == 2
    assert final["comm"]["down"]["finetune/fedfa"] > 0
