"""Image datasets as silofl datasets: MNIST, Fashion-MNIST (idx files) and scikit-learn's bundled 8x8 digits.

These are the datasets of DP-mu2-FL's experiments (paper Section 5.3): multinomial
logistic regression on raw pixels. Each image becomes one record with its pixels, row-major, as features scaled to
[0, 1] (float32, pixel / 255 for MNIST, pixel / 16 for digits). The features are NOT z-scored and no constant bias
column is appended: the paper's constants (G = sqrt(2 * 785), L = 785 / 2, see `protocols.mu2fl.Mu2Constants`) assume
pixels in [0, 1], and the model's own bias plays the role of the paper's bias feature
(`build_model("logreg", 784, 10)` has 10 x 784 weights + 10 biases = 7,850 parameters, the paper's d).

Splits: MNIST and Fashion-MNIST keep their official 60,000 / 10,000 train/test split (no re-splitting, so results are
comparable with the literature); digits (1,797 images) is split 3:1 by seed like the tabular datasets.

No protected attribute: every record belongs to one sensitive group "all", so fairness metrics are trivially 0 and
the rest of silofl (partitioning, silo storage, accounting) works unchanged. `DatasetInfo` requires at least one
sensitive column, so the division is described by the pseudo-column `NO_SENSITIVE_COLUMN` ("none").

Files (see `sources.py`): `mnist/` or `fashion_mnist/` under the data dir, `{train,t10k}-{images-idx3,labels-idx1}-
ubyte.gz`, downloaded and sha256-checked on first use when missing. Decoding a 60,000-image file takes about half a
second (gzip), so the decoded uint8 arrays are cached per process (`functools.lru_cache`, keyed by path, size and
modification time); scaling to float32 is redone per call (tens of milliseconds) so that callers own their arrays.
"""

from __future__ import annotations

import gzip
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from silofl.client.data.sources import ensure_file
from silofl.client.data.tabular import (
    DataError,
    DatasetInfo,
    NonSensitiveDivision,
    SensitiveDivision,
    Split,
    TabularDataset,
)

__all__ = [
    "FASHION_MNIST_LABELS",
    "IMAGE_DATASETS",
    "MNIST_KINDS",
    "NO_SENSITIVE_COLUMN",
    "SINGLE_GROUP",
    "idx_files",
    "load_digits",
    "load_mnist",
    "read_idx",
    "scaled_pixels",
    "single_group_dataset",
    "single_group_split",
]

#: Dataset names handled here (the keys `load_dataset` accepts).
IMAGE_DATASETS = ("mnist", "fashion-mnist", "digits")
#: `load_mnist` kinds and their folder under the data dir (the layout of the data folder, `$SILOFL_DATA_DIR`).
MNIST_KINDS: dict[str, str] = {"mnist": "mnist", "fashion-mnist": "fashion_mnist"}
#: Zalando's class names, in label order (fashion-mnist README).
FASHION_MNIST_LABELS = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
#: The pseudo sensitive column of datasets without a protected attribute, and its only group.
NO_SENSITIVE_COLUMN = "none"
SINGLE_GROUP = "all"

_IMAGE_MAGIC = 2051  # idx3: 0x00000803, unsigned byte, 3 dimensions
_LABEL_MAGIC = 2049  # idx1: 0x00000801, unsigned byte, 1 dimension
_SPLIT_FILES = {"train": "train", "test": "t10k"}


def idx_files(kind: str) -> dict[str, tuple[str, str]]:
    """Relative paths (images, labels) of the train and test split of `kind` ("mnist" or "fashion-mnist")."""
    if kind not in MNIST_KINDS:
        raise DataError(f"unknown image dataset kind {kind!r}; use one of {', '.join(MNIST_KINDS)}")
    folder = MNIST_KINDS[kind]
    return {
        split: (f"{folder}/{prefix}-images-idx3-ubyte.gz", f"{folder}/{prefix}-labels-idx1-ubyte.gz")
        for split, prefix in _SPLIT_FILES.items()
    }


def read_idx(path: str | Path) -> np.ndarray:
    """Decode a gzipped idx file (LeCun's format) into a read-only uint8 array: (n, rows * cols) or labels (n,).

    The header is a big-endian magic number (2051 for images, 2049 for labels) followed by the dimensions. Cached per
    process; a file that changes on disk (other size or modification time) is decoded again.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; load it through load_mnist() so that it is downloaded") from None
    return _read_idx_cached(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _read_idx_cached(path: str, size: int, mtime_ns: int) -> np.ndarray:
    del size, mtime_ns  # part of the cache key only
    try:
        raw = gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{path}: not a readable gzip file ({exc}); delete it so that it is downloaded again, or check its "
            "sha256 against SHA256SUMS"
        ) from exc
    if len(raw) < 8:
        raise DataError(f"{path}: {len(raw)} bytes is too short for an idx header; the file is damaged")
    magic = int.from_bytes(raw[:4], "big")
    if magic not in (_IMAGE_MAGIC, _LABEL_MAGIC):
        raise DataError(
            f"{path}: idx magic number {magic} is neither {_IMAGE_MAGIC} (images) nor {_LABEL_MAGIC} (labels); "
            "this is not an MNIST-format file"
        )
    ndim = 3 if magic == _IMAGE_MAGIC else 1
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise DataError(
            f"{path}: header announces dimensions {dims} ({expected} bytes) but the file holds {len(raw)} bytes; "
            "the file is truncated or damaged, re-download it"
        )
    array = np.frombuffer(raw, dtype=np.uint8, offset=header)
    array = array.reshape(dims[0], -1) if ndim == 3 else array
    array.flags.writeable = False  # shared by every caller through the cache
    return array


def _pixel_names(height: int, width: int) -> tuple[str, ...]:
    return tuple(f"pixel_{r}_{c}" for r in range(height) for c in range(width))


def scaled_pixels(pixels: np.ndarray, maximum: float) -> np.ndarray:
    """pixels / maximum as float32 (correctly rounded, like torchvision's ToTensor), in a new C-contiguous array."""
    out = np.empty(pixels.shape, dtype=np.float32)
    np.divide(pixels, np.float32(maximum), out=out, dtype=np.float32)
    return out


def single_group_split(features: np.ndarray, labels: np.ndarray) -> Split:
    """One split of an image dataset: `features` as they are, `labels` as int64, every record in group 0 ("all")."""
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    return Split(NonSensitiveDivision(features, labels), SensitiveDivision(np.zeros(labels.shape[0], np.int64)))


def single_group_dataset(
    name: str, feature_names: tuple[str, ...], label_names: tuple[str, ...], train: Split, test: Split
) -> TabularDataset:
    """An image dataset: its one pseudo sensitive column `NO_SENSITIVE_COLUMN` with one group `SINGLE_GROUP`, and
    no sort key (no attribute to partition by)."""
    info = DatasetInfo(
        name=name,
        feature_names=feature_names,
        label_names=label_names,
        sensitive_columns=(NO_SENSITIVE_COLUMN,),
        group_names=(SINGLE_GROUP,),
    )
    return TabularDataset(info=info, train=train, test=test, train_sort_key=None, test_sort_key=None)


def load_mnist(kind: str = "mnist", data_dir: str | Path | None = None, download: bool = True) -> TabularDataset:
    """MNIST or Fashion-MNIST with the official 60,000 / 10,000 split: 784 features in [0, 1], labels 0..9.

    data_dir: the directory holding `mnist/` or `fashion_mnist/` (default $SILOFL_DATA_DIR, else
    ~/.cache/silofl/data). download: fetch missing files from their canonical address (sha256-checked).
    """
    splits = {}
    for split, (images_rel, labels_rel) in idx_files(kind).items():
        images = read_idx(ensure_file(images_rel, data_dir, download=download))
        labels = read_idx(ensure_file(labels_rel, data_dir, download=download))
        if images.ndim != 2 or images.shape[1] != 28 * 28:
            raise DataError(f"{images_rel}: expected 28 x 28 images, got {images.shape[1]} pixels per image")
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise DataError(
                f"{labels_rel} holds {labels.shape[0]} labels but {images_rel} holds {images.shape[0]} images; "
                "the two files must come from the same split"
            )
        if labels.size and labels.max() > 9:
            raise DataError(f"{labels_rel}: label {labels.max()} out of range 0..9; this is not an MNIST label file")
        splits[split] = single_group_split(scaled_pixels(images, 255.0), labels)
    label_names = FASHION_MNIST_LABELS if kind == "fashion-mnist" else tuple(str(k) for k in range(10))
    return single_group_dataset(kind, _pixel_names(28, 28), label_names, splits["train"], splits["test"])


def load_digits(seed: int = 0, test_fraction: float = 0.25) -> TabularDataset:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download): 64 features in [0, 1], a random 3:1 split.

    The split is `generic.split_indices(n, test_fraction, seed)`, the one the tabular datasets use. Pixels are 0..16
    in the source and are divided by 16.
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn is a dependency
        raise DataError("the digits dataset needs scikit-learn; install it with `pip install scikit-learn`") from exc
    from silofl.client.data.generic import split_indices  # imports pandas: only when needed

    bunch = sklearn_digits()
    pixels = np.asarray(bunch.data)  # float64 (1797, 64), integer values 0..16
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = split_indices(labels.shape[0], test_fraction, seed)
    features = scaled_pixels(pixels, 16.0)
    return single_group_dataset(
        "digits",
        _pixel_names(8, 8),
        tuple(str(k) for k in range(10)),
        single_group_split(np.ascontiguousarray(features[train_idx]), labels[train_idx]),
        single_group_split(np.ascontiguousarray(features[test_idx]), labels[test_idx]),
    )
