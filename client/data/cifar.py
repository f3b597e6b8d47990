"""CIFAR-10 as a silofl dataset, read from Krizhevsky's "python version" batches.

FedSC's CIFAR-10 experiment (paper Section 7.1) splits the 50,000 training images into
10 clients of one class each. Like the other image datasets (`images.py`) each image becomes one record: its 3,072
pixels as float32 features in [0, 1] (byte / 255), labels 0..9 with the official class names, the official
50,000 / 10,000 train/test split (no re-splitting), and one pseudo sensitive group "all" (no protected attribute).

Feature order is the batches' own: channel-major, i.e. 1,024 red values, then green, then blue, each plane row-major
over 32 x 32. ``features.reshape(n, 3, 32, 32)`` gives torch's (N, C, H, W) layout directly
(`protocols.ssl_models.image_shape(3072) == (3, 32, 32)`); feature names are ``red_<row>_<col>`` and so on.

Files, under the data dir (see `sources.py`): the extracted folder ``cifar10/cifar-10-batches-py/`` with
``data_batch_1`` .. ``data_batch_5`` and ``test_batch``; or else the archive ``cifar10/cifar-10-python.tar.gz``,
downloaded from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and checksum-verified when missing. The
archive's batches are extracted into the folder on first use (written to a temporary folder and renamed, so a crash
leaves no half folder); if the data dir is read-only the batches are read from the archive in memory instead.

Each batch is a pickled dict (pickled by Python 2; protocol 2) with ``b"data"`` a uint8 numpy array (n, 3072) and
``b"labels"`` a list of n ints. Unpickling can run arbitrary code, so batches are read with a restricted unpickler
that only rebuilds numpy arrays (`_BatchUnpickler`); anything else in the file is rejected as corrupt.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from silofl.client.data.images import scaled_pixels, single_group_dataset, single_group_split
from silofl.client.data.sources import DataUnavailableError, ensure_file, resolve_data_dir
from silofl.client.data.tabular import DataError, Split, TabularDataset

__all__ = [
    "CIFAR10_ARCHIVE",
    "CIFAR10_FOLDER",
    "CIFAR10_LABELS",
    "CIFAR_DATASETS",
    "load_cifar10",
    "read_batch",
]

#: Dataset names handled here (the keys `load_dataset` accepts).
CIFAR_DATASETS = ("cifar10",)
#: Paths under the data dir: the official archive, and the folder its batches are extracted to.
CIFAR10_ARCHIVE = "cifar10/cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar10/cifar-10-batches-py"
#: The official class names, in label order (batches.meta's label_names).
CIFAR10_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST_BATCHES = ("test_batch",)
_BATCHES = _TRAIN_BATCHES + _TEST_BATCHES
_ARCHIVE_PREFIX = "cifar-10-batches-py/"
_SIDE = 32
_PIXELS = 3 * _SIDE * _SIDE
_CHANNELS = ("red", "green", "blue")

#: The only globals a CIFAR batch may reference: numpy's array reconstruction (numpy 1 and 2 module names), and
#: `_codecs.encode`, which Python 3 writes for bytes when it pickles with protocol 2.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that resolves only `_ALLOWED_GLOBALS` (numpy arrays); any other global is an error."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        if module == "numpy.core.multiarray":  # numpy 2 renamed the module; avoid its deprecation shim
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def read_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode one pickled batch: uint8 pixels (n, 3072) and int64 labels (n,). `where` names it in errors."""
    try:
        batch = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as exc:
        raise DataError(
            f"{where}: not a readable CIFAR-10 python batch ({exc}); the file is truncated or damaged, delete it (and "
            f"the folder {CIFAR10_FOLDER}) so that it is extracted or downloaded again"
        ) from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{where}: expected a dict with keys b'data' and b'labels', found {keys}; not a CIFAR-10 batch")
    data = batch[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        described = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{where}: b'data' must be a uint8 array (n, {_PIXELS}), got {described}; not CIFAR-10")
    try:
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: b'labels' is not a list of integers ({exc})") from exc
    if labels.shape != (data.shape[0],):
        raise DataError(f"{where}: {labels.size} labels for {data.shape[0]} images; the batch is damaged")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_LABELS)):
        raise DataError(f"{where}: labels out of range 0..9 (min {labels.min()}, max {labels.max()}); not CIFAR-10")
    return data, labels


def _read_archive(archive: Path) -> dict[str, bytes]:
    """The six batch files of the official archive, by name, read in memory (nothing else is extracted)."""
    wanted = {_ARCHIVE_PREFIX + name: name for name in _BATCHES}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = wanted.get(member.name)
                if name is not None and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[name] = handle.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{archive}: not a readable .tar.gz ({exc}); delete it so that it is downloaded again, or check its "
            "sha256 (md5 c58f30108f718f92721af3b95e74349a)"
        ) from exc
    missing = [name for name in _BATCHES if name not in found]
    if missing:
        raise DataError(f"{archive}: the archive lacks {[_ARCHIVE_PREFIX + m for m in missing]}; not CIFAR-10 python")
    return found


def _extract(files: dict[str, bytes], folder: Path) -> None:
    """Write the batches to `folder` atomically (temporary sibling folder, then rename); OSError if not writable."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cifar-10-batches-py.", dir=folder.parent))
    try:
        for name, raw in files.items():
            (staging / name).write_bytes(raw)
        if folder.exists():  # an incomplete earlier folder: keep its other files, fill in the batches
            for name in files:
                os.replace(staging / name, folder / name)
            staging.rmdir()
        else:
            os.replace(staging, folder)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _batch_bytes(data_dir: str | Path | None, download: bool) -> dict[str, tuple[bytes, str]]:
    """Raw bytes of the six batches and where each came from: the folder if complete, else the (fetched) archive."""
    root = resolve_data_dir(data_dir)
    folder = root / CIFAR10_FOLDER
    if all((folder / name).is_file() for name in _BATCHES):
        return {name: ((folder / name).read_bytes(), str(folder / name)) for name in _BATCHES}
    try:
        archive = ensure_file(CIFAR10_ARCHIVE, data_dir, download=download)
    except DataUnavailableError as exc:
        missing = [name for name in _BATCHES if not (folder / name).is_file()]
        raise DataUnavailableError(
            f"CIFAR-10: {folder} lacks {missing}, and the archive is unavailable: {exc}"
        ) from exc
    files = _read_archive(archive)
    with contextlib.suppress(OSError):  # read-only data dir: use the in-memory batches, extract again next time
        _extract(files, folder)
    return {name: (raw, f"{archive}:{_ARCHIVE_PREFIX}{name}") for name, raw in files.items()}


def _split(batches: dict[str, tuple[bytes, str]], names: tuple[str, ...]) -> Split:
    decoded = [read_batch(*batches[name]) for name in names]
    pixels = np.concatenate([d for d, _ in decoded]) if len(decoded) > 1 else decoded[0][0]
    labels = np.concatenate([lab for _, lab in decoded])
    return single_group_split(scaled_pixels(pixels, 255.0), labels)


def load_cifar10(data_dir: str | Path | None = None, download: bool = True) -> TabularDataset:
    """CIFAR-10 with the official 50,000 / 10,000 split: 3,072 channel-major features in [0, 1], labels 0..9.

    data_dir: the directory holding `cifar10/` (default $SILOFL_DATA_DIR, else ~/.cache/silofl/data). download: fetch
    the archive from its canonical address (sha256-checked) when neither the batches nor the archive are there.
    Memory: the float32 features take about 740 MB (60,000 x 3,072 x 4 bytes).
    """
    batches = _batch_bytes(data_dir, download)
    feature_names = tuple(f"{c}_{r}_{k}" for c in _CHANNELS for r in range(_SIDE) for k in range(_SIDE))
    train, test = _split(batches, _TRAIN_BATCHES), _split(batches, _TEST_BATCHES)
    return single_group_dataset("cifar10", feature_names, CIFAR10_LABELS, train, test)
