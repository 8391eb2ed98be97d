"""``fedaug flower app | local | run``: the written app, the printed trial commands, an in-process run."""

from __future__ import annotations

import json
import shlex

import pytest

pytest.importorskip("flwr", reason="fedaug flower needs the flower extra: pip install 'fedaug[flower]'")

from fedaug.cli.main import main  # noqa: E402
from fedaug.config.load import dump_toml  # noqa: E402
from fedaug.engine.run import run_experiment  # noqa: E402
from tests.engine.flower.conftest import flower_cfg  # noqa: E402


@pytest.fixture
def cfg_file(tmp_path):
    cfg = flower_cfg(tmp_path / "runs", "fedfa", num_clients=2)
    path = tmp_path / "cfg.toml"
    path.write_text(dump_toml(cfg.to_dict()))
    return path


def test_app_writes_a_flower_app_and_refuses_to_overwrite_it(cfg_file, tmp_path, capsys):
    assert main(["flower", "app", str(cfg_file), "train.rounds=4", "--out", str(tmp_path / "app")]) == 0
    text = (tmp_path / "app" / "pyproject.toml").read_text()
    assert 'serverapp = "fedaug_app.server_app:app"' in text and "rounds = 4" in text
    assert "flwr run" in capsys.readouterr().out
    assert main(["flower", "app", str(cfg_file), "--out", str(tmp_path / "app")]) == 2
    assert "already holds a pyproject.toml" in capsys.readouterr().err


def test_local_prints_the_trial_commands_in_order(cfg_file, tmp_path, capsys):
    assert main(["flower", "local", str(cfg_file), "--dir", str(tmp_path / "trial"), "--tls", "--auth"]) == 0
    lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    programs = [next(w for w in words if "=" not in w) for words in lines]
    assert programs == ["flower-superlink", "flwr", "flwr", "flower-supernode", "flower-supernode", "flwr"]
    assert all("FLWR_TELEMETRY_ENABLED=0" in words for words in lines)
    link, node = lines[0], lines[3]
    assert "--enable-supernode-auth" in link and "--ssl-certfile" in link and "--insecure" not in link
    assert "partition-id=0 num-partitions=2" in node and "--root-certificates" in node
    assert (tmp_path / "trial" / "certs" / "ca.crt").is_file() and (tmp_path / "trial" / "keys" / "supernode-1.pub").is_file()
    assert 'root-certificates = "' in (tmp_path / "trial" / "cli" / "config.toml").read_text()


def test_local_prints_a_clear_trial_without_certificates_or_keys(cfg_file, tmp_path, capsys):
    """The trial the users start with: the same commands, in the clear (what the loopback deployment of
    tests/engine/flower/test_deployment.py runs with TLS and authentication)."""
    assert main(["flower", "local", str(cfg_file), "--dir", str(tmp_path / "trial")]) == 0
    lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    programs = [next(w for w in words if "=" not in w) for words in lines]
    assert programs == ["flower-superlink", "flower-supernode", "flower-supernode", "flwr"]
    link, nodes = lines[0], lines[1:3]
    assert "--insecure" in link and not {"--enable-supernode-auth", "--ssl-certfile"} & set(link)
    assert all("--insecure" in node and "--root-certificates" not in node and "--auth-supernode-private-key" not in node
               for node in nodes)
    assert "insecure = true" in (tmp_path / "trial" / "cli" / "config.toml").read_text()
    assert not (tmp_path / "trial" / "certs").exists() and not (tmp_path / "trial" / "keys").exists()


def test_run_in_process_prints_the_engines_summary(cfg_file, capsys):
    assert main(["flower", "run", str(cfg_file), "-q", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    expected, _ = run_experiment(flower_cfg(cfg_file.parent / "engine", "fedfa", num_clients=2), quiet=True)
    assert (got["final"], got["comm_total"]) == (expected["final"], expected["comm_total"])
