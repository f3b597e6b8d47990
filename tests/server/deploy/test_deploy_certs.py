"""`server.deploy.certs`: the CA, the SuperLink certificate and the silos' (or parties') keys, in the formats Flower
1.39 reads."""

from __future__ import annotations

import ipaddress
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key

from silofl.server.deploy.certs import CertError, CertPaths, ensure_certs, make_certs
from silofl.server.deploy.cli import add_deploy_parser

PROJECT_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    return make_certs(tmp_path_factory.mktemp("certs") / "out", 2, hosts=["superlink", "10.1.2.3", "link.example"])


def test_writes_every_file_with_private_keys_0600(certs: CertPaths) -> None:
    assert certs == CertPaths.layout(certs.out, 2)
    for path in certs.files():
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.suffix == ".key":
            assert mode == 0o600, path
        else:
            assert mode & 0o077 == 0o044, path  # public files are readable by the services that need them


def test_superlink_certificate_is_signed_by_the_ca_and_names_every_host(certs: CertPaths) -> None:
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    leaf = x509.load_pem_x509_certificate(certs.superlink_cert.read_bytes())
    leaf.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "superlink", "link.example"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.1.2.3")
    }
    key = load_pem_private_key(certs.superlink_key.read_bytes(), None)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()


def test_openssl_verifies_the_chain(certs: CertPaths) -> None:
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("no openssl binary")
    done = subprocess.run(
        [openssl, "verify", "-CAfile", str(certs.ca_cert), str(certs.superlink_cert)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_silo_keys_are_what_flower_reads(certs: CertPaths) -> None:
    """The SuperNode loads the private key with load_ssh_private_key; `flwr supernode register` the public one."""
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    csv_keys = certs.public_keys_csv.read_text().strip().split(",")
    assert len(csv_keys) == 2
    for k, (key_path, pub_path) in enumerate(zip(certs.silo_keys, certs.silo_public_keys, strict=True)):
        private = load_ssh_private_key(key_path.read_bytes(), None)
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.curve.name == "secp384r1"
        registered = try_load_public_key(pub_path)
        assert registered == public_key_to_bytes(private.public_key())
        assert csv_keys[k] == pub_path.read_text().strip()
        assert csv_keys[k].startswith("ecdsa-sha2-nistp384 ") and csv_keys[k].endswith(f" silo_{k}")
    assert certs.silo_public_keys[0].read_text() != certs.silo_public_keys[1].read_text()


def test_refuses_to_overwrite_unless_asked(tmp_path: Path) -> None:
    first = make_certs(tmp_path, 1, hosts=())
    before = first.ca_cert.read_bytes()
    with pytest.raises(CertError, match=r"already holds ca\.crt.*--overwrite"):
        make_certs(tmp_path, 1)
    assert first.ca_cert.read_bytes() == before
    again = make_certs(tmp_path, 1, overwrite=True)
    assert again.ca_cert.read_bytes() != before


@pytest.mark.parametrize(
    ("silos", "hosts", "match"),
    [
        (0, ("superlink",), "silos must be a positive integer"),
        (True, ("superlink",), "silos must be a positive integer"),
        (1, "superlink", "sequence of names"),
        (1, ("bad host",), "not a DNS name"),
        (1, ("",), "not a DNS name"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, silos, hosts, match: str) -> None:
    with pytest.raises(CertError, match=match):
        make_certs(tmp_path / "out", silos, hosts=hosts)
    assert not (tmp_path / "out").exists()


def _parse(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="silofl")
    add_deploy_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_writes_certs_and_refuses_a_second_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["deploy", "certs", "--out", str(tmp_path), "--silos", "3", "--hosts", "superlink,link.example"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "silo_2.key" in out and "link.example" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in CertPaths.layout(tmp_path, 3).files())
    assert args.func(args) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_parties_get_key_pairs_named_after_their_data_folders(tmp_path: Path) -> None:
    """With a topology, one key pair per feature and per sensitive party, named as `silofl data split --topology`
    names their folders (features_k, sensitive_c), each loadable as Flower loads a silo's."""
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    paths = make_certs(tmp_path, 3, hosts=(), topology="central-sensitive")
    names = ("features_0", "features_1", "features_2", "sensitive_0")
    assert paths.names == names
    assert paths == CertPaths.layout(tmp_path, 3, topology="central-sensitive")
    assert [p.name for p in paths.silo_keys] == [f"{n}.key" for n in names]
    assert not list(tmp_path.glob("silo_*"))
    csv_keys = paths.public_keys_csv.read_text().strip().split(",")
    assert [line.rsplit(" ", 1)[1] for line in csv_keys] == list(names)
    for name in names:
        key, pub = paths.key_pair(name)
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        private = load_ssh_private_key(key.read_bytes(), None)
        assert try_load_public_key(pub) == public_key_to_bytes(private.public_key())
    general = CertPaths.layout(tmp_path, 2, topology="general", sensitive_parties=3)
    assert general.names == ("features_0", "features_1", "sensitive_0", "sensitive_1", "sensitive_2")
    assert CertPaths.layout(tmp_path, 2, topology="divided").names[2:] == ("sensitive_0", "sensitive_1")
    with pytest.raises(CertError, match="needs --sensitive-parties"):
        make_certs(tmp_path / "g", 2, topology="general")
    with pytest.raises(CertError, match="--sensitive-parties is for --topology general"):
        make_certs(tmp_path / "c", 2, topology="central-sensitive", sensitive_parties=2)
    with pytest.raises(CertError, match="no key pair for 'silo_0'"):
        paths.key_pair("silo_0")


def test_parties_get_party_key_files_of_one_generation(tmp_path: Path) -> None:
    """A party key file per party (0600), all with one pseudonym key and one directory, each opening what another
    seals to it; silos get none; a lost file is remade with all the others (one generation)."""
    from silofl.protocols import party_keys as pk

    paths = make_certs(tmp_path, 2, hosts=(), topology="central-sensitive")
    assert [p.name for p in paths.party_keys] == [
        "features_0.party.json",
        "features_1.party.json",
        "sensitive_0.party.json",
    ]
    keys = {name: pk.PartyKeys.load(file) for name, file in zip(paths.names, paths.party_keys, strict=True)}
    for file in paths.party_keys:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert [k.name for k in keys.values()] == ["features-0", "features-1", "sensitive-0"]
    assert (
        len({k.pseudonym_key for k in keys.values()}) == 1
        and len({tuple(k.directory.items()) for k in keys.values()}) == 1
    )
    box = pk.seal(keys["features_1"], "sensitive-0", "records", "run:1", b"rows")
    assert pk.open_sealed(keys["sensitive_0"], "features-1", "records", "run:1", box) == b"rows"
    assert make_certs(tmp_path / "silos", 2, hosts=()).party_keys == ()
    paths.party_keys[0].unlink()
    again = ensure_certs(tmp_path, 2, topology="central-sensitive")
    remade = {name: pk.PartyKeys.load(file) for name, file in zip(again.names, again.party_keys, strict=True)}
    assert (
        remade["sensitive_0"].pseudonym_key == remade["features_0"].pseudonym_key != keys["sensitive_0"].pseudonym_key
    )


def test_ensure_certs_adds_missing_key_pairs_under_the_existing_ca(tmp_path: Path) -> None:
    """`deploy up` in a folder first used for silos: the CA and the silos' keys stay, the parties' keys are added."""
    silos = make_certs(tmp_path, 2, hosts=())
    before = {p.name: p.read_bytes() for p in silos.files() if p != silos.public_keys_csv}
    parties = ensure_certs(tmp_path, 2, topology="central-sensitive")
    assert all(p.exists() for p in parties.files())
    assert all((tmp_path / name).read_bytes() == data for name, data in before.items())
    assert parties.public_keys_csv.read_text().count(",") == 2  # the three keys of this layout
    again = {p: p.read_bytes() for p in parties.files()}
    assert ensure_certs(tmp_path, 2, topology="central-sensitive") == parties
    assert {p: p.read_bytes() for p in parties.files()} == again  # complete: reused as it is
    (tmp_path / "ca.key").unlink()
    with pytest.raises(CertError, match=r"ca\.key missing"):
        ensure_certs(tmp_path, 2, topology="divided")
    fresh = ensure_certs(tmp_path / "new", 1, topology="divided")
    assert fresh.names == ("features_0", "sensitive_0") and all(p.exists() for p in fresh.files())


def test_cli_makes_party_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["deploy", "certs", "--out", str(tmp_path), "--silos", "2", "--topology", "general"]
    args = _parse([*argv, "--sensitive-parties", "2"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "features:  " in out and "sensitive: " in out and "register sensitive_1.pub" in out
    args = _parse([*argv, "--overwrite"])
    assert args.func(args) == 2
    assert "--topology general needs --sensitive-parties S" in capsys.readouterr().err


def test_cryptography_is_imported_lazily() -> None:
    code = (
        "import sys, server.deploy.cli, server.deploy.certs, server.deploy.local, server.deploy.topology, "
        "client.silo_cli; "
        "print(sorted(m for m in ('cryptography', 'torch', 'flwr') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
