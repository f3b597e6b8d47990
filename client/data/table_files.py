"""Reading a table file: a `.csv` (with a header row) or a `.parquet` file (:func:`read_table`,
:func:`read_table_with_format`), with clear errors naming the file and the flag that fixes them.

A CSV file is read with the separator and encoding given (`--csv-sep`, `--csv-encoding`), else detected
(:func:`csv_format`): the separator among , ; tab | from the file's first lines, the encoding utf-8, or latin-1 when
the file is not valid UTF-8. :meth:`CsvFormat.note` says what was detected when it is not the default (reported by
the command line's checks, `client.data.preflight`). The detection is deterministic, so every silo of a run reads the
file as the command line's checks did.
"""

from __future__ import annotations

import codecs
import csv
import shlex
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from silofl.client.data.tabular import DataError

__all__ = [
    "CSV_SEPARATORS",
    "DEFAULT_ENCODING",
    "FALLBACK_ENCODING",
    "CsvFormat",
    "csv_format",
    "read_table",
    "read_table_with_format",
    "separator_name",
    "sniff_separator",
]

#: The separators detected in a CSV file when none is given (`--csv-sep`); the first wins a tie.
CSV_SEPARATORS = (",", ";", "\t", "|")
#: The encoding tried first when none is given (`--csv-encoding`), and the one read when the file is not valid in
#: it: latin-1 decodes every byte, so a file in another 8-bit encoding (cp1252, ...) reads with at most a few wrong
#: letters instead of failing.
DEFAULT_ENCODING = "utf-8"
FALLBACK_ENCODING = "latin-1"
#: What is read of a CSV file to detect its separator: its first bytes, at most its first lines.
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 50


def separator_name(sep: str) -> str:
    """A separator as `--csv-sep` takes it: 'tab' for a tab, else the character quoted for a shell (';' -> "';'")."""
    return "tab" if sep == "\t" else shlex.quote(sep)


@dataclass(frozen=True)
class CsvFormat:
    """How a CSV file is read: its separator and its encoding, each given (`--csv-sep`, `--csv-encoding`) or
    detected (:func:`csv_format`)."""

    sep: str
    encoding: str
    sep_detected: bool
    encoding_detected: bool

    def note(self, path: str | Path) -> str | None:
        """One line saying what was detected where it is not the default (',' and utf-8), and the flags that set it;
        None when the file reads as a comma-separated UTF-8 file or as the flags said."""
        found, flags = [], []
        if self.sep_detected and self.sep != ",":
            found.append(f"separator {separator_name(self.sep)}")
            flags.append(f"--csv-sep {separator_name(self.sep)}")
        if self.encoding_detected and self.encoding != DEFAULT_ENCODING:
            found.append(f"encoding {self.encoding} (the file is not valid UTF-8)")
            flags.append(f"--csv-encoding {self.encoding}")
        if not found:
            return None
        return f"{path}: read with the detected {' and '.join(found)}; {' '.join(flags)} sets it explicitly"


def _decodes(path: Path, encoding: str) -> bool:
    """Whether the whole file is valid text in `encoding` (read in 1 MiB chunks; nothing is kept)."""
    decoder = codecs.getincrementaldecoder(encoding)()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def sniff_separator(text: str) -> str | None:
    """The separator of the CSV text `text` (its first lines) among :data:`CSV_SEPARATORS`, or None when none splits
    its header (a one-column table).

    A candidate that splits every sampled line into as many fields as the header (quotes respected) beats one that
    does not, then more fields win, then the earlier candidate: a comma-separated file whose text holds semicolons
    reads as commas, a semicolon-separated one with decimal commas ('1,5') as semicolons (its header has no comma).
    """
    lines = [line for line in text.splitlines() if line.strip()][:_SNIFF_LINES]
    best: tuple[tuple[bool, int], str] | None = None
    for sep in CSV_SEPARATORS if lines else ():
        rows = list(csv.reader(lines, delimiter=sep))
        width = len(rows[0])
        if width < 2:
            continue
        score = (all(len(row) == width for row in rows), width)
        if best is None or score > best[0]:
            best = (score, sep)
    return None if best is None else best[1]


def csv_format(path: str | Path, *, sep: str = "", encoding: str = "") -> CsvFormat:
    """How to read the CSV file `path`: `sep` and `encoding` where given, else detected. The encoding: utf-8 when
    the whole file is valid UTF-8 (a byte-order mark included), else latin-1. The separator: :func:`sniff_separator`
    on the file's first 64 KiB, ',' when it finds none. Raises DataError for an encoding Python does not know and
    OSError when the file cannot be read."""
    path = Path(path)
    if encoding:
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise DataError(
                f"--csv-encoding {encoding!r} is not an encoding Python knows; give e.g. utf-8, latin-1 or cp1252, "
                "or leave it empty to detect it"
            ) from None
    chosen = encoding or (DEFAULT_ENCODING if _decodes(path, DEFAULT_ENCODING) else FALLBACK_ENCODING)
    detected = ""
    if not sep:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
        if len(head) == _SNIFF_BYTES and b"\n" in head:  # the file goes on: drop its last, maybe cut, line
            head = head[: head.rindex(b"\n") + 1]
        detected = sniff_separator(head.decode(chosen, errors="replace")) or ","
    return CsvFormat(sep=sep or detected, encoding=chosen, sep_detected=not sep, encoding_detected=not encoding)


def read_table_with_format(
    path: str | Path, *, csv_sep: str = "", csv_encoding: str = ""
) -> tuple[pd.DataFrame, CsvFormat | None]:
    """Read a `.csv` (with a header row) or `.parquet` file, and say how a CSV file was read (None for Parquet).

    csv_sep / csv_encoding: the CSV file's separator and encoding (`--csv-sep`, `--csv-encoding`); "" detects them
    (:func:`csv_format`). Errors name the file and the flag that fixes them: FileNotFoundError when it is missing,
    DataError for another file type, an undecodable or unparsable file, or CSV options given for a Parquet file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'}; use a .csv (with a header row) or a .parquet file"
        )
    if suffix != ".csv" and (csv_sep or csv_encoding):
        raise DataError(f"{path}: --csv-sep and --csv-encoding apply to a .csv file, not to {suffix}: drop them")
    if path.is_dir():
        raise DataError(f"{path} is a folder; give a .csv or .parquet file")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the path (relative paths start at {Path.cwd()})")
    if suffix == ".parquet":
        try:
            return pd.read_parquet(path), None
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: cannot read it as parquet: {exc}") from exc
    try:
        fmt = csv_format(path, sep=csv_sep, encoding=csv_encoding)
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    try:
        # skipinitialspace: tolerate "a, b" style files such as UCI's.
        frame = pd.read_csv(path, sep=fmt.sep, encoding=fmt.encoding, skipinitialspace=True)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not valid {exc.encoding} text ({exc.reason}); give the file's encoding with --csv-encoding "
            "(e.g. latin-1 or cp1252), or leave it empty to detect it"
        ) from exc
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"{path} is empty: it has no header row and no records") from exc
    except (pd.errors.ParserError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot read it as CSV with separator {separator_name(fmt.sep)} and encoding {fmt.encoding}: "
            f"{exc}; --csv-sep and --csv-encoding set them"
        ) from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    return frame, fmt


def read_table(path: str | Path, *, csv_sep: str = "", csv_encoding: str = "") -> pd.DataFrame:
    """Read a `.csv` (with a header row) or `.parquet` file: :func:`read_table_with_format` without the format."""
    return read_table_with_format(path, csv_sep=csv_sep, csv_encoding=csv_encoding)[0]
