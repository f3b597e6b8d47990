"""Save one silo's data to a directory and load it back fast (a deployed silo reloads it on every message).

Layout of a silo directory (format version 1):

* ``info.json``: format tag and version, silo_id, num_silos, record counts and the `DatasetInfo` fields;
* ``nonsensitive.npz``: train_features, train_labels, test_features, test_labels (the model side's division);
* ``sensitive.npz``: train_groups, test_groups (the sensitive division).

The two divisions are separate files so that a deployment can give them different owners and permissions, as SteFFLe's
data model separates them (Gupta et al. 2024, Section 2: a non-sensitive and a sensitive division). The archives are
uncompressed `.npz` (numpy's own format, read with ``allow_pickle=False``): loading an Adult silo (about 11k x 102
float32) takes a few milliseconds, see the tests. Each file is written to a temporary name and renamed into place, so a
reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from silofl.client.data.tabular import (
    DataError,
    DatasetInfo,
    NonSensitiveDivision,
    SensitiveDivision,
    SiloData,
    Split,
)

__all__ = [
    "FORMAT",
    "INFO_FILE",
    "NONSENSITIVE_FILE",
    "SENSITIVE_FILE",
    "VERSION",
    "SiloStoreError",
    "load_silo",
    "save_silo",
]

FORMAT = "silofl-silo"
VERSION = 1
INFO_FILE = "info.json"
NONSENSITIVE_FILE = "nonsensitive.npz"
SENSITIVE_FILE = "sensitive.npz"

_NONSENSITIVE_KEYS = ("train_features", "train_labels", "test_features", "test_labels")
_SENSITIVE_KEYS = ("train_groups", "test_groups")
INFO_FIELDS = ("name", "feature_names", "label_names", "sensitive_columns", "group_names")


class SiloStoreError(DataError):
    """A silo directory is missing a file, or a file is corrupt or of another format; the message names the file."""


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write `path` through `write(tmp)` on a temporary name and rename it into place (readers never see half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_silo(silo: SiloData, directory: Path) -> None:
    """Write `silo` to `directory` (created if needed; existing silo files are replaced)."""
    if not isinstance(silo, SiloData):
        raise DataError(f"save_silo expects a SiloData, got {type(silo).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits = {"train": silo.train, "test": silo.test}
    nonsensitive = {}
    sensitive = {}
    for split_name, split in splits.items():
        nonsensitive[f"{split_name}_features"] = split.nonsensitive.features
        nonsensitive[f"{split_name}_labels"] = split.nonsensitive.labels
        sensitive[f"{split_name}_groups"] = split.sensitive.groups
    info = {
        "format": FORMAT,
        "version": VERSION,
        "silo_id": int(silo.silo_id),
        "num_silos": int(silo.num_silos),
        "num_train": len(silo.train),
        "num_test": len(silo.test),
        **{
            field: (getattr(silo.info, field) if field == "name" else list(getattr(silo.info, field)))
            for field in INFO_FIELDS
        },
    }

    atomic_write(directory / NONSENSITIVE_FILE, write_npz(nonsensitive))
    atomic_write(directory / SENSITIVE_FILE, write_npz(sensitive))
    # info.json last: its presence marks a complete silo directory.
    atomic_write(directory / INFO_FILE, lambda tmp: tmp.write_text(json.dumps(info, indent=1) + "\n"))


def write_npz(arrays: dict[str, np.ndarray]) -> Callable[[Path], None]:
    """A writer for :func:`atomic_write` of an uncompressed .npz archive."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.savez would append ".npz" to a bare path
            np.savez(fh, **arrays)

    return write


def _read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise SiloStoreError(
            f"{path}: missing; this is not a silo directory (create one with `silofl data split ... --out DIR`)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SiloStoreError(f"{path}: corrupt JSON ({exc}); re-create the silo directory") from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise SiloStoreError(f"{path}: not a silofl silo description (expected format {FORMAT!r})")
    if info.get("version") != VERSION:
        raise SiloStoreError(
            f"{path}: format version {info.get('version')!r}, this silofl reads version {VERSION}; "
            "re-create the silo directory with this version"
        )
    missing = [k for k in ("silo_id", "num_silos", "num_train", "num_test", *INFO_FIELDS) if k not in info]
    if missing:
        raise SiloStoreError(f"{path}: fields {missing} missing; re-create the silo directory")
    return info


def read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays `keys` of the .npz archive `path`; SiloStoreError naming the file when missing or corrupt."""
    try:
        # Open the file here: np.load leaks its own handle when the archive turns out to be corrupt.
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as archive:
            missing = [k for k in keys if k not in archive.files]
            if missing:
                raise SiloStoreError(f"{path}: arrays {missing} missing; re-create the silo directory")
            return {k: archive[k] for k in keys}
    except FileNotFoundError:
        raise SiloStoreError(f"{path}: missing; the silo directory is incomplete, re-create it") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise SiloStoreError(
            f"{path}: corrupt or not a numpy .npz archive ({exc}); re-create the silo directory"
        ) from exc


def load_silo(directory: Path) -> SiloData:
    """Load a silo written by `save_silo`; SiloStoreError naming the file if one is missing, corrupt or inconsistent."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SiloStoreError(f"{directory}: no such silo directory")
    meta = _read_info(directory / INFO_FILE)
    ns = read_npz(directory / NONSENSITIVE_FILE, _NONSENSITIVE_KEYS)
    sens = read_npz(directory / SENSITIVE_FILE, _SENSITIVE_KEYS)
    try:
        info = DatasetInfo(name=meta["name"], **{f: tuple(meta[f]) for f in INFO_FIELDS if f != "name"})
        splits = {}
        for split_name in ("train", "test"):
            split = Split(
                NonSensitiveDivision(ns[f"{split_name}_features"], ns[f"{split_name}_labels"]),
                SensitiveDivision(sens[f"{split_name}_groups"]),
            )
            if len(split) != meta[f"num_{split_name}"]:
                raise DataError(
                    f"{split_name} split has {len(split)} records, {INFO_FILE} says {meta[f'num_{split_name}']}"
                )
            splits[split_name] = split
        return SiloData(info=info, silo_id=meta["silo_id"], num_silos=meta["num_silos"], **splits)
    except (DataError, TypeError) as exc:
        raise SiloStoreError(f"{directory}: files are inconsistent ({exc}); re-create the silo directory") from exc
