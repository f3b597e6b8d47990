"""`load_dataset`: the built-in datasets of the papers' experiments, the synthetic one, or any CSV/Parquet file.

Preprocessing follows SteFFLe (Appendix E.2): 3:1 random train/test split by seed,
one-hot categoricals, continuous columns z-scored with training statistics (see `generic.py`), sensitive columns
removed from the features, and an `age` sort key for Algorithm 3. Per dataset:

* **adult** (UCI #2): adult.data and adult.test pooled (48,842 rows; adult.test's junk first line skipped and the
  trailing '.' of its labels dropped). Rows with '?' (unknown workclass, occupation or native-country) are DROPPED,
  leaving 45,222 rows (33,916 train / 11,306 test): with them dropped the one-hot layout has exactly the 102 input
  features the paper reports (6 continuous + 96 categories; keeping '?' as a category would give 106), and the
  authors' code reads such a purified table. Target income >50K; sensitive sex.
* **credit** (UCI #350, CSV form): 30,000 rows, of which 2 (IDs 3 and 4, AGE 'nan' in this CSV copy) are dropped,
  leaving 29,998 (22,498 train / 7,500 test). ID dropped; sensitive SEX (1 Male, 2 Female); target
  default.payment.next.month. EDUCATION, MARRIAGE and PAY_0, PAY_2..PAY_6 are one-hot (they are codes, not amounts);
  the undocumented codes are merged into "other" as is customary (EDUCATION 0, 5, 6 -> 4; MARRIAGE 0 -> 3), which
  yields exactly the paper's 85 features (14 continuous + 4 + 3 + 64 payment-status categories).
* **parkinsons** (UCI #189): 5,875 rows. Sensitive sex (0 Male, 1 Female); target total_UPDRS > its median over the
  training split; subject#, motor_UPDRS and total_UPDRS are not features (motor_UPDRS is a near-copy of the target);
  18 continuous features. Note: rows, not subjects, are split, as in the papers, so a subject's recordings appear
  in both splits.
* **synthetic**: `synthetic.make_synthetic` with its defaults (no files).
* **mnist**, **fashion-mnist**: the official 60,000 / 10,000 split of the idx files, 784 pixel features in [0, 1],
  labels 0..9, no sensitive attribute (one group "all"); see `images.py`. `seed` does not apply (no re-splitting) and
  the test share (`test_fraction`, `--test-fraction`) must stay at its default.
* **digits**: scikit-learn's bundled 8x8 digits (1,797 images, no files), 64 pixel features in [0, 1], split 3:1 by
  `seed` like the tabular datasets; no sensitive attribute.
* **cifar10**: the official 50,000 / 10,000 split of Krizhevsky's python batches, 3,072 channel-major pixel features
  in [0, 1], labels 0..9 with the official class names, no sensitive attribute; see `cifar.py`. Like MNIST, `seed`
  does not apply and `test_fraction` must stay at its default.

For the tabular built-ins, `sensitive` and `features` may override the defaults (e.g. sensitive=("race", "sex") on
adult; a default sensitive column that is no longer sensitive becomes an ordinary one-hot feature); the target is
fixed. The image datasets take no overrides (their features are pixels and they have no sensitive column).

What a tabular reader does to its file's values (credit's ID dropped, SEX 1/2 read as Male/Female, codes merged;
parkinsons' sex codes; adult.test's label dots) is data, a `protocols.preprocessing.Recoding` per dataset (`_ADULT`,
`_CREDIT`, `_PARKINSONS`): :func:`builtin_table` applies it to what the reader read, and `build_dataset` records it
with the preprocessing, so `silofl predict | evaluate` recode rows of the original file the same way. The rows a
reader drops (adult's '?', credit's missing AGE) and how it parses its files stay code: a new row cannot be dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from silofl.client.data.cifar import CIFAR_DATASETS, load_cifar10
from silofl.client.data.generic import (
    LabelEncoder,
    above_train_median,
    build_dataset,
    categorical_labels,
    load_table_dataset,
)
from silofl.client.data.images import IMAGE_DATASETS, load_digits, load_mnist
from silofl.client.data.sources import ensure_file
from silofl.client.data.synthetic import SYNTHETIC_LABEL_NAMES, synthetic_frame
from silofl.client.data.tabular import DataError, TabularDataset
from silofl.protocols.preprocessing import PreprocessingError, Recoding, ValueMap

__all__ = ["ADULT_COLUMNS", "BUILTIN_DATASETS", "builtin_table", "load_dataset"]

BUILTIN_DATASETS = ("adult", "credit", "parkinsons", "synthetic", *IMAGE_DATASETS, *CIFAR_DATASETS)
_DEFAULT_TEST_FRACTION = 0.25

ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)


def _read_csv(path: Path, **kwargs: object) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **kwargs)  # type: ignore[call-overload]
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot parse it as the expected CSV ({exc}); re-download it or check its sha256 "
            "against SHA256SUMS"
        ) from exc


def _expect_columns(frame: pd.DataFrame, expected: Sequence[str], path: Path) -> None:
    missing = [c for c in expected if c not in frame.columns]
    if missing:
        raise DataError(
            f"{path}: columns {missing} missing (found {list(frame.columns)[:8]}...); this is not the "
            "expected file; check its sha256 against SHA256SUMS"
        )


def _read_adult(paths: list[Path]) -> pd.DataFrame:
    """adult.data and adult.test pooled, rows with '?' dropped (the income labels' '.' is `_ADULT`'s recoding)."""
    data_path, test_path = paths
    frames = []
    for path, skip in ((data_path, 0), (test_path, 1)):  # adult.test starts with "|1x3 Cross validator"
        frame = _read_csv(path, header=None, names=list(ADULT_COLUMNS), skipinitialspace=True, skiprows=skip)
        frame = frame.dropna(how="all")  # the files end in blank lines
        if frame.isna().any().any():
            raise DataError(f"{path}: rows with fewer than {len(ADULT_COLUMNS)} fields; the file is damaged")
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True)
    unknown = (frame == "?").any(axis=1)
    return frame.loc[~unknown].reset_index(drop=True)


def _read_credit(paths: list[Path]) -> pd.DataFrame:
    """The CSV without its rows with a missing value (its ID, SEX and code columns are `_CREDIT`'s recoding)."""
    (path,) = paths
    frame = _read_csv(path)
    _expect_columns(frame, ["ID", "SEX", "EDUCATION", "MARRIAGE", "AGE", "default.payment.next.month"], path)
    # This CSV form carries AGE 'nan' for IDs 3 and 4 (UCI's .xls has 34 and 37): drop rows with missing values.
    return frame.dropna().reset_index(drop=True)


def _read_parkinsons(paths: list[Path]) -> pd.DataFrame:
    """The file as it is (its sex codes are `_PARKINSONS`'s recoding)."""
    (path,) = paths
    frame = _read_csv(path)
    _expect_columns(frame, ["subject#", "age", "sex", "motor_UPDRS", "total_UPDRS"], path)
    return frame


# What each reader does to its rows' values, as data (`protocols.preprocessing.Recoding`): applied to the read table
# by `_load_builtin` and recorded with the preprocessing, so `silofl predict | evaluate` take rows of the original file.
_ADULT = Recoding(values=(ValueMap("income", (("<=50K.", "<=50K"), (">50K.", ">50K"))),))  # adult.test's labels
_CREDIT = Recoding(
    drop=("ID",),
    values=(
        ValueMap("SEX", ((1, "Male"), (2, "Female")), others="error"),
        ValueMap("EDUCATION", ((0, 4), (5, 4), (6, 4))),  # the undocumented codes merged into 4, "others"
        ValueMap("MARRIAGE", ((0, 3),)),  # likewise into 3, "others"
    ),
)
_PARKINSONS = Recoding(values=(ValueMap("sex", ((0, "Male"), (1, "Female")), others="error"),))


@dataclass(frozen=True)
class _Builtin:
    files: tuple[str, ...]
    read: Callable[[list[Path]], pd.DataFrame]
    target: str
    sensitive: tuple[str, ...]
    sort_key: str
    label_encoder: LabelEncoder
    recoding: Recoding = field(default_factory=Recoding)  # applied to what `read` returns, and recorded
    categorical: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()  # never default features


_BUILTINS: dict[str, _Builtin] = {
    "adult": _Builtin(
        files=("adult/adult.data", "adult/adult.test"),
        read=_read_adult,
        target="income",
        sensitive=("sex",),
        sort_key="age",
        label_encoder=categorical_labels(classes=["<=50K", ">50K"]),
        recoding=_ADULT,
    ),
    "credit": _Builtin(
        files=("credit_default_taiwan/UCI_Credit_Card.csv",),
        read=_read_credit,
        target="default.payment.next.month",
        sensitive=("SEX",),
        sort_key="AGE",
        label_encoder=categorical_labels(classes=[0, 1], names=["no default", "default"]),
        recoding=_CREDIT,
        categorical=("EDUCATION", "MARRIAGE", "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6"),
    ),
    "parkinsons": _Builtin(
        files=("parkinsons_telemonitoring/parkinsons_updrs.data",),
        read=_read_parkinsons,
        target="total_UPDRS",
        sensitive=("sex",),
        sort_key="age",
        label_encoder=above_train_median(names=("total_UPDRS<=median", "total_UPDRS>median")),
        recoding=_PARKINSONS,
        excluded=("subject#", "motor_UPDRS"),
    ),
}


def _as_list(value: Sequence[str] | str | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def builtin_table(name: str, paths: Sequence[Path]) -> pd.DataFrame:
    """The table a tabular built-in's encoder reads: its files (`paths`, in `_BUILTINS[name].files` order) read and
    recoded by its reader. Raises DataError naming the files."""
    spec = _BUILTINS[name]
    frame = spec.read(list(paths))
    try:
        return spec.recoding.apply(frame)
    except PreprocessingError as exc:
        raise DataError(f"{', '.join(map(str, paths))}: {exc}") from None


def _load_builtin(
    name: str,
    frame: pd.DataFrame,
    spec: _Builtin,
    *,
    seed: int,
    test_fraction: float,
    sensitive: list[str] | None,
    features: list[str] | None,
) -> TabularDataset:
    sens = sensitive if sensitive else list(spec.sensitive)
    if features is None:
        features = [c for c in frame.columns if c != spec.target and c not in sens and c not in spec.excluded]
    return build_dataset(
        frame,
        name=name,
        target=spec.target,
        sensitive=sens,
        features=features,
        categorical=[c for c in spec.categorical if c in features],
        sort_key=spec.sort_key,
        seed=seed,
        test_fraction=test_fraction,
        label_encoder=spec.label_encoder,
        recoding=spec.recoding,
    )


def _load_image(
    key: str,
    *,
    data_dir: str | Path | None,
    seed: int,
    test_fraction: float,
    sensitive: list[str] | None,
    features: list[str] | None,
    download: bool,
) -> TabularDataset:
    if sensitive:
        raise DataError(
            f"sensitive={sensitive} does not apply to the image dataset {key!r}: it has no sensitive attribute "
            "(every record is in the one group 'all'); drop --sensitive"
        )
    if features:
        raise DataError(f"features cannot be chosen for the image dataset {key!r}: its features are all its pixels")
    if key == "digits":
        return load_digits(seed=seed, test_fraction=test_fraction)
    if test_fraction != _DEFAULT_TEST_FRACTION:
        official = "50,000 / 10,000" if key in CIFAR_DATASETS else "60,000 / 10,000"
        raise DataError(
            f"--test-fraction {test_fraction} does not apply to {key!r}: it keeps its official {official} "
            "train/test split; drop --test-fraction"
        )
    if key in CIFAR_DATASETS:
        return load_cifar10(data_dir=data_dir, download=download)
    return load_mnist(key, data_dir=data_dir, download=download)


def load_dataset(
    name: str,
    *,
    data_dir: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = _DEFAULT_TEST_FRACTION,
    target: str | None = None,
    sensitive: Sequence[str] | None = None,
    features: Sequence[str] | None = None,
    download: bool = True,
    missing: str = "error",
    csv_sep: str = "",
    csv_encoding: str = "",
) -> TabularDataset:
    """Load and preprocess a dataset: a name of `BUILTIN_DATASETS` or a path to a `.csv`/`.parquet` file.

    data_dir: where the raw files live (default $SILOFL_DATA_DIR, else ~/.cache/silofl/data; see `sources.py`).
    seed / test_fraction: the random train/test split. target / sensitive / features: the columns of a file dataset
    (target and sensitive required; features default to all other columns, non-numeric ones one-hot). For built-ins
    only `sensitive` and `features` may be overridden (image datasets: nothing). download: fetch missing built-in files
    from their canonical address. missing: a file dataset's rows with a missing value in a used column: "error"
    (default) or "drop" (`generic.build_dataset`); the built-ins handle their own (see the module docstring).
    csv_sep / csv_encoding: a `.csv` file's separator and encoding; "" (default) detects them
    (`generic.read_table_with_format`). Refused for any other dataset.
    """
    sens = _as_list(sensitive)
    feats = _as_list(features)
    key = str(name).lower()
    if (csv_sep or csv_encoding) and Path(str(name)).suffix.lower() != ".csv":
        raise DataError(f"--csv-sep and --csv-encoding say how to read a .csv file; {name!r} is not one: drop them")
    if key in BUILTIN_DATASETS:
        if target is not None:
            raise DataError(
                f"target is fixed for the built-in dataset {key!r}; drop --target, or load your own "
                "table as a .csv/.parquet path with --target COLUMN"
            )
        if key in IMAGE_DATASETS or key in CIFAR_DATASETS:
            return _load_image(
                key,
                data_dir=data_dir,
                seed=seed,
                test_fraction=test_fraction,
                sensitive=sens,
                features=feats,
                download=download,
            )
        if key == "synthetic":
            frame = synthetic_frame(seed=seed)
            return build_dataset(
                frame,
                name="synthetic",
                target="label",
                sensitive=sens or ["group"],
                features=feats,
                sort_key="age",
                seed=seed,
                test_fraction=test_fraction,
                label_encoder=categorical_labels(classes=[0, 1], names=SYNTHETIC_LABEL_NAMES),
            )
        spec = _BUILTINS[key]
        paths = [ensure_file(f, data_dir, download=download) for f in spec.files]
        frame = builtin_table(key, paths)
        return _load_builtin(key, frame, spec, seed=seed, test_fraction=test_fraction, sensitive=sens, features=feats)
    if Path(str(name)).suffix.lower() in (".csv", ".parquet"):
        return load_table_dataset(
            name,
            target=target,
            sensitive=sens,
            features=feats,
            seed=seed,
            test_fraction=test_fraction,
            missing=missing,
            csv_sep=csv_sep,
            csv_encoding=csv_encoding,
        )
    raise DataError(
        f"unknown dataset {name!r}: use one of {', '.join(BUILTIN_DATASETS)} or a path to a .csv or .parquet file"
    )
