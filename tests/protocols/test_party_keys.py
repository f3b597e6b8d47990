"""The parties' keys (protocols/party_keys.py): sealed messages open only for their recipient, sender, purpose and
job; key files are checked and private; pseudonyms are keyed."""

from __future__ import annotations

import hashlib
import hmac
import stat

import numpy as np
import pytest

from silofl.protocols import party_keys as pk


@pytest.fixture(scope="module")
def keys() -> dict[str, pk.PartyKeys]:
    return pk.generate(pk.party_names(2, 1))


def test_a_sealed_message_opens_for_its_recipient_only(keys) -> None:
    box = pk.seal(keys["features-0"], "sensitive-0", "records", "run:1", b"x, y of 3 records")
    assert pk.open_sealed(keys["sensitive-0"], "features-0", "records", "run:1", box) == b"x, y of 3 records"
    assert b"records" not in box[32:] and len(box) == 32 + 12 + len(b"x, y of 3 records") + 16
    with pytest.raises(pk.SealError, match="does not open"):  # the other feature party cannot read it
        pk.open_sealed(keys["features-1"], "features-0", "records", "run:1", box)


@pytest.mark.parametrize(
    ("sender", "purpose", "job"),
    [("features-1", "records", "run:1"), ("features-0", "holdings", "run:1"), ("features-0", "records", "run:2")],
)
def test_a_box_claimed_by_another_sender_or_replayed_into_another_step_or_run_is_refused(
    keys, sender, purpose, job
) -> None:
    box = pk.seal(keys["features-0"], "sensitive-0", "records", "run:1", b"payload")
    with pytest.raises(pk.SealError, match="does not open"):
        pk.open_sealed(keys["sensitive-0"], sender, purpose, job, box)


def test_a_changed_or_server_made_box_is_refused(keys) -> None:
    box = bytearray(pk.seal(keys["features-0"], "sensitive-0", "records", "run:1", b"payload"))
    box[-1] ^= 1
    with pytest.raises(pk.SealError):
        pk.open_sealed(keys["sensitive-0"], "features-0", "records", "run:1", bytes(box))
    # a server knows every public key but no private one: its own box, claimed to be from features-0, does not open
    server = pk.generate(["features-0"])["features-0"]
    forged_directory = dict(keys["features-0"].directory)
    forged_directory["features-0"] = server.directory["features-0"]
    impostor = pk.PartyKeys("features-0", server.private_key, keys["features-0"].pseudonym_key, forged_directory)
    forged = pk.seal(impostor, "sensitive-0", "records", "run:1", b"fake records")
    with pytest.raises(pk.SealError):
        pk.open_sealed(keys["sensitive-0"], "features-0", "records", "run:1", forged)
    with pytest.raises(pk.SealError, match="too short"):
        pk.open_sealed(keys["sensitive-0"], "features-0", "records", "run:1", b"\0" * 20)


def test_key_files_round_trip_owner_only_and_mismatches_are_named(keys, tmp_path) -> None:
    path = keys["sensitive-0"].write(tmp_path / "sensitive-0.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert pk.PartyKeys.load(path) == keys["sensitive-0"]
    with pytest.raises(pk.PartyKeyError, match="does not exist"):
        pk.PartyKeys.load(tmp_path / "missing.json")
    other = pk.generate(pk.party_names(2, 1))
    with pytest.raises(pk.PartyKeyError, match="does not match its public key"):
        pk.PartyKeys(
            "sensitive-0",
            other["sensitive-0"].private_key,
            other["sensitive-0"].pseudonym_key,
            keys["sensitive-0"].directory,
        )
    with pytest.raises(pk.PartyKeyError, match="no public key for party 'features-2'"):
        keys["features-0"].check_parties(6, 1)
    (tmp_path / "bad.json").write_text('{"format": "something-else"}')
    with pytest.raises(pk.PartyKeyError, match="'format' must be"):
        pk.PartyKeys.load(tmp_path / "bad.json")


def test_pseudonyms_are_a_keyed_hash_and_differ_between_federations(keys) -> None:
    ids = np.array([0, 1, 2, 10**12], dtype=np.int64)
    mine = pk.pseudonyms(keys["features-0"], ids)
    assert mine.shape == (4, pk.PSEUDONYM_BYTES) and mine.dtype == np.uint8
    np.testing.assert_array_equal(mine, pk.pseudonyms(keys["sensitive-0"], ids))  # every party: the same key
    expected = hmac.new(keys["features-0"].pseudonym_key, b"record:2", hashlib.sha256).digest()[: pk.PSEUDONYM_BYTES]
    assert mine[2].tobytes() == expected
    other = pk.generate(pk.party_names(2, 1))
    assert not np.array_equal(mine, pk.pseudonyms(other["features-0"], ids))


def test_simulated_keys_are_derived_from_the_runs_secret() -> None:
    names = pk.party_names(3, 1)
    a = pk.simulated_keys(b"\1" * 32, names)
    assert a == pk.simulated_keys(b"\1" * 32, names) and a != pk.simulated_keys(b"\2" * 32, names)
    box = pk.seal(a["features-2"], "sensitive-0", "records", "run:7", b"ok")
    assert pk.open_sealed(a["sensitive-0"], "features-2", "records", "run:7", box) == b"ok"
    with pytest.raises(pk.PartyKeyError, match="32 bytes"):
        pk.simulated_keys(b"short", names)
