"""Certificates and keys for a deployed federation: one CA, the SuperLink's TLS certificate, one key pair per silo.

What Flower 1.39 expects (read from its source, `flwr/supernode/cli/flower_supernode.py` and
`flwr/cli/supernode/register.py`):

* TLS: the SuperLink serves its Fleet (gRPC), Control and Runtime (HTTP) APIs with `--ssl-certfile`, `--ssl-keyfile`
  and `--ssl-ca-certfile`; SuperNodes, `flwr` and the SuperLink's own SuperExec verify it against the CA
  (`--root-certificates`, `root-certificates` in a connection). The certificate therefore names every address it is
  reached at: localhost, 127.0.0.1, ::1 (the SuperExec dials the Runtime API on loopback) and each `hosts` name
  (`superlink` for docker compose).
* SuperNode authentication: an elliptic-curve key on a NIST curve; the SuperNode reads the private key in OpenSSH
  format (`load_ssh_private_key`, unencrypted), `flwr supernode register` reads the public key in OpenSSH format.
  We use P-384, the curve Flower's documentation generates (`ssh-keygen -t ecdsa -b 384`).
* `supernode_public_keys.csv`: the public keys on one comma-separated line, the format of the SuperLink's former
  `--auth-list-public-keys` flag. Flower 1.39 refuses that flag (keys are registered at runtime with
  `flwr supernode register`); the file is kept as the operator's list of keys to register.

`cryptography` is imported inside the functions: this module is reachable from the `silofl` command line, and a
deployed ClientApp's import path must stay light.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_HOSTS", "CertError", "CertPaths", "make_certs"]

DEFAULT_HOSTS: tuple[str, ...] = ("superlink",)
"""Extra names on the SuperLink certificate by default: the compose service name."""

LOOPBACK_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity common TLS clients accept for a server certificate


class CertError(ValueError):
    """Bad arguments to `make_certs`, or files that would be overwritten; the message says what to change."""


@dataclass(frozen=True)
class CertPaths:
    """Where `make_certs` wrote each file."""

    out: Path
    ca_cert: Path
    ca_key: Path
    superlink_cert: Path
    superlink_key: Path
    silo_keys: tuple[Path, ...]
    silo_public_keys: tuple[Path, ...]
    public_keys_csv: Path

    @classmethod
    def layout(cls, out: Path, silos: int) -> CertPaths:
        """The file names `make_certs(out, silos)` writes (also used to find them again)."""
        out = Path(out)
        return cls(
            out=out,
            ca_cert=out / "ca.crt",
            ca_key=out / "ca.key",
            superlink_cert=out / "superlink.crt",
            superlink_key=out / "superlink.key",
            silo_keys=tuple(out / f"silo_{k}.key" for k in range(silos)),
            silo_public_keys=tuple(out / f"silo_{k}.pub" for k in range(silos)),
            public_keys_csv=out / "supernode_public_keys.csv",
        )

    def files(self) -> tuple[Path, ...]:
        return (
            self.ca_cert,
            self.ca_key,
            self.superlink_cert,
            self.superlink_key,
            *self.silo_keys,
            *self.silo_public_keys,
            self.public_keys_csv,
        )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write `data` to `path`; a private key is created 0600 (never world-readable, not even for an instant)."""
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # O_CREAT's mode is masked by the umask and ignored for an existing file


def _check_hosts(hosts: Sequence[str]) -> list[str]:
    if isinstance(hosts, str):
        raise CertError(f"hosts must be a sequence of names, got the string {hosts!r}; pass e.g. ['superlink']")
    names: list[str] = []
    for host in hosts:
        name = str(host).strip()
        if not name or any(c.isspace() for c in name) or "," in name or "/" in name:
            raise CertError(f"hosts: {host!r} is not a DNS name or IP address")
        if name not in names and name not in LOOPBACK_NAMES:
            names.append(name)
    return names


def _san_entries(names: Sequence[str]) -> list:
    from cryptography import x509

    entries = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def make_certs(out: Path, silos: int, hosts: Sequence[str] = DEFAULT_HOSTS, overwrite: bool = False) -> CertPaths:
    """Write a CA, a SuperLink certificate signed by it and one OpenSSH ECDSA P-384 key pair per silo into `out`.

    The SuperLink certificate's subject alternative names are localhost, 127.0.0.1, ::1 and every name in `hosts`.
    Private keys are 0600. Refuses (CertError) to replace any existing file unless `overwrite`.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise CertError(f"silos must be a positive integer (one key pair per silo), got {silos!r}")
    names = [*LOOPBACK_NAMES, *_check_hosts(hosts)]
    paths = CertPaths.layout(Path(out), silos)
    if paths.out.exists() and not paths.out.is_dir():
        raise CertError(f"--out {paths.out} exists and is not a directory")
    existing = [p.name for p in paths.files() if p.exists()]
    if existing and not overwrite:
        raise CertError(f"{paths.out} already holds {', '.join(existing)}; pass --overwrite to replace them")
    paths.out.mkdir(parents=True, exist_ok=True)

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew between hosts
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "silofl federation CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    link_key = ec.generate_private_key(ec.SECP384R1())
    link_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "silofl superlink")]))
        .issuer_name(ca_name)
        .public_key(link_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(_san_entries(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    _write(paths.ca_key, ca_key.private_bytes(pem, pkcs8, none), private=True)
    _write(paths.ca_cert, ca_cert.public_bytes(pem), private=False)
    _write(paths.superlink_key, link_key.private_bytes(pem, pkcs8, none), private=True)
    _write(paths.superlink_cert, link_cert.public_bytes(pem), private=False)

    public_lines = []
    for k, (key_path, pub_path) in enumerate(zip(paths.silo_keys, paths.silo_public_keys, strict=True)):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, none)
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        line = public.decode() + f" silo_{k}"
        _write(key_path, private, private=True)
        _write(pub_path, (line + "\n").encode(), private=False)
        public_lines.append(line)
    _write(paths.public_keys_csv, (",".join(public_lines) + "\n").encode(), private=False)
    return paths
