"""Preprocessing as data: how a raw table row becomes the model's input, its label and its sensitive group.

`client.data.generic.build_dataset` encodes a table (categorical feature columns one-hot over the whole table's
vocabulary, continuous ones z-scored with the TRAINING split's mean and standard deviation, the target mapped to class
indices, the sensitive columns combined into one joint group) and records what it did as a :class:`Preprocessing`
(`client.data.generic.recording_preprocessing`). This module holds that record and applies it to new rows:
:meth:`Preprocessing.encode` reproduces the training encoding bit for bit on the training table (tested), so a model
trained by silofl can be used on raw records (`silofl predict | evaluate`, :mod:`server.trained_model`).

Why plain data and not a pickled encoder: the record is read by the CLI and the server side (a run's model artifact,
`server.model_artifact`) without importing silo code, it is reviewable JSON (`to_json` / `from_json`, never pickle),
and the same file serves simulation (written by `silofl run`) and deployment (written by `silofl data split` next to
the silo folders, for `silofl model pack`).

A built-in dataset's reader recodes its file before the encoder sees it (credit's SEX 1/2 read as Male/Female, its
undocumented EDUCATION codes merged, ...): that is data too, a :class:`Recoding` (columns dropped, per column a value
map) that the reader applies (`client.data.loaders`) and the record carries (`recoding`), so `encode` takes a raw row
of the original file as well as a row the reader cleaned: applied to rows already recoded, a recoding changes
nothing. A file dataset (CSV/Parquet) has none: its record is the one written before recodings existed.

Privacy: the vocabularies and the z-score statistics are computed from the records, with no noise. They are NOT
differentially private and are never sent to the server: whoever holds a preprocessing file learns every category
present in the table (a category held by one record included) and the training split's means and standard deviations.

Decisions when encoding new rows (each refusal is a :class:`PreprocessingError` naming the column and the fix):

* a missing column, a missing value (NaN/None) in a used column, a non-numeric or non-finite value in a continuous
  column: refused (silofl never imputes; the training data had none either);
* an unseen category of a feature column: refused by default (``unseen="error"``): the model never saw the input such
  a row would get, so a silent prediction could be anything. ``unseen="zeros"`` encodes it as an all-zeros one-hot
  block (the row gets no weight from that column) and warns, naming the column, the values and the number of rows;
* an unseen label value or sensitive category: always refused (a metric over a label or a group the run does not know
  is undefined);
* values are matched to the recorded categories by value first (``2 == 2.0``), then by their text form (a category
  ``3`` recorded from an integer column matches a ``"3"`` read as text), so a file whose column pandas reads with
  another type still encodes; the text form is the one used in feature names (``2.0`` reads ``2``).

One module a job; the names below are re-exported here (`from silofl.protocols.preprocessing import Preprocessing`):

* `values`: :class:`PreprocessingError`, ``Scalar`` (a category as JSON keeps it), the text form and order of
  categories (`category_text`, `sorted_categories`) and the field checks the records share.
* `table`: reading a table's columns as the encoder does (missing columns and values refused, values matched to the
  recorded categories, continuous columns read as numbers).
* `columns`: the column records, `CategoricalFeature`, `ContinuousFeature` (`FeatureColumn`), `LabelMapping`,
  `SensitiveColumn`, with `joint_group_names` and `group_vocabulary`.
* `recoding`: a built-in reader's recoding, `Recoding` and its `ValueMap` per column.
* `record`: the record, `Preprocessing` (its JSON document, `FORMAT` / `FORMAT_VERSION`, and its encoding of raw rows
  into an `EncodedFrame`; ``Unseen``).
"""

from silofl.protocols.preprocessing.columns import (
    CategoricalFeature,
    ContinuousFeature,
    FeatureColumn,
    LabelMapping,
    SensitiveColumn,
    group_vocabulary,
    joint_group_names,
)
from silofl.protocols.preprocessing.recoding import Recoding, ValueMap
from silofl.protocols.preprocessing.record import FORMAT, FORMAT_VERSION, EncodedFrame, Preprocessing
from silofl.protocols.preprocessing.record import RECODING_FORMAT_VERSION as RECODING_FORMAT_VERSION
from silofl.protocols.preprocessing.record import Unseen as Unseen
from silofl.protocols.preprocessing.values import PreprocessingError, category_text, sorted_categories
from silofl.protocols.preprocessing.values import Scalar as Scalar

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "CategoricalFeature",
    "ContinuousFeature",
    "EncodedFrame",
    "FeatureColumn",
    "LabelMapping",
    "Preprocessing",
    "PreprocessingError",
    "Recoding",
    "SensitiveColumn",
    "ValueMap",
    "category_text",
    "group_vocabulary",
    "joint_group_names",
    "sorted_categories",
]
