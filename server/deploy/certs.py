"""Certificates and keys for a deployed federation: one CA, the SuperLink's TLS certificate, one key pair per node.

Nodes are named as `server.deploy.topology` names them: ``silo_k`` for a federation of silos (the default), else
``features_k`` and ``sensitive_c`` for the feature and sensitive parties (the names of their data folders from
`silofl data split --topology`), so a reader sees which party uses which key.

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

For separate parties (a topology other than silos) also one **party key file** per party, `<name>.party.json`
(`protocols.party_keys`: its X25519 key, the parties' shared pseudonym key and every party's public key), for the
sealed record exchange. The parties' files are made together (one pseudonym key, one
directory) and go to their parties only: never to the SuperLink's host, whose server must not read the records.

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

__all__ = ["DEFAULT_HOSTS", "CertError", "CertPaths", "ensure_certs", "ensure_party_keys", "make_certs", "party_name"]

DEFAULT_HOSTS: tuple[str, ...] = ("superlink",)
"""Extra names on the SuperLink certificate by default: the compose service name."""

LOOPBACK_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
CA_DAYS = 3650
LEAF_DAYS = 825  # the longest validity common TLS clients accept for a server certificate


class CertError(ValueError):
    """Bad arguments to `make_certs`, or files that would be overwritten; the message says what to change."""


@dataclass(frozen=True)
class CertPaths:
    """Where `make_certs` wrote each file. `silo_keys` / `silo_public_keys` hold one key pair per node, in the order
    of `names` (the silos, or the feature then the sensitive parties; the field names predate parties)."""

    out: Path
    ca_cert: Path
    ca_key: Path
    superlink_cert: Path
    superlink_key: Path
    silo_keys: tuple[Path, ...]
    silo_public_keys: tuple[Path, ...]
    public_keys_csv: Path
    names: tuple[str, ...] = ()
    #: The parties' key files (`protocols.party_keys`), in the order of `names`; none for silos.
    party_keys: tuple[Path, ...] = ()

    @classmethod
    def layout(
        cls, out: Path, silos: int, *, topology: str = "silos", sensitive_parties: int | None = None
    ) -> CertPaths:
        """The file names `make_certs(out, silos, topology=..., sensitive_parties=...)` writes (also used to find
        them again): `silo_k.key`/`.pub` for silos, `features_k` and `sensitive_c` key pairs for parties."""
        names = _node_names(silos, topology, sensitive_parties)
        out = Path(out)
        return cls(
            out=out,
            ca_cert=out / "ca.crt",
            ca_key=out / "ca.key",
            superlink_cert=out / "superlink.crt",
            superlink_key=out / "superlink.key",
            silo_keys=tuple(out / f"{name}.key" for name in names),
            silo_public_keys=tuple(out / f"{name}.pub" for name in names),
            public_keys_csv=out / "supernode_public_keys.csv",
            names=names,
            party_keys=() if topology == "silos" else tuple(out / f"{name}.party.json" for name in names),
        )

    def key_pair(self, name: str) -> tuple[Path, Path]:
        """(private key, public key) of node `name` (e.g. "sensitive_0")."""
        if name not in self.names:
            raise CertError(f"no key pair for {name!r} in {self.out}; it has {', '.join(self.names)}")
        k = self.names.index(name)
        return self.silo_keys[k], self.silo_public_keys[k]

    def files(self) -> tuple[Path, ...]:
        return (
            self.ca_cert,
            self.ca_key,
            self.superlink_cert,
            self.superlink_key,
            *self.silo_keys,
            *self.silo_public_keys,
            self.public_keys_csv,
            *self.party_keys,
        )

    def party_key_file(self, name: str) -> Path | None:
        """The party key file of node `name` (None for a silo)."""
        if not self.party_keys:
            return None
        return self.party_keys[self.names.index(name)]


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write `data` to `path`; a private key is created 0600 (never world-readable, not even for an instant)."""
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # O_CREAT's mode is masked by the umask and ignored for an existing file


def _node_names(silos: int, topology: str, sensitive_parties: int | None) -> tuple[str, ...]:
    from silofl.server.deploy.topology import TopologyError, node_layout

    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise CertError(f"silos must be a positive integer (one key pair per silo), got {silos!r}")
    try:
        return node_layout(silos, topology, sensitive_parties).names
    except TopologyError as exc:
        raise CertError(str(exc)) from None


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


def make_certs(
    out: Path,
    silos: int,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    overwrite: bool = False,
    *,
    topology: str = "silos",
    sensitive_parties: int | None = None,
) -> CertPaths:
    """Write a CA, a SuperLink certificate signed by it and one OpenSSH ECDSA P-384 key pair per node into `out`.

    The nodes are `silos` silos (`silo_k`), or with another `topology` `silos` feature parties (`features_k`) and
    its sensitive parties (`sensitive_c`; `sensitive_parties` for topology general), see `server.deploy.topology`.
    The SuperLink certificate's subject alternative names are localhost, 127.0.0.1, ::1 and every name in `hosts`.
    Private keys are 0600. Refuses (CertError) to replace any existing file unless `overwrite`.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names = [*LOOPBACK_NAMES, *_check_hosts(hosts)]
    paths = CertPaths.layout(Path(out), silos, topology=topology, sensitive_parties=sensitive_parties)
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

    _write_key_pairs(paths, paths.names)
    _write_party_keys(paths)
    return paths


def party_name(node_name: str) -> str:
    """The party's name in the key directory (`protocols.party_keys`) of node `node_name` (features_0 -> features-0)."""
    role, _, index = node_name.rpartition("_")
    return f"{role}-{index}"


def _write_party_keys(paths: CertPaths) -> None:
    """Fresh party key files for every party of `paths` (none for silos): one generation, one directory."""
    if not paths.party_keys:
        return
    from silofl.protocols.party_keys import generate

    keys = generate(party_name(name) for name in paths.names)
    for name, file in zip(paths.names, paths.party_keys, strict=True):
        _write(file, keys[party_name(name)].to_json().encode(), private=True)


def _write_key_pairs(paths: CertPaths, names: Sequence[str]) -> None:
    """Create the key pairs of `names` (OpenSSH ECDSA P-384; the public key's comment is the node name), then
    rewrite `supernode_public_keys.csv` with every public key of `paths`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    none = serialization.NoEncryption()
    for name in names:
        key_path, pub_path = paths.key_pair(name)
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, none)
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write(key_path, private, private=True)
        _write(pub_path, (public.decode() + f" {name}\n").encode(), private=False)
    lines = [pub.read_text().strip() for pub in paths.silo_public_keys]
    _write(paths.public_keys_csv, (",".join(lines) + "\n").encode(), private=False)


def ensure_certs(out: Path, silos: int, *, topology: str = "silos", sensitive_parties: int | None = None) -> CertPaths:
    """The certificates and keys of a loopback deployment (`silofl deploy up`): reused when every file is there,
    made by :func:`make_certs` when none of the CA's files are, and otherwise (a folder made for another set of
    nodes, e.g. silos before parties) completed with the missing nodes' key pairs under the existing CA."""
    paths = CertPaths.layout(Path(out), silos, topology=topology, sensitive_parties=sensitive_parties)
    if all(p.exists() for p in paths.files()):
        return paths
    authority = (paths.ca_cert, paths.ca_key, paths.superlink_cert, paths.superlink_key)
    if not any(p.exists() for p in authority):
        return make_certs(out, silos, topology=topology, sensitive_parties=sensitive_parties, overwrite=True)
    missing = [p.name for p in authority if not p.exists()]
    if missing:
        raise CertError(
            f"{paths.out} holds part of a CA and SuperLink certificate ({', '.join(missing)} missing); remove the "
            "folder to make new ones, or restore the files"
        )
    absent = [n for n in paths.names if not all(p.exists() for p in paths.key_pair(n))]
    _write_key_pairs(paths, absent)
    return ensure_party_keys(paths)


def ensure_party_keys(paths: CertPaths) -> CertPaths:
    """The parties' key files of `paths`, made (all together: one generation) unless every one is there; also for
    an insecure deployment, whose parties still seal their records from the server."""
    if any(not p.exists() for p in paths.party_keys):
        paths.out.mkdir(parents=True, exist_ok=True)
        _write_party_keys(paths)
    return paths
