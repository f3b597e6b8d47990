"""Which records a silo holds, for each way silofl runs.

* Deployed silo: its node config has `data-path`, a folder written by `silofl data split` (or by the site itself),
  prepared arrays that load in milliseconds (no CSV parsing). It is loaded once per process and kept while its files
  are unchanged (:func:`_load_folder`): silofl's long-lived ClientApp process (client/supernode_runtime.py) answers
  every message of a run from one load (7.5 ms saved per message on an Adult silo); a fresh process per message
  (`--runtime per-message|flower`) loads it each time.
* Simulated silo (in-process engine, Ray simulation, `flwr run .` on a simulation federation): its node config has
  `partition-id`; the server's setup message names the dataset and the partitioning, and the silo derives its own
  partition. The partitioned dataset is cached per process, so the silos of one process share one load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context

from silofl.client.data.tabular import DatasetInfo, SiloData
from silofl.protocols.messages import DataSpec, MessageError, SiloInfo

DATA_PATH_KEY = "data-path"
PARTITION_ID_KEY = "partition-id"


def is_deployed(context: Context) -> bool:
    """A silo with its own data folder (as opposed to a simulated partition of a shared dataset)."""
    return DATA_PATH_KEY in context.node_config


def load_silo_data(context: Context, spec: DataSpec) -> SiloData:
    """The records of this silo: its own folder when deployed, else its partition of `spec`."""
    if is_deployed(context):
        return _load_folder(str(context.node_config[DATA_PATH_KEY]), "silo")
    partition_id = _simulated_partition(context, spec)
    silos = _partitioned(spec)
    if not 0 <= partition_id < len(silos):
        raise MessageError(f"partition-id {partition_id} is outside the {len(silos)} silos of this run")
    return silos[partition_id]


def _load_folder(path: str, role: str) -> Any:
    """A deployed node's folder (a silo's for role ``silo``, else a party's), from this process's cache while none of
    its files changed (name, size, modification time), so that a folder rewritten by `silofl data split
    --overwrite` is read again. The arrays are shared by every message, as a simulated partition's are (silofl never
    writes into a node's records)."""
    folder = Path(path)
    try:
        stamp = tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(folder)))
    except OSError:
        stamp = ()  # the loader names what is missing
    return _load_folder_cached(str(folder.resolve()), role, stamp)


@lru_cache(maxsize=4)
def _load_folder_cached(path: str, role: str, stamp: tuple) -> Any:
    del stamp  # part of the cache key only
    if role == "silo":
        from silofl.client.data.silo_store import load_silo

        return load_silo(Path(path))
    from silofl.client.data.party_store import load_party

    return load_party(Path(path), role=role)


def _simulated_partition(context: Context, spec: DataSpec) -> int:
    if PARTITION_ID_KEY not in context.node_config:
        raise MessageError(
            "this node has neither 'data-path' (a folder from `silofl data split`) nor 'partition-id' in its node "
            "config; start it with --node-config \"data-path='/path/to/silo_0'\""
        )
    nodes = spec.num_silos + spec.sensitive_parties
    simulated = context.node_config.get("num-partitions")
    if simulated is not None and int(simulated) != nodes:
        what = f"num-silos={spec.num_silos}" + (
            f" and {spec.sensitive_parties} sensitive parties (topology {spec.topology})"
            if spec.sensitive_parties
            else ""
        )
        fix = f"run with num-silos={simulated}" if not spec.sensitive_parties else "run with that many"
        raise MessageError(
            f"this simulated federation has {simulated} SuperNodes but the run asks for {what}, {nodes} nodes; "
            f"{fix} or resize the federation (`flwr federation simulation-config ... --num-supernodes {nodes}`)"
        )
    return int(context.node_config[PARTITION_ID_KEY])


def node_role(context: Context, spec: DataSpec) -> tuple[str, int | None]:
    """(role, party id) of this node: its node config's `role` when deployed (the party id is in its data), else
    derived from its partition-id and the run's topology (`protocols.parties.simulated_role`)."""
    from silofl.protocols.parties import ROLE_KEY, ROLES, SILO, simulated_role

    if is_deployed(context) or ROLE_KEY in context.node_config:
        role = str(context.node_config.get(ROLE_KEY, SILO))
        if role not in ROLES:
            raise MessageError(f"node config '{ROLE_KEY}' = {role!r}; choose one of {', '.join(ROLES)}")
        return role, None
    return simulated_role(_simulated_partition(context, spec), spec.num_silos, spec.sensitive_parties)


def load_party_data(context: Context, spec: DataSpec, role: str, party_id: int | None):
    """The records of a feature or sensitive party (`client.data.topology`): its own folder when deployed, else its
    share of the dataset split by the run's topology."""
    if is_deployed(context):
        return _load_folder(str(context.node_config[DATA_PATH_KEY]), role)
    if spec.topology == "silos":
        raise MessageError(
            f"this simulated node has role {role!r} but the run's topology is 'silos'; give the run a topology with "
            "separate parties (divided, central-sensitive, general)"
        )
    features, sensitive = _parties(spec)
    return (features if role == "features" else sensitive)[party_id]


@lru_cache(maxsize=4)
def _parties(spec: DataSpec) -> tuple[tuple, tuple]:
    from silofl.client.data.loaders import load_dataset
    from silofl.client.data.topology import split_parties

    features, sensitive = split_parties(
        load_dataset(spec.dataset, **_source(spec)),
        spec.topology,
        feature_parties=spec.num_silos,
        sensitive_parties=spec.sensitive_parties,
        seed=spec.seed,
        sensitive_by=spec.sensitive_by,
        **_split(spec),
    )
    if spec.max_train_records:
        features = [_capped_party(party, spec.max_train_records, spec.seed) for party in features]
    return tuple(features), tuple(sensitive)


def _capped_party(party, cap: int, seed: int):
    """A feature party capped as :func:`_capped` caps the silo of the same id (the same records, in order)."""
    if len(party.train_ids) <= cap:
        return party
    keep = _cap_index(len(party.train_ids), cap, seed, party.party_id)
    from silofl.client.data.tabular import NonSensitiveDivision

    train = NonSensitiveDivision(party.train.features[keep], party.train.labels[keep])
    return dataclasses.replace(party, train_ids=party.train_ids[keep], train=train)


def _cap_index(n: int, cap: int, seed: int, silo_id: int) -> np.ndarray:
    rng = np.random.default_rng([seed, silo_id, 0x5EED])
    return np.sort(rng.choice(n, size=cap, replace=False))


def _source(spec: DataSpec) -> dict[str, Any]:
    """The dataset loader's arguments of a data spec (the same records for silos and parties)."""
    return {
        "data_dir": spec.data_dir or None,
        "seed": spec.seed,
        "target": spec.target or None,
        "sensitive": [c for c in spec.sensitive.split(",") if c] or None,
        "features": [c for c in spec.features.split(",") if c] or None,
        "missing": spec.missing,
        "csv_sep": spec.csv_sep,
        "csv_encoding": spec.csv_encoding,
    }


def _split(spec: DataSpec) -> dict[str, Any]:
    """The silo split's arguments of a data spec (the feature parties are split as silos are)."""
    return {
        "partition": spec.partition,
        "heterogeneity": spec.heterogeneity,
        "classes_per_silo": spec.classes_per_silo,
        "dirichlet_alpha": spec.dirichlet_alpha,
    }


@lru_cache(maxsize=4)
def _partitioned(spec: DataSpec) -> tuple[SiloData, ...]:
    from silofl.client.data.federate import load_federation

    _, silos = load_federation(spec.dataset, spec.num_silos, **_source(spec), **_split(spec))
    if spec.max_train_records:
        silos = [_capped(silo, spec.max_train_records, spec.seed) for silo in silos]
    return tuple(silos)


def _capped(silo: SiloData, cap: int, seed: int) -> SiloData:
    """The silo with at most `cap` training records: a seeded uniform subsample, kept in the original order."""
    if len(silo.train) <= cap:
        return silo
    keep = _cap_index(len(silo.train), cap, seed, silo.silo_id)
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


def describe(silo: SiloData, evaluation: str = "exact") -> SiloInfo:
    """The public description a silo sends in the setup round; `evaluation`: how its policy answers evaluations."""
    return _description(silo.info, silo.silo_id, "silo", len(silo.train), len(silo.test), evaluation)


def describe_party(party, role: str, evaluation: str = "exact") -> SiloInfo:
    """The public description a feature or sensitive party sends in the setup round (its id among its role's)."""
    return _description(party.info, party.party_id, role, len(party.train_ids), len(party.test_ids), evaluation)


def _description(info: DatasetInfo, node_id: int, role: str, n_train: int, n_test: int, evaluation: str) -> SiloInfo:
    return SiloInfo(
        silo_id=node_id,
        role=role,
        dataset=info.name,
        num_features=info.num_features,
        num_labels=info.num_labels,
        num_groups=info.num_groups,
        n_train=n_train,
        n_test=n_test,
        schema_hash=schema_hash(info),
        label_names=tuple(info.label_names),
        group_names=tuple(info.group_names),
        evaluation=evaluation,
    )
