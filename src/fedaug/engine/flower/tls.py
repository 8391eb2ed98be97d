"""Certificates and keys for trials: a self-signed CA with a server certificate, SuperNode key pairs.

For a trial on one machine only: the CA's private key sits next to its certificate. Real sites use
certificates from their own CA (docs/flower.md). Made with the ``cryptography`` package (the
``flower`` extra declares it; Flower itself depends on it).

Private keys are written with mode 0600 (only their owner reads them, whatever the umask), into a
directory created with mode 0700 when it is missing; certificates and public keys are 0666 less the
umask, as any file. :func:`warn_readable_keys` names the keys left in a directory that other users
can read (written by an earlier fedaug, or by hand).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedaug.core.serialize import atomic_write_bytes

#: a private key's mode: read and written by its owner only
KEY_MODE = 0o600
#: the mode of a directory that fedaug creates for keys
KEY_DIR_MODE = 0o700
#: the names of the private keys fedaug writes: ``ca.key``, ``server.key``, ``supernode-<k>``
_PRIVATE_NAME = re.compile(r".+\.key|supernode-\d+")


@dataclass(frozen=True)
class TlsFiles:
    """The files of a trial's TLS set-up, in one directory."""

    directory: Path

    @classmethod
    def under(cls, directory: Path) -> "TlsFiles":
        return cls(Path(directory))

    @property
    def ca_cert(self) -> Path:
        """The CA certificate: SuperNodes and the ``flwr`` CLI trust it (``--root-certificates``)."""
        return self.directory / "ca.crt"

    @property
    def server_cert(self) -> Path:
        """The SuperLink's certificate, signed by the CA, valid for 127.0.0.1 and localhost."""
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"


@dataclass(frozen=True)
class SuperNodeKeys:
    """A SuperNode's key pair in OpenSSH format (ECDSA on SECP384R1, as Flower expects)."""

    private: Path
    public: Path

    @classmethod
    def under(cls, directory: Path, k: int) -> "SuperNodeKeys":
        return cls(Path(directory) / f"supernode-{k}", Path(directory) / f"supernode-{k}.pub")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedaug trial"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def key_directory(directory: Path) -> Path:
    """``directory``, created with mode :data:`KEY_DIR_MODE` if missing (missing parents above it as
    usual); an existing directory is left as it is."""
    directory = Path(directory)
    directory.mkdir(mode=KEY_DIR_MODE, parents=True, exist_ok=True)
    return directory


def write_private(path: Path, data: bytes) -> None:
    """Write a private key atomically with mode :data:`KEY_MODE`, in its :func:`key_directory`."""
    key_directory(Path(path).parent)
    atomic_write_bytes(path, data, mode=KEY_MODE)


def readable_keys(directory: Path) -> list[Path]:
    """The private keys in ``directory`` (fedaug's names: ``*.key``, ``supernode-<k>``) that users other
    than their owner may read, sorted; none when the directory does not exist."""
    directory = Path(directory)
    found = directory.iterdir() if directory.is_dir() else ()
    return sorted(p for p in found if _PRIVATE_NAME.fullmatch(p.name) and p.is_file()
                  and p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def warn_readable_keys(*directories: Path) -> None:
    """One warning naming each private key in ``directories`` that other users may read, and the fix."""
    lax = [p for d in directories for p in readable_keys(d)]
    if lax:
        modes = ", ".join(f"{p} (mode {stat.S_IMODE(p.stat().st_mode):04o})" for p in lax)
        warnings.warn(f"private keys that other users can read: {modes}; fedaug writes keys with mode 0600, these "
                      "are older: restrict them with 'chmod 600 FILE', or delete them", stacklevel=2)


def write_tls(directory: Path, days: int = 30) -> TlsFiles:
    """Write a self-signed CA and a server certificate for 127.0.0.1/localhost signed by it.

    Args:
        directory: where to write ``ca.crt``, ``ca.key``, ``server.pem`` and ``server.key``.
        days: validity of both certificates.
    """
    files = TlsFiles.under(key_directory(directory))
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fedaug trial CA")).issuer_name(_name("fedaug trial CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    atomic_write_bytes(files.ca_cert, ca.public_bytes(serialization.Encoding.PEM))
    write_private(files.directory / "ca.key", _pem_key(ca_key))
    atomic_write_bytes(files.server_cert, cert.public_bytes(serialization.Encoding.PEM))
    write_private(files.server_key, _pem_key(key))
    return files


def write_supernode_keys(keys: SuperNodeKeys) -> SuperNodeKeys:
    """Write a fresh key pair for SuperNode authentication (``flwr supernode register`` takes the
    public key; the SuperNode starts with ``--auth-supernode-private-key``)."""
    key = ec.generate_private_key(ec.SECP384R1())
    write_private(keys.private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                  serialization.NoEncryption()))
    atomic_write_bytes(keys.public, key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                  serialization.PublicFormat.OpenSSH) + b"\n")
    return keys
