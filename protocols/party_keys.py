"""The parties' own keys: record pseudonyms and end-to-end sealed messages that the server relays but cannot read
(separate feature and sensitive parties; see `client.sealed_records` for what travels).

Key material of a federation with parties (one :class:`PartyKeys` per party, never the server's):

* a **pseudonym key** shared by every party: a record's pseudonym is HMAC-SHA256(key, "record:" + id), truncated to
  128 bits (:func:`pseudonyms`). The parties join their records by pseudonym, so a record id never travels, not even
  inside a sealed message: a feature party learns the pseudonyms, not the ids, of a sensitive party's other records.
* an **X25519 key pair** per party, and the **directory** of every party's public key, handed to each party with
  its own key (out of band: `silofl deploy certs` writes one file per party), so that a server relaying the messages
  cannot substitute a key of its own.

A sealed message from party S to party R (:func:`seal`, :func:`open_sealed`) is ECIES in HPKE's "auth" shape:
a fresh ephemeral X25519 key E; the AES-256-GCM key is HKDF-SHA256 over X25519(E, R) || X25519(S, R), bound to both
parties' names and public keys, E, the purpose and the job (the server's run id); the same values are the AEAD's
associated data. Only R can open it, only S (or R) can have made it, and it opens only for the purpose and job it
was sealed for: a box replayed into another step or another run is refused. Why this composition and not a library
call: `cryptography` (46) offers the primitives (X25519, HKDF, AES-GCM; no HPKE), and NaCl's sealed boxes would add
a dependency and give no sender authentication.

In simulation (every party in the one `silofl run` process) the parties' keys are derived from one random secret of
the run (:func:`simulated_keys`), which the engine puts in each party's node config and never in the ServerApp's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

FORMAT = "silofl-party-keys/1"
#: Node config: the path of a deployed party's key file (`silofl silo start --party-keys`).
PARTY_KEYS_KEY = "party-keys"
#: Node config: a simulated run's party secret, hex (the simulation engines put it in every node's config).
PARTY_SECRET_KEY = "party-secret"
#: Bytes of a record pseudonym (HMAC-SHA256 truncated): collisions among 10^9 records have probability ~1e-21.
PSEUDONYM_BYTES = 16
KEY_BYTES = 32
NONCE_BYTES = 12
_INFO = b"silofl sealed v1"

__all__ = [
    "FORMAT",
    "PARTY_KEYS_KEY",
    "PARTY_SECRET_KEY",
    "PSEUDONYM_BYTES",
    "PartyKeyError",
    "PartyKeys",
    "SealError",
    "feature_name",
    "generate",
    "open_sealed",
    "party_names",
    "pseudonyms",
    "seal",
    "sensitive_name",
    "simulated_keys",
]


class PartyKeyError(ValueError):
    """A party key file or value that cannot be used; the message names the field and the fix."""


class SealError(ValueError):
    """A sealed message that does not open for this party, purpose and job (forged, corrupted, replayed or sealed
    with other keys)."""


def feature_name(party_id: int) -> str:
    return f"features-{party_id}"


def sensitive_name(party_id: int) -> str:
    return f"sensitive-{party_id}"


def party_names(feature_parties: int, sensitive_parties: int) -> list[str]:
    """Every party's name in a federation of `feature_parties` and `sensitive_parties` (the directory's keys)."""
    return [feature_name(j) for j in range(feature_parties)] + [sensitive_name(c) for c in range(sensitive_parties)]


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True)
class PartyKeys:
    """One party's key material: its name, its X25519 private key, the shared pseudonym key, and every party's
    public key (`directory`, its own included)."""

    name: str
    private_key: bytes = field(repr=False)
    pseudonym_key: bytes = field(repr=False)
    directory: Mapping[str, bytes]

    def __post_init__(self) -> None:
        for what, value in (("private-key", self.private_key), ("pseudonym-key", self.pseudonym_key)):
            if len(value) != KEY_BYTES:
                raise PartyKeyError(f"party keys of {self.name}: '{what}' must be {KEY_BYTES} bytes, got {len(value)}")
        if self.name not in self.directory:
            raise PartyKeyError(
                f"party keys of {self.name}: its directory has no public key for {self.name} itself; regenerate the "
                "keys (silofl deploy certs)"
            )
        if self.directory[self.name] != _public_bytes(self._private()):
            raise PartyKeyError(
                f"party keys of {self.name}: its private key does not match its public key in the directory; the "
                "file mixes keys of two generations: regenerate them (silofl deploy certs) and give every party its "
                "new file"
            )
        for name, public in self.directory.items():
            if len(public) != KEY_BYTES:
                raise PartyKeyError(f"party keys of {self.name}: the public key of {name} must be {KEY_BYTES} bytes")

    def _private(self) -> X25519PrivateKey:
        return X25519PrivateKey.from_private_bytes(self.private_key)

    def public_key_of(self, name: str) -> bytes:
        if name not in self.directory:
            raise PartyKeyError(
                f"party keys of {self.name}: no public key for party {name!r} (the directory has "
                f"{', '.join(sorted(self.directory))}); the federation has more parties than the keys were made for: "
                "regenerate them for every party (silofl deploy certs)"
            )
        return self.directory[name]

    def check_parties(self, feature_parties: int, sensitive_parties: int) -> None:
        """The directory holds every party of a federation of this shape (before anything is sealed)."""
        for name in party_names(feature_parties, sensitive_parties):
            self.public_key_of(name)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "party": self.name,
                "private-key": self.private_key.hex(),
                "pseudonym-key": self.pseudonym_key.hex(),
                "directory": {name: key.hex() for name, key in sorted(self.directory.items())},
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str, *, what: str = "party keys") -> PartyKeys:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PartyKeyError(f"{what}: not JSON ({exc}); give the file `silofl deploy certs` wrote") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PartyKeyError(f"{what}: 'format' must be {FORMAT!r}; give the file `silofl deploy certs` wrote")
        try:
            directory = data["directory"]
            if not isinstance(directory, dict):
                raise PartyKeyError(f"{what}: 'directory' must map party names to public keys")
            return cls(
                name=str(data["party"]),
                private_key=bytes.fromhex(data["private-key"]),
                pseudonym_key=bytes.fromhex(data["pseudonym-key"]),
                directory={str(k): bytes.fromhex(v) for k, v in directory.items()},
            )
        except KeyError as exc:
            raise PartyKeyError(f"{what}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, PartyKeyError):
                raise
            raise PartyKeyError(f"{what}: a key is not hexadecimal ({exc})") from None

    @classmethod
    def load(cls, path: str | Path) -> PartyKeys:
        file = Path(path)
        if not file.is_file():
            raise PartyKeyError(
                f"party key file {file} does not exist; give the file `silofl deploy certs` wrote for this party"
            )
        return cls.from_json(file.read_text(encoding="utf-8"), what=f"party key file {file}")

    def write(self, path: str | Path) -> Path:
        """Write the keys to `path`, readable by its owner only (it holds a private key)."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
        return file


def generate(names: Iterable[str]) -> dict[str, PartyKeys]:
    """Fresh key material for the parties `names`: a key pair each, one pseudonym key, one directory."""
    return _keys_for(list(names), lambda _name: X25519PrivateKey.generate(), secrets.token_bytes(KEY_BYTES))


def simulated_keys(secret: bytes, names: Iterable[str]) -> dict[str, PartyKeys]:
    """The parties' keys of a simulated run, derived from the run's `secret` (32 random bytes): every party in one
    process can derive every key, so this is for simulation only (deployments use :func:`generate`)."""
    if len(secret) != KEY_BYTES:
        raise PartyKeyError(f"the run's party secret must be {KEY_BYTES} bytes, got {len(secret)}")

    def derived(label: str) -> bytes:
        return hmac.new(secret, label.encode(), hashlib.sha256).digest()

    return _keys_for(
        list(names), lambda name: X25519PrivateKey.from_private_bytes(derived("x25519:" + name)), derived("pseudonym")
    )


def _keys_for(names: list[str], make, pseudonym_key: bytes) -> dict[str, PartyKeys]:
    if len(set(names)) != len(names):
        raise PartyKeyError("party names must be distinct")
    private = {name: make(name) for name in names}
    directory = {name: _public_bytes(key) for name, key in private.items()}
    raw = {name: key.private_bytes_raw() for name, key in private.items()}
    return {name: PartyKeys(name, raw[name], pseudonym_key, directory) for name in names}


def pseudonyms(keys: PartyKeys, ids: np.ndarray) -> np.ndarray:
    """Each record id's pseudonym, (n, PSEUDONYM_BYTES) uint8: HMAC-SHA256(pseudonym key, "record:<id>")
    truncated. Without the key (the server) a pseudonym reveals nothing of the id and cannot be recomputed."""
    ids = np.asarray(ids, dtype=np.int64)
    key = keys.pseudonym_key
    digests = b"".join(
        hmac.digest(key, b"record:%d" % record_id, "sha256")[:PSEUDONYM_BYTES] for record_id in ids.tolist()
    )
    return np.frombuffer(digests, dtype=np.uint8).reshape(len(ids), PSEUDONYM_BYTES).copy()


def _context(sender: str, recipient: str, purpose: str, job: str) -> bytes:
    return json.dumps([sender, recipient, purpose, job], separators=(",", ":")).encode()


def _box_key(shared: bytes, ephemeral: bytes, sender_pub: bytes, recipient_pub: bytes, context: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_BYTES,
        salt=None,
        info=_INFO + ephemeral + sender_pub + recipient_pub + context,
    ).derive(shared)


def seal(keys: PartyKeys, recipient: str, purpose: str, job: str, payload: bytes) -> bytes:
    """`payload` sealed from party `keys.name` to `recipient` for `purpose` in `job`: ephemeral public key, nonce,
    AES-256-GCM ciphertext and tag."""
    recipient_pub = keys.public_key_of(recipient)
    ephemeral = X25519PrivateKey.generate()
    peer = X25519PublicKey.from_public_bytes(recipient_pub)
    shared = ephemeral.exchange(peer) + keys._private().exchange(peer)
    e_pub = _public_bytes(ephemeral)
    context = _context(keys.name, recipient, purpose, job)
    key = _box_key(shared, e_pub, keys.directory[keys.name], recipient_pub, context)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return e_pub + nonce + AESGCM(key).encrypt(nonce, payload, context)


def open_sealed(keys: PartyKeys, sender: str, purpose: str, job: str, box: bytes) -> bytes:
    """The payload of a box sealed by `sender` to this party for `purpose` in `job`; SealError if it does not open."""
    sender_pub = keys.public_key_of(sender)
    if len(box) < KEY_BYTES + NONCE_BYTES + 16:
        raise SealError(f"a sealed message from {sender} to {keys.name} is {len(box)} bytes: too short to be one")
    e_pub, nonce, ciphertext = box[:KEY_BYTES], box[KEY_BYTES : KEY_BYTES + NONCE_BYTES], box[KEY_BYTES + NONCE_BYTES :]
    own = keys._private()
    try:
        shared = own.exchange(X25519PublicKey.from_public_bytes(e_pub)) + own.exchange(
            X25519PublicKey.from_public_bytes(sender_pub)
        )
    except ValueError:  # a low-order point: X25519 refuses the all-zero shared secret
        raise SealError(f"a sealed message from {sender} to {keys.name} carries an invalid ephemeral key") from None
    context = _context(sender, keys.name, purpose, job)
    key = _box_key(shared, e_pub, sender_pub, keys.directory[keys.name], context)
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, context)
    except InvalidTag:
        raise SealError(
            f"a sealed message said to be from {sender} to {keys.name} ({purpose}) does not open: it was forged or "
            "changed on the way, sealed for another step or run, or the parties' key files are of different "
            "generations (give every party the files of one `silofl deploy certs`)"
        ) from None
