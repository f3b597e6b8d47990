"""Where the built-in datasets' raw files live, and how to fetch and verify them.

The file layout of the data folder (`$SILOFL_DATA_DIR` or `--data-dir`, below): `adult/adult.data`, `adult/adult.test`,
`credit_default_taiwan/UCI_Credit_Card.csv`, `parkinsons_telemonitoring/parkinsons_updrs.data`, and the gzipped idx
files of `mnist/` and `fashion_mnist/` (`{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`); CIFAR-10's archive goes to
`cifar10/cifar-10-python.tar.gz` (not in the offline data folder this project is tested with; `cifar.py` extracts it).
The data directory is, in order: the `data_dir` argument (CLI `--data-dir`), the environment variable `SILOFL_DATA_DIR`,
else `~/.cache/silofl/data`.

With no local copy and `download=True` a file is fetched from its canonical address (or from the mirror
`SILOFL_DATA_MIRROR`, a base URL with the same layout, e.g. `file:///srv/mirror`), checked against the sha256
embedded below (the values of the `SHA256SUMS` file of that offline data folder), and only then moved into place; on a
mismatch the bad download is deleted and `ChecksumError` is raised. Files already present are trusted (not re-hashed) so
that loading stays fast; check them with `sha256sum -c SHA256SUMS`.

Image files: Fashion-MNIST comes from Zalando's own download address (the one its README gives). MNIST comes from
`ossci-datasets.s3.amazonaws.com/mnist`, PyTorch's byte-identical mirror, not from LeCun's original address
(`yann.lecun.com/exdb/mnist`): that site answers scripted downloads with HTTP 403 (pytorch/vision#8568) and asks
scripts not to fetch from it (pytorch/vision#4634). The sha256 is the same either way.

CIFAR-10 (`cifar10/cifar-10-python.tar.gz`, 170,498,071 bytes) comes from its author's page at the University of
Toronto. That page publishes only an md5 (c58f30108f718f92721af3b95e74349a); the sha256 below is the one Keras's
`cifar10.load_data` pins for the same URL, and public manifests list it together with that md5 and size. It could not
be re-computed here (that offline data folder holds no copy), so it rests on those published values.

Credit Card default (UCI #350) has no verifiable download: UCI ships it only as an `.xls` workbook, whose bytes we
have no checksum for and which needs an Excel reader (xlrd) that is not a dependency. Its CSV form must be put in
place by hand; the error message says where.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from silofl.client.data.tabular import DataError

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_CACHE_DIR",
    "FILES",
    "MIRROR_ENV",
    "ChecksumError",
    "DataUnavailableError",
    "Fetch",
    "RemoteFile",
    "ensure_file",
    "fetch_url",
    "resolve_data_dir",
    "sha256_file",
]

DATA_DIR_ENV = "SILOFL_DATA_DIR"
MIRROR_ENV = "SILOFL_DATA_MIRROR"
DEFAULT_CACHE_DIR = Path("~/.cache/silofl/data")

_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"
_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist"
_FASHION = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com"
_CIFAR = "https://www.cs.toronto.edu/~kriz"

#: Downloads a URL to a local path (the destination's parent exists). Injectable for tests and custom transports.
Fetch = Callable[[str, Path], None]


class DataUnavailableError(FileNotFoundError):
    """A raw data file is missing and could not be downloaded; the message says which file to put where."""


class ChecksumError(DataError):
    """A downloaded file's sha256 differs from the published one (the file was deleted)."""


@dataclass(frozen=True)
class RemoteFile:
    """One raw file: its path under the data dir, its sha256, and its canonical URL (None: no verifiable source)."""

    relpath: str
    sha256: str
    url: str | None
    note: str = ""


FILES: dict[str, RemoteFile] = {
    f.relpath: f
    for f in (
        RemoteFile(
            "adult/adult.data",
            "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
            f"{_UCI}/adult/adult.data",
        ),
        RemoteFile(
            "adult/adult.test",
            "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
            f"{_UCI}/adult/adult.test",
        ),
        RemoteFile(
            "parkinsons_telemonitoring/parkinsons_updrs.data",
            "f2c7d5025dec4e92e7feae367a5f7ccf58789a10ac6b54bdf15976c599f9dd39",
            f"{_UCI}/parkinsons/telemonitoring/parkinsons_updrs.data",
        ),
        RemoteFile(
            "credit_default_taiwan/UCI_Credit_Card.csv",
            "5c69a6b4e167dac42c4b22665330404fe49928a198de44d2d061b800cb65f9b1",
            None,
            note="the CSV form of UCI dataset #350 'default of credit card clients' (Kaggle "
            "'UCI_Credit_Card.csv'); UCI itself only ships an .xls, which silofl cannot verify or read",
        ),
        RemoteFile(
            "mnist/train-images-idx3-ubyte.gz",
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            f"{_MNIST}/train-images-idx3-ubyte.gz",
        ),
        RemoteFile(
            "mnist/train-labels-idx1-ubyte.gz",
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            f"{_MNIST}/train-labels-idx1-ubyte.gz",
        ),
        RemoteFile(
            "mnist/t10k-images-idx3-ubyte.gz",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            f"{_MNIST}/t10k-images-idx3-ubyte.gz",
        ),
        RemoteFile(
            "mnist/t10k-labels-idx1-ubyte.gz",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
            f"{_MNIST}/t10k-labels-idx1-ubyte.gz",
        ),
        RemoteFile(
            "fashion_mnist/train-images-idx3-ubyte.gz",
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            f"{_FASHION}/train-images-idx3-ubyte.gz",
        ),
        RemoteFile(
            "fashion_mnist/train-labels-idx1-ubyte.gz",
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            f"{_FASHION}/train-labels-idx1-ubyte.gz",
        ),
        RemoteFile(
            "fashion_mnist/t10k-images-idx3-ubyte.gz",
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            f"{_FASHION}/t10k-images-idx3-ubyte.gz",
        ),
        RemoteFile(
            "fashion_mnist/t10k-labels-idx1-ubyte.gz",
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
            f"{_FASHION}/t10k-labels-idx1-ubyte.gz",
        ),
        RemoteFile(
            "cifar10/cifar-10-python.tar.gz",
            "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
            f"{_CIFAR}/cifar-10-python.tar.gz",
        ),
    )
}


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The data directory: the argument, else $SILOFL_DATA_DIR, else ~/.cache/silofl/data (expanded, absolute)."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(data_dir).expanduser().absolute()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_url(url: str, dest: Path, *, timeout: float = 60.0) -> None:
    """Download `url` (http(s):// or file://) to `dest` with urllib."""
    with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out)


def _how_to_fix(spec: RemoteFile, target: Path, root: Path) -> str:
    origin = f"download it from {spec.url}" if spec.url else f"get {spec.note}"
    return (
        f"Put the file at {target} ({origin}; sha256 {spec.sha256}), or point --data-dir / the environment "
        f"variable {DATA_DIR_ENV} at a directory that holds '{spec.relpath}' (currently {root})."
    )


def ensure_file(
    relpath: str,
    data_dir: str | Path | None = None,
    *,
    download: bool = True,
    fetch: Fetch | None = None,
    mirror: str | None = None,
) -> Path:
    """Path to the raw file `relpath` (a key of `FILES`), downloading and verifying it if it is not there.

    mirror: base URL used instead of the canonical address (default: $SILOFL_DATA_MIRROR, if set).
    fetch: the download function (default: `fetch_url`).
    Raises DataUnavailableError (missing, and no download possible or allowed) or ChecksumError (bad download).
    """
    if relpath not in FILES:
        raise DataError(f"unknown data file {relpath!r}; known files: {sorted(FILES)}")
    spec = FILES[relpath]
    root = resolve_data_dir(data_dir)
    target = root / relpath
    if target.is_file():
        return target

    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    url = f"{mirror.rstrip('/')}/{relpath}" if mirror else spec.url
    if not download:
        raise DataUnavailableError(
            f"{relpath} not found under {root} and downloading is off. " + _how_to_fix(spec, target, root)
        )
    if url is None:
        raise DataUnavailableError(
            f"{relpath} not found under {root}, and it has no verifiable download. " + _how_to_fix(spec, target, root)
        )

    partial = target.with_name(target.name + ".part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        (fetch or fetch_url)(url, partial)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        partial.unlink(missing_ok=True)
        raise DataUnavailableError(
            f"{relpath} not found under {root}, and downloading {url} failed ({exc}). "
            + _how_to_fix(spec, target, root)
        ) from exc
    actual = sha256_file(partial)
    if actual != spec.sha256:
        partial.unlink(missing_ok=True)
        raise ChecksumError(
            f"downloaded {url} but its sha256 is {actual}, expected {spec.sha256}; the file was "
            f"deleted. The source may have changed or the transfer was corrupted. " + _how_to_fix(spec, target, root)
        )
    os.replace(partial, target)
    return target
