"""Run options, declared once, in groups that algorithms compose.

Each group is a pydantic model of run-config keys (field `lam` is the key `lambda`, `batch_size` is `batch-size`). An
algorithm's registry entry (:mod:`protocols.algorithms`) lists the groups it reads and the defaults that suit it; from
that one declaration silofl derives the algorithm's run configuration (:class:`protocols.config.RunConfig`
subclass), its `silofl run ALG` flags, its keys in `flwr run --run-config` and sweep files, and the train instruction
its silos receive (the fields marked :data:`SILO`).

:class:`CommonOptions` are every algorithm's: where the data is and how it is split across silos, how long the run is,
the seed, evaluation and fault handling.

The groups live in this package one job a module; import them from here (this module only re-exports them):

* :mod:`~protocols.options.base`: :class:`OptionGroup`, :data:`SILO`, :func:`is_silo_field`;
* :mod:`~protocols.options.common`: :class:`CommonOptions` (data, run length, run control), the built-in datasets;
* :mod:`~protocols.options.training`: model, device, SGD, learning-rate decay, local epochs;
* :mod:`~protocols.options.privacy`: privacy target, clipping, minibatch sampling, what the noise protects;
* :mod:`~protocols.options.fairness`: fairness notion, group report, topology, ERMI, dual, loss variance;
* :mod:`~protocols.options.single_pass`: DP-mu2-FL's single pass;
* :mod:`~protocols.options.self_supervised`: FedSC's self-supervised learning and DP-CalR.
"""

from __future__ import annotations

from silofl.protocols.options.base import SILO, OptionGroup, is_silo_field
from silofl.protocols.options.common import (
    BUILTIN_DATASETS,
    TABULAR_BUILTINS,
    CommonOptions,
    DataOptions,
    Partition,
    RunControlOptions,
    RunLengthOptions,
    csv_encoding,
    csv_separator,
)
from silofl.protocols.options.fairness import (
    DualOptions,
    ErmiOptions,
    FairnessOptions,
    GroupReportOptions,
    LossFairnessOptions,
    Topology,
    TopologyOptions,
)
from silofl.protocols.options.privacy import ClipOptions, PrivacyOptions, Protect, ProtectOptions, SamplingOptions
from silofl.protocols.options.self_supervised import CalrOptions, SslModelName, SslOptions
from silofl.protocols.options.single_pass import SinglePassOptions
from silofl.protocols.options.training import (
    DeviceOptions,
    LocalEpochsOptions,
    LrDecayOptions,
    SgdOptions,
    TabularModelName,
    TabularModelOptions,
)

__all__ = [
    "BUILTIN_DATASETS",
    "SILO",
    "TABULAR_BUILTINS",
    "CalrOptions",
    "ClipOptions",
    "CommonOptions",
    "DataOptions",
    "DeviceOptions",
    "DualOptions",
    "ErmiOptions",
    "FairnessOptions",
    "GroupReportOptions",
    "LocalEpochsOptions",
    "LossFairnessOptions",
    "LrDecayOptions",
    "OptionGroup",
    "Partition",
    "PrivacyOptions",
    "Protect",
    "ProtectOptions",
    "RunControlOptions",
    "RunLengthOptions",
    "SamplingOptions",
    "SgdOptions",
    "SinglePassOptions",
    "SslModelName",
    "SslOptions",
    "TabularModelName",
    "TabularModelOptions",
    "Topology",
    "TopologyOptions",
    "csv_encoding",
    "csv_separator",
    "is_silo_field",
]
