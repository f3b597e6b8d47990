"""Save one party's data (a feature or a sensitive party of `client.data.topology`) to a directory and load it back.

Layout of a party directory (format version 1):

* ``info.json``: format tag and version, role (``features`` or ``sensitive``), party_id, num_parties (of that role),
  record counts and the `DatasetInfo` fields;
* a feature party's ``features.npz``: train_ids, train_features, train_labels, test_ids, test_features, test_labels;
* a sensitive party's ``sensitive.npz``: train_ids, train_groups, test_ids, test_groups.

A feature party's directory holds no sensitive value at all, so it can be handed to an organisation that must not
see one (a bank, next to a census bureau's sensitive party). Written as `client.data.silo_store` writes a silo:
uncompressed .npz read with ``allow_pickle=False``, each file renamed into place, info.json last.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from silofl.client.data.silo_store import INFO_FIELDS, SiloStoreError, atomic_write, read_npz, write_npz
from silofl.client.data.tabular import DataError, DatasetInfo, NonSensitiveDivision
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData

FORMAT = "silofl-party"
VERSION = 1
INFO_FILE = "info.json"
ROLES = {"features": "features.npz", "sensitive": "sensitive.npz"}
_KEYS = {
    "features": ("train_ids", "train_features", "train_labels", "test_ids", "test_features", "test_labels"),
    "sensitive": ("train_ids", "train_groups", "test_ids", "test_groups"),
}

Party = FeaturePartyData | SensitivePartyData


def role_of(party: Party) -> str:
    """``features`` or ``sensitive``."""
    if isinstance(party, FeaturePartyData):
        return "features"
    if isinstance(party, SensitivePartyData):
        return "sensitive"
    raise DataError(f"expected a FeaturePartyData or SensitivePartyData, got {type(party).__name__}")


def save_party(party: Party, directory: Path, *, num_parties: int) -> None:
    """Write `party` to `directory` (created if needed; its files are replaced)."""
    role = role_of(party)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if role == "features":
        arrays = {
            "train_ids": party.train_ids,
            "train_features": party.train.features,
            "train_labels": party.train.labels,
            "test_ids": party.test_ids,
            "test_features": party.test.features,
            "test_labels": party.test.labels,
        }
    else:
        arrays = {k: getattr(party, k) for k in _KEYS["sensitive"]}
    info = {
        "format": FORMAT,
        "version": VERSION,
        "role": role,
        "party_id": int(party.party_id),
        "num_parties": int(num_parties),
        "num_train": len(party.train_ids),
        "num_test": len(party.test_ids),
        **{f: (getattr(party.info, f) if f == "name" else list(getattr(party.info, f))) for f in INFO_FIELDS},
    }
    atomic_write(directory / ROLES[role], write_npz(arrays))
    atomic_write(directory / INFO_FILE, lambda tmp: tmp.write_text(json.dumps(info, indent=1) + "\n"))


def read_party_info(directory: Path) -> dict:
    """The checked info.json of a party directory; SiloStoreError naming the file and the fix otherwise."""
    path = Path(directory) / INFO_FILE
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise SiloStoreError(
            f"{path}: missing; this is not a party directory (create one with `silofl data split ... --topology`)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SiloStoreError(f"{path}: corrupt JSON ({exc}); re-create the party directory") from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise SiloStoreError(f"{path}: not a silofl party description (expected format {FORMAT!r})")
    if info.get("version") != VERSION:
        raise SiloStoreError(f"{path}: format version {info.get('version')!r}, this silofl reads version {VERSION}")
    if info.get("role") not in ROLES:
        raise SiloStoreError(f"{path}: role {info.get('role')!r} is not one of {', '.join(ROLES)}")
    missing = [k for k in ("party_id", "num_parties", "num_train", "num_test", *INFO_FIELDS) if k not in info]
    if missing:
        raise SiloStoreError(f"{path}: fields {missing} missing; re-create the party directory")
    return info


def load_party(directory: Path, *, role: str | None = None) -> Party:
    """Load a party written by :func:`save_party`; with `role`, refuse a directory of the other role (a node started
    as a sensitive party on a feature party's data, or the other way round)."""
    directory = Path(directory)
    meta = read_party_info(directory)
    if role is not None and meta["role"] != role:
        raise SiloStoreError(
            f"{directory} holds a {meta['role']} party's data but this node's role is {role!r}; point the node at "
            f"a {role} party directory or change its role"
        )
    arrays = read_npz(directory / ROLES[meta["role"]], _KEYS[meta["role"]])
    try:
        info = DatasetInfo(name=meta["name"], **{f: tuple(meta[f]) for f in INFO_FIELDS if f != "name"})
        for split in ("train", "test"):
            if len(arrays[f"{split}_ids"]) != meta[f"num_{split}"]:
                raise DataError(
                    f"{split} split has {len(arrays[f'{split}_ids'])} records, {INFO_FILE} says {meta[f'num_{split}']}"
                )
        if meta["role"] == "features":
            return FeaturePartyData(
                info,
                meta["party_id"],
                arrays["train_ids"],
                NonSensitiveDivision(arrays["train_features"], arrays["train_labels"]),
                arrays["test_ids"],
                NonSensitiveDivision(arrays["test_features"], arrays["test_labels"]),
            )
        return SensitivePartyData(info, meta["party_id"], *(np.asarray(arrays[k]) for k in _KEYS["sensitive"]))
    except (DataError, TypeError) as exc:
        raise SiloStoreError(f"{directory}: files are inconsistent ({exc}); re-create the party directory") from exc
