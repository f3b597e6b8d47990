"""Split a dataset's records among silos: iid, by attribute (SteFFLe Algorithm 3), by label skew, or Dirichlet.

`partition_indices` returns disjoint, sorted int64 index arrays; `partition_dataset` applies it to the train and the
test split of a `TabularDataset` so that every silo also has a local test split.

Methods:

* ``iid``: a uniformly random permutation cut into `num_silos` parts whose sizes differ by at most one. Written
  here rather than with flwr-datasets' IidPartitioner, which cuts the rows into contiguous shards without shuffling.
* ``attribute``: Algorithm 3 of the SteFFLe paper (Appendix E.2.3), lines cited
  in `_attribute_partition`. Heterogeneity h in [0, 1]: h = 0 is iid, h = 1 gives each silo one block of the sorted
  attribute (age). Numpy, because flwr-datasets has no partitioner for it.
* ``classes``: label skew, flwr-datasets' PathologicalPartitioner ("first-deterministic" class assignment, the
  original paper's mode, which uses every class once num_silos >= number of classes).
* ``dirichlet``: flwr-datasets' DirichletPartitioner over the labels with concentration `dirichlet_alpha`.

Deviation from the paper's Algorithm 3: the paper gives every silo floor(n/K) records and leaves the n mod K
remaining records out of line 14's count; here those records are dealt one each to randomly chosen silos, so the
partition covers every record and the sizes differ by at most one.

Test splits: iid and attribute partition the test split the same way as the train split (with its own sort key).
For the label-based methods, the test records of each label are shared among silos in proportion to how the
training records of that label were shared, so a silo's local test set has the same label mix as its training set
(an independent Dirichlet draw for the test split would give it an unrelated mix and make local test metrics
meaningless).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from silofl.client.data.tabular import DataError, SiloData, TabularDataset

__all__ = ["PARTITIONS", "partition_dataset", "partition_indices"]

PARTITIONS = ("iid", "attribute", "classes", "dirichlet")

#: Flower's default minimum partition size for the Dirichlet partitioner (capped at n // num_silos for small data).
_DIRICHLET_MIN_PARTITION = 10


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_vector(value: np.ndarray | None, n: int, name: str, method: str, integer: bool) -> np.ndarray:
    if value is None:
        raise DataError(
            f"method={method!r} needs {name} (one value per record); "
            f"{'this dataset has no sort key (age)' if name == 'sort_key' else 'pass the labels'}"
        )
    arr = np.asarray(value)
    if arr.shape != (n,):
        raise DataError(f"{name} must have shape ({n},), got {arr.shape}")
    if integer and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{name} must be integer class indices, got dtype {arr.dtype}")
    if not integer and (not np.issubdtype(arr.dtype, np.number) or not np.isfinite(arr).all()):
        raise DataError(f"{name} must be finite numbers, got dtype {arr.dtype}")
    return arr


def _iid_partition(n: int, num_silos: int, rng: np.random.Generator) -> list[np.ndarray]:
    return list(np.array_split(rng.permutation(n), num_silos))


def _attribute_partition(sort_key: np.ndarray, num_silos: int, h: float, rng: np.random.Generator) -> list[np.ndarray]:
    """SteFFLe Algorithm 3 ("Modelling Heterogeneity Levels in Silo Data"), with K = num_silos."""
    n = sort_key.shape[0]
    # Line 3: sort by the attribute and cut into K equal blocks (ties broken at random, not by record order).
    order = np.lexsort((rng.permutation(n), sort_key))
    blocks = np.array_split(order, num_silos)
    # Line 8: m_k = floor(n/K * h) records from block k (the 1e-9 guards float error, e.g. 0.29 * 100).
    m = math.floor(h * (n // num_silos) + 1e-9)
    taken = np.zeros(n, dtype=bool)
    silos: list[list[np.ndarray]] = []
    for block in blocks:  # lines 6-11
        picked = rng.choice(block, size=m, replace=False)
        taken[picked] = True  # line 9: mark as used
        silos.append([picked])
    # Lines 12-18: fill silo k up to its quota from the unused records, uniformly at random. Quotas are n/K rounded
    # so that they sum to n (the extra n mod K records go to random silos; see the module docstring).
    quotas = np.full(num_silos, n // num_silos)
    quotas[rng.choice(num_silos, size=n % num_silos, replace=False)] += 1
    rest = rng.permutation(np.flatnonzero(~taken))
    start = 0
    for k in range(num_silos):
        need = int(quotas[k]) - m
        silos[k].append(rest[start : start + need])
        start += need
    return [np.concatenate(parts) for parts in silos]


def _flwr_partition(
    labels: np.ndarray,
    num_silos: int,
    method: str,
    seed: int,
    classes_per_silo: int,
    dirichlet_alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Label-based partitions via flwr-datasets (imported here: importing it takes about two seconds)."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, PathologicalPartitioner

    # The partitioners split each label's records in row order; shuffle first so the pieces are random.
    perm = rng.permutation(labels.shape[0])
    table = Dataset.from_dict({"label": labels[perm].tolist(), "row": perm.tolist()})
    if method == "classes":
        partitioner = PathologicalPartitioner(
            num_partitions=num_silos,
            partition_by="label",
            num_classes_per_partition=classes_per_silo,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    else:
        min_size = max(1, min(_DIRICHLET_MIN_PARTITION, labels.shape[0] // num_silos))
        partitioner = DirichletPartitioner(
            num_partitions=num_silos,
            partition_by="label",
            alpha=dirichlet_alpha,
            min_partition_size=min_size,
            self_balancing=False,
            seed=seed,
        )
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # retries and unused classes are reported below instead
            parts = [np.asarray(partitioner.load_partition(k)["row"], dtype=np.int64) for k in range(num_silos)]
    except ValueError as exc:
        knob = "classes_per_silo" if method == "classes" else "dirichlet_alpha"
        raise DataError(
            f"method={method!r} cannot partition {labels.shape[0]} records into {num_silos} silos "
            f"with {knob}={classes_per_silo if method == 'classes' else dirichlet_alpha}: {exc}"
        ) from exc
    assigned = sum(p.size for p in parts)
    if assigned != labels.shape[0]:
        raise DataError(
            f"method='classes' with classes_per_silo={classes_per_silo} and num_silos={num_silos} "
            f"leaves {labels.shape[0] - assigned} records (of labels held by no silo) unassigned; "
            "raise classes_per_silo or num_silos"
        )
    return parts


def partition_indices(
    n: int,
    num_silos: int,
    *,
    method: str = "iid",
    seed: int = 0,
    labels: np.ndarray | None = None,
    sort_key: np.ndarray | None = None,
    heterogeneity: float = 0.0,
    classes_per_silo: int = 2,
    dirichlet_alpha: float = 0.5,
) -> list[np.ndarray]:
    """Disjoint, sorted int64 index arrays, one per silo, covering range(n); deterministic given `seed`.

    labels: needed by 'classes' and 'dirichlet'. sort_key: needed by 'attribute'. heterogeneity: Algorithm 3's h,
    only for 'attribute'. classes_per_silo / dirichlet_alpha: only read by their method.
    """
    n = _check_int(n, "n", 0)
    num_silos = _check_int(num_silos, "num_silos", 1)
    if method not in PARTITIONS:
        raise DataError(f"unknown partition method {method!r}; use one of {', '.join(PARTITIONS)}")
    if not 0.0 <= float(heterogeneity) <= 1.0:
        raise DataError(f"heterogeneity must be in [0, 1], got {heterogeneity}")
    if heterogeneity and method != "attribute":
        raise DataError(
            f"heterogeneity={heterogeneity} only applies to method='attribute' (Algorithm 3); "
            f"method={method!r} would ignore it"
        )
    if n < num_silos:
        raise DataError(f"{n} records are not enough for num_silos={num_silos}: every silo needs at least one")
    rng = np.random.default_rng(seed)

    if method == "iid":
        parts = _iid_partition(n, num_silos, rng)
    elif method == "attribute":
        key = _check_vector(sort_key, n, "sort_key", method, integer=False)
        parts = _attribute_partition(key, num_silos, float(heterogeneity), rng)
    else:
        y = _check_vector(labels, n, "labels", method, integer=True)
        if method == "classes":
            _check_int(classes_per_silo, "classes_per_silo", 1)
        elif not (np.isfinite(dirichlet_alpha) and dirichlet_alpha > 0):
            raise DataError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        parts = _flwr_partition(y, num_silos, method, seed, classes_per_silo, float(dirichlet_alpha), rng)
    return [np.sort(p).astype(np.int64) for p in parts]


def _mirror_label_partition(
    train_parts: list[np.ndarray], train_labels: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Share each label's test records among silos in proportion to that label's training records per silo."""
    num_silos = len(train_parts)
    out: list[list[np.ndarray]] = [[] for _ in range(num_silos)]
    for label in np.unique(test_labels):
        rows = rng.permutation(np.flatnonzero(test_labels == label))
        weights = np.array([np.count_nonzero(train_labels[p] == label) for p in train_parts], dtype=np.float64)
        if weights.sum() == 0:
            weights[:] = 1.0  # a label absent from training: spread its test records evenly
        exact = weights / weights.sum() * rows.size
        counts = np.floor(exact).astype(np.int64)
        # Largest remainder, ties at random, so that the counts sum to the number of rows.
        short = rows.size - counts.sum()
        order = np.lexsort((rng.random(num_silos), -(exact - counts)))
        counts[order[:short]] += 1
        for k, piece in enumerate(np.split(rows, np.cumsum(counts)[:-1])):
            out[k].append(piece)
    return [np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64) for parts in out]


def partition_dataset_indices(
    ds: TabularDataset,
    num_silos: int,
    *,
    method: str = "iid",
    seed: int = 0,
    heterogeneity: float = 0.0,
    classes_per_silo: int = 2,
    dirichlet_alpha: float = 0.5,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per silo, (train positions, test positions) in `ds`: what :func:`partition_dataset` deals (see the module
    docstring). Raises DataError if a silo would end up with no train or test record."""
    kwargs = {
        "method": method,
        "seed": seed,
        "heterogeneity": heterogeneity,
        "classes_per_silo": classes_per_silo,
        "dirichlet_alpha": dirichlet_alpha,
    }
    train_labels = ds.train.nonsensitive.labels
    test_labels = ds.test.nonsensitive.labels
    train_parts = partition_indices(len(ds.train), num_silos, labels=train_labels, sort_key=ds.train_sort_key, **kwargs)
    if method in ("classes", "dirichlet"):
        test_parts = _mirror_label_partition(train_parts, train_labels, test_labels, np.random.default_rng([seed, 1]))
    else:
        test_parts = partition_indices(len(ds.test), num_silos, labels=test_labels, sort_key=ds.test_sort_key, **kwargs)
    for k, (tr, te) in enumerate(zip(train_parts, test_parts, strict=True)):
        if tr.size == 0 or te.size == 0:
            raise DataError(
                f"silo {k} would get {tr.size} train and {te.size} test records with method={method!r}; "
                "use fewer silos, a larger dataset or test_fraction, or a milder skew"
            )
    return list(zip(train_parts, test_parts, strict=True))


def partition_dataset(
    ds: TabularDataset,
    num_silos: int,
    *,
    method: str = "iid",
    seed: int = 0,
    heterogeneity: float = 0.0,
    classes_per_silo: int = 2,
    dirichlet_alpha: float = 0.5,
) -> list[SiloData]:
    """One `SiloData` per silo, with the train AND the test split partitioned (see the module docstring).

    Labels and the sort key come from `ds`. Raises DataError if a silo would end up with no train or test record.
    """
    parts = partition_dataset_indices(
        ds,
        num_silos,
        method=method,
        seed=seed,
        heterogeneity=heterogeneity,
        classes_per_silo=classes_per_silo,
        dirichlet_alpha=dirichlet_alpha,
    )
    return [
        SiloData(info=ds.info, silo_id=k, num_silos=num_silos, train=ds.train.subset(tr), test=ds.test.subset(te))
        for k, (tr, te) in enumerate(parts)
    ]
