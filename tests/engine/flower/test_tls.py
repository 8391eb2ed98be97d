"""Trial certificates and keys (issue 52): private keys 0600 in a 0700 directory under the usual umask
022, certificates and public keys as any file, older keys that other users can read named in a warning.
The keys are read back with ``cryptography`` to show they are the keys the certificates hold."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower adapter's tests need the flower extra: pip install 'fedaug[flower]'")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402

from fedaug.engine.flower.local import LoopbackTrial  # noqa: E402
from fedaug.engine.flower.tls import (  # noqa: E402
    SuperNodeKeys,
    readable_keys,
    write_supernode_keys,
    write_tls,
)


@pytest.fixture
def umask_022():
    """The usual umask (files 0644, directories 0755 unless a writer asks for less), restored afterwards."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_tls_keys_are_private_and_certificates_are_not(tmp_path, umask_022):
    files = write_tls(tmp_path / "trial" / "certs")
    d = files.directory
    assert {p.name: mode(p) for p in d.iterdir()} == {"ca.crt": 0o644, "ca.key": 0o600, "server.pem": 0o644,
                                                       "server.key": 0o600}
    assert mode(d) == 0o700 and mode(d.parent) == 0o755  # fedaug made both: only the key directory is private
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    server_key = serialization.load_pem_private_key(files.server_key.read_bytes(), None)
    assert ca_key.public_key() == ca.public_key()
    assert server_key.public_key() == x509.load_pem_x509_certificate(files.server_cert.read_bytes()).public_key()


def test_supernode_private_key_is_0600_and_its_public_key_0644(tmp_path, umask_022):
    keys = write_supernode_keys(SuperNodeKeys.under(tmp_path / "keys", 3))
    assert (keys.private.name, mode(keys.private), mode(keys.public), mode(keys.private.parent)) == (
        "supernode-3", 0o600, 0o644, 0o700)
    private = serialization.load_ssh_private_key(keys.private.read_bytes(), None)
    assert private.public_key() == serialization.load_ssh_public_key(keys.public.read_bytes())


def test_an_existing_directory_keeps_its_mode_and_a_rewritten_lax_key_becomes_private(tmp_path, umask_022):
    d = tmp_path / "certs"
    d.mkdir(mode=0o750)
    (d / "server.key").write_text("an older key")
    (d / "server.key").chmod(0o644)
    write_tls(d)
    assert (mode(d), mode(d / "server.key"), readable_keys(d)) == (0o750, 0o600, [])


def test_a_trial_warns_about_older_keys_that_other_users_can_read(tmp_path, umask_022):
    keys = tmp_path / "trial" / "keys"
    keys.mkdir(parents=True)
    for name, m in (("supernode-2", 0o644), ("supernode-3", 0o640), ("supernode-2.pub", 0o644), ("notes.txt", 0o644)):
        (keys / name).write_text("left by an earlier trial with more nodes")
        (keys / name).chmod(m)
    trial = LoopbackTrial(tmp_path / "app", tmp_path / "trial", 2, tls=True, auth=True)
    with pytest.warns(UserWarning) as caught:
        trial.prepare()
    assert [str(w.message) for w in caught] == [
        f"private keys that other users can read: {keys / 'supernode-2'} (mode 0644), {keys / 'supernode-3'} "
        "(mode 0640); fedaug writes keys with mode 0600, these are older: restrict them with 'chmod 600 FILE', "
        "or delete them"]
    written = [trial.certs.directory / "ca.key", trial.certs.server_key, *(k.private for k in trial.keys)]
    assert [mode(p) for p in written] == [0o600] * 4
    (keys / "supernode-2").chmod(0o600)
    (keys / "supernode-3").chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trial.prepare()  # nothing left to warn about
