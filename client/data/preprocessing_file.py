"""The preprocessing a dataset load records, as an object or as the file `silofl data split` writes beside its folders.

`client.data.generic.recording_preprocessing` collects what `build_dataset` applied while a dataset loads; this module
turns that into one :class:`~protocols.preprocessing.Preprocessing` (or a clear `PreprocessingError`) for the two
places that learn a run's encoding:

* simulation (`silofl run`): the command-line process loads the run's dataset once more after the run, with the
  silos' own loader arguments, and puts the preprocessing into the run's model artifact (`server.model_artifact`);
* deployment: `silofl data split` writes it to DIR/preprocessing.json next to the silo folders it writes (the data
  owner who splits the data holds these statistics already); `silofl model pack RUN --preprocessing FILE` puts it into
  the artifact of a run trained on those folders. It is never sent to the server (it is not differentially private).

Image datasets (mnist, fashion-mnist, digits, cifar10) are not encoded by the tabular encoder (their features are the
pixels scaled to [0, 1]): they have no preprocessing record, and `load_preprocessing` says so without loading them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from silofl.protocols.preprocessing import Preprocessing, PreprocessingError

__all__ = ["PREPROCESSING_FILE", "load_preprocessing", "recorded_preprocessing", "write_preprocessing"]

#: The file `silofl data split` writes next to the silo (or party) folders.
PREPROCESSING_FILE = "preprocessing.json"


def _image_datasets() -> tuple[str, ...]:
    from silofl.client.data.cifar import CIFAR_DATASETS
    from silofl.client.data.images import IMAGE_DATASETS as MNIST_LIKE

    return (*MNIST_LIKE, *CIFAR_DATASETS)


def _not_tabular(dataset: str) -> PreprocessingError:
    return PreprocessingError(
        f"dataset {dataset!r} is an image dataset: its features are the pixels scaled to [0, 1], not the tabular "
        "encoder's, so there is no preprocessing record; feed the model flattened pixel rows (silofl export RUN "
        "--format onnx gives a model with that input)"
    )


def recorded_preprocessing(recorded: Sequence[Preprocessing | PreprocessingError], dataset: str) -> Preprocessing:
    """The last preprocessing of a `recording_preprocessing` block that loaded `dataset`, or the PreprocessingError
    saying why there is none."""
    if not recorded:
        if str(dataset).lower() in _image_datasets():
            raise _not_tabular(dataset)
        raise PreprocessingError(f"loading {dataset!r} recorded no preprocessing (it did not go through build_dataset)")
    last = recorded[-1]
    if isinstance(last, PreprocessingError):
        raise last
    return last


def load_preprocessing(dataset: str, **loader_kwargs: Any) -> Preprocessing:
    """Load `dataset` with `client.data.loaders.load_dataset(dataset, **loader_kwargs)` and return the preprocessing
    its encoding applied; an image dataset is refused by name, without loading it. Loading errors propagate
    (`DataError`, `FileNotFoundError`)."""
    if str(dataset).lower() in _image_datasets():
        raise _not_tabular(dataset)
    from silofl.client.data.generic import recording_preprocessing
    from silofl.client.data.loaders import load_dataset

    with recording_preprocessing() as recorded:
        load_dataset(dataset, **loader_kwargs)
    return recorded_preprocessing(recorded, dataset)


def write_preprocessing(
    out_dir: str | Path, recorded: Sequence[Preprocessing | PreprocessingError], dataset: str
) -> Path:
    """Write the preprocessing of a `recording_preprocessing` block to OUT/preprocessing.json and return its path.

    Raises the PreprocessingError saying why there is none (an image dataset, a column whose values JSON cannot hold),
    after removing an older OUT/preprocessing.json, which must not be taken for this split's."""
    path = Path(out_dir) / PREPROCESSING_FILE
    try:
        preprocessing = recorded_preprocessing(recorded, dataset)
    except PreprocessingError:
        path.unlink(missing_ok=True)
        raise
    return preprocessing.save(path)
