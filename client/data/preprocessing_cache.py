"""The preprocessing of a simulated run's data, recorded while the data is loaded and kept for the process.

A run's model artifact (`server.model_artifact`) needs the preprocessing of the run's data. Recording it by loading the
dataset once more after the run costs a full load (Adult: about 0.17 s of CPU, 0.5 s or more of wall time on a shared
machine), paid by every run of a sweep. The data is loaded already before the run: `silofl run`'s checks
(`client.data.preflight`) load it as the silos will, inside :func:`recording`, which keeps what that load applied; the
artifact takes it with :func:`preprocessing_of`, which loads (and keeps) only what no load of this process recorded.

Kept per data spec (`protocols.messages.DataSpec`, the key of the silos' own cache in `client.silo_data`) and, for a
file dataset, the file's size and modification time, so a file rewritten in place is recorded again, as a new load
would record it. At most :data:`KEPT` specs (a record is a few kilobytes: vocabularies and two numbers per continuous
column); the oldest goes first. A load that records nothing (an image dataset, or the silos' cache answering without
loading) keeps nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from silofl.protocols.messages import DataSpec
from silofl.protocols.preprocessing import Preprocessing, PreprocessingError

__all__ = ["KEPT", "forget", "preprocessing_of", "recording"]

#: How many data specs' records a process keeps.
KEPT = 8

_Key = tuple[DataSpec, tuple[int, int] | None]
_KEPT: OrderedDict[_Key, Preprocessing | PreprocessingError] = OrderedDict()


def _key(spec: DataSpec) -> _Key:
    """The spec, and the size and modification time of its dataset file (None for a built-in, or a missing file)."""
    path = Path(spec.dataset)
    if path.suffix.lower() not in (".csv", ".parquet") or not path.is_file():
        return spec, None
    stat = path.stat()
    return spec, (stat.st_size, stat.st_mtime_ns)


def _keep(key: _Key, record: Preprocessing | PreprocessingError) -> None:
    _KEPT[key] = record
    _KEPT.move_to_end(key)
    while len(_KEPT) > KEPT:
        _KEPT.popitem(last=False)


@contextmanager
def recording(spec: DataSpec) -> Iterator[None]:
    """Keep the preprocessing that loading `spec`'s data inside the block applies (or the error saying why it could
    not be recorded). Nothing is kept when the block raises or loads nothing; nothing is recorded (checking a record
    costs about a fifth of a load) when one is kept for `spec` already."""
    from silofl.client.data.generic import recording_preprocessing
    from silofl.client.data.preprocessing_file import recorded_preprocessing

    if _key(spec) in _KEPT:
        yield
        return
    with recording_preprocessing() as recorded:
        yield
    if not recorded:
        return
    try:
        record: Preprocessing | PreprocessingError = recorded_preprocessing(recorded, spec.dataset)
    except PreprocessingError as exc:
        record = exc
    _keep(_key(spec), record)


def preprocessing_of(spec: DataSpec, load: Callable[[], Preprocessing]) -> Preprocessing:
    """The preprocessing of `spec`'s data: the one a load of this process recorded, else `load()`'s, kept. Raises
    the PreprocessingError kept for it, or `load`'s errors."""
    key = _key(spec)
    record = _KEPT.get(key)
    if record is None:
        record = load()
        _keep(key, record)
    if isinstance(record, PreprocessingError):
        raise record
    _KEPT.move_to_end(key)
    return record


def forget() -> None:
    """Drop every kept record."""
    _KEPT.clear()
