"""Which records a silo holds, for each way silofl runs.

* Deployed silo: its node config has `data-path`, a folder written by `silofl data split` (or by the site itself);
  it is reloaded on every message (a deployed ClientApp is a fresh process per message), so it must load in
  milliseconds: prepared arrays, no CSV parsing.
* Simulated silo (in-process engine, Ray simulation, `flwr run .` on a simulation federation): its node config has
  `partition-id`; the server's setup message names the dataset and the partitioning, and the silo derives its own
  partition. The partitioned dataset is cached per process, so the silos of one process share one load.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
from flwr.app import Context

from client.data.tabular import DatasetInfo, SiloData
from protocols.messages import DataSpec, MessageError, SiloInfo

DATA_PATH_KEY = "data-path"
PARTITION_ID_KEY = "partition-id"


def is_deployed(context: Context) -> bool:
    """A silo with its own data folder (as opposed to a simulated partition of a shared dataset)."""
    return DATA_PATH_KEY in context.node_config


def load_silo_data(context: Context, spec: DataSpec) -> SiloData:
    """The records of this silo: its own folder when deployed, else its partition of `spec`."""
    if is_deployed(context):
        from client.data.silo_store import load_silo

        return load_silo(Path(str(context.node_config[DATA_PATH_KEY])))
    if PARTITION_ID_KEY not in context.node_config:
        raise MessageError(
            "this silo has neither 'data-path' (a folder from `silofl data split`) nor 'partition-id' in its node "
            "config; start it with --node-config \"data-path='/path/to/silo_0'\""
        )
    partition_id = int(context.node_config[PARTITION_ID_KEY])
    simulated = context.node_config.get("num-partitions")
    if simulated is not None and int(simulated) != spec.num_silos:
        raise MessageError(
            f"this simulated federation has {simulated} SuperNodes but the run asks for num-silos={spec.num_silos}; "
            f"run with num-silos={simulated} or resize the federation (`flwr federation simulation-config ... "
            f"--num-supernodes {spec.num_silos}`)"
        )
    silos = _partitioned(spec)
    if not 0 <= partition_id < len(silos):
        raise MessageError(f"partition-id {partition_id} is outside the {len(silos)} silos of this run")
    return silos[partition_id]


@lru_cache(maxsize=4)
def _partitioned(spec: DataSpec) -> tuple[SiloData, ...]:
    from client.data.federate import load_federation

    _, silos = load_federation(
        spec.dataset,
        spec.num_silos,
        data_dir=spec.data_dir or None,
        seed=spec.seed,
        target=spec.target or None,
        sensitive=[c for c in spec.sensitive.split(",") if c] or None,
        features=[c for c in spec.features.split(",") if c] or None,
        partition=spec.partition,
        heterogeneity=spec.heterogeneity,
        classes_per_silo=spec.classes_per_silo,
        dirichlet_alpha=spec.dirichlet_alpha,
    )
    if spec.max_train_records:
        silos = [_capped(silo, spec.max_train_records, spec.seed) for silo in silos]
    return tuple(silos)


def _capped(silo: SiloData, cap: int, seed: int) -> SiloData:
    """The silo with at most `cap` training records: a seeded uniform subsample, kept in the original order."""
    if len(silo.train) <= cap:
        return silo
    rng = np.random.default_rng([seed, silo.silo_id, 0x5EED])
    keep = np.sort(rng.choice(len(silo.train), size=cap, replace=False))
    return dataclasses.replace(silo, train=silo.train.subset(keep))


def schema_hash(info: DatasetInfo) -> str:
    """Fingerprint of the feature, label and group names: silos of one federation must agree on all three."""
    text = "\x1f".join(
        [
            "|".join(info.feature_names),
            "|".join(info.label_names),
            "|".join(info.sensitive_columns),
            "|".join(info.group_names),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe(silo: SiloData) -> SiloInfo:
    """The public description a silo sends in the setup round."""
    info = silo.info
    return SiloInfo(
        silo_id=silo.silo_id,
        dataset=info.name,
        num_features=info.num_features,
        num_labels=info.num_labels,
        num_groups=info.num_groups,
        n_train=len(silo.train),
        n_test=len(silo.test),
        schema_hash=schema_hash(info),
        label_names=tuple(info.label_names),
        group_names=tuple(info.group_names),
    )
