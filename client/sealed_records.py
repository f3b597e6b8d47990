"""The parties' record exchange (the second version of the separate parties, SECURITY.md, "`steffle` with separate
parties"): each feature party hands every sensitive party, once, the features and labels of the records whose sensitive
attribute that party holds, sealed end to end (`protocols.party_keys`), joined by pseudonym. Pure code; the messages are
in `client.rounds.steffle_parties` (parties) and `server.parties` (the relay).

1. Holdings (:func:`holdings_boxes`): sensitive party c seals to every feature party the pseudonyms of the train and
   test records it holds.
2. Records (:func:`record_boxes`): feature party j opens them, finds for each of its records the one sensitive party
   that holds it, and seals to each sensitive party c the (pseudonym, x, y) of its records c holds, with its public
   train size n_j. It returns what the server may know besides: per split, how many of its records no sensitive
   party holds, and how many two or more hold (the coverage check's counts).
3. Receipt (:func:`receive_records`): sensitive party c opens the feature parties' boxes, checks each record is one
   of its own and came once, and joins them with its groups: :class:`SealedRecords`, kept in its node state.

The server relays sealed bytes and sees their sizes, and the coverage counts: no id, pseudonym, feature or label.
A sensitive party learns the features and labels of the records whose attribute it holds (which is what rows of
(id, y, F(x_i), J_F(x_i)) gave over a run, for a linear model) and the sizes n_j; a feature party learns which of its
records each sensitive party holds, and the pseudonyms (not the ids) of the others' records.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from silofl.client.data.tabular import NonSensitiveDivision, SensitiveDivision
from silofl.client.data.topology import FeaturePartyData, SensitivePartyData
from silofl.protocols import party_keys as pk
from silofl.protocols.messages import MessageError

HOLDINGS = "holdings"
RECORDS = "records"
SPLITS = ("train", "test")

__all__ = ["HOLDINGS", "RECORDS", "SealedRecords", "holdings_boxes", "receive_records", "record_boxes"]


def _pack(arrays: Mapping[str, np.ndarray], meta: Mapping[str, object]) -> bytes:
    buffer = io.BytesIO()
    payload = dict(arrays)
    payload["meta"] = np.frombuffer(json.dumps(dict(meta), sort_keys=True).encode(), dtype=np.uint8)
    np.savez(buffer, allow_pickle=False, **payload)
    return buffer.getvalue()


def _unpack(data: bytes, names: tuple[str, ...], what: str) -> tuple[dict[str, np.ndarray], dict]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in (*names, "meta")}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (KeyError, ValueError, OSError) as exc:  # sealed by a party: corrupt only if that party misbehaves
        raise MessageError(f"{what}: the sealed payload is not what the protocol sends ({exc})") from None
    if not isinstance(meta, dict):
        raise MessageError(f"{what}: the sealed payload's metadata is not an object")
    return arrays, meta


def _keys_of(pseudonyms: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in pseudonyms]


def holdings_boxes(keys: pk.PartyKeys, party: SensitivePartyData, feature_parties: int, job: str) -> dict[str, bytes]:
    """Step 1 at sensitive party c: the pseudonyms of its train and test records, sealed to each feature party."""
    arrays = {f"{split}-pseudonyms": pk.pseudonyms(keys, getattr(party, f"{split}_ids")) for split in SPLITS}
    payload = _pack(arrays, {"party": keys.name})
    return {
        pk.feature_name(j): pk.seal(keys, pk.feature_name(j), HOLDINGS, job, payload) for j in range(feature_parties)
    }


@dataclass(frozen=True)
class Coverage:
    """Per split, how many of a feature party's records no sensitive party holds, and how many two or more hold."""

    unheld: dict[str, int]
    held_twice: dict[str, int]


def record_boxes(
    keys: pk.PartyKeys, party: FeaturePartyData, holdings: Mapping[str, bytes], job: str, evaluation: str = "exact"
) -> tuple[dict[str, bytes], Coverage]:
    """Step 2 at feature party j: for every sensitive party (`holdings` maps its name to the box it sealed to j),
    the (pseudonym, x, y) of j's records it holds, sealed to it; and j's coverage counts. `evaluation`: how j's
    policy answers evaluations ("exact" or "noised"): the sensitive parties count j's test records under it."""
    what = f"records step at {keys.name}"
    owner = {split: np.full(len(getattr(party, f"{split}_ids")), -1, dtype=np.int64) for split in SPLITS}
    times = {split: np.zeros(len(getattr(party, f"{split}_ids")), dtype=np.int64) for split in SPLITS}
    mine = {split: pk.pseudonyms(keys, getattr(party, f"{split}_ids")) for split in SPLITS}
    position = {split: {key: k for k, key in enumerate(_keys_of(mine[split]))} for split in SPLITS}
    names = sorted(holdings, key=_party_index)
    for c, name in enumerate(names):
        arrays, _ = _unpack(
            pk.open_sealed(keys, name, HOLDINGS, job, holdings[name]),
            tuple(f"{split}-pseudonyms" for split in SPLITS),
            f"{what}: holdings of {name}",
        )
        for split in SPLITS:
            held = _pseudonym_array(arrays[f"{split}-pseudonyms"], f"{what}: holdings of {name} ({split})")
            at = np.array([position[split].get(key, -1) for key in _keys_of(held)], dtype=np.int64)
            at = at[at >= 0]
            times[split][at] += 1
            owner[split][at] = c
    boxes = {}
    for c, name in enumerate(names):
        arrays = {}
        for split in SPLITS:
            data = getattr(party, split)
            picked = np.flatnonzero((owner[split] == c) & (times[split] == 1))
            arrays[f"{split}-pseudonyms"] = mine[split][picked]
            arrays[f"{split}-features"] = data.features[picked]
            arrays[f"{split}-labels"] = data.labels[picked]
        meta = {"party": keys.name, "n-train": len(party.train_ids), "evaluation": evaluation}
        boxes[name] = pk.seal(keys, name, RECORDS, job, _pack(arrays, meta))
    coverage = Coverage(
        unheld={split: int((times[split] == 0).sum()) for split in SPLITS},
        held_twice={split: int((times[split] > 1).sum()) for split in SPLITS},
    )
    return boxes, coverage


def _party_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _pseudonym_array(values: np.ndarray, what: str) -> np.ndarray:
    if values.dtype != np.uint8 or values.ndim != 2 or values.shape[1] != pk.PSEUDONYM_BYTES:
        raise MessageError(f"{what}: pseudonyms must be uint8 of shape (n, {pk.PSEUDONYM_BYTES}), got {values.shape}")
    return values


@dataclass(frozen=True)
class SealedRecords:
    """What a sensitive party received (step 3), joined with its groups: per split features, labels and groups of
    the records it holds that some feature party sent, the feature parties' train sizes n_j, and whether some
    feature party's policy answers evaluations noised (then so are the counts of the test records)."""

    train: NonSensitiveDivision
    train_groups: SensitiveDivision
    test: NonSensitiveDivision
    test_groups: SensitiveDivision
    feature_sizes: tuple[int, ...]
    noised_evaluation: bool = False

    @property
    def total_train(self) -> int:
        """n = sum of n_j: the federation's training records (public)."""
        return int(sum(self.feature_sizes))

    def sampling_rate(self, batch_size: int) -> float:
        """The rate of the party's secret Poisson sample: the silos' q = m / (n / N), the batch size over the
        feature parties' mean size (in the topology `divided`, m / n_j exactly as the silo; with one sensitive
        party, each record as likely as in its silo)."""
        return min(1.0, batch_size * len(self.feature_sizes) / max(self.total_train, 1))

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "train-features": self.train.features,
            "train-labels": self.train.labels,
            "train-groups": self.train_groups.groups,
            "test-features": self.test.features,
            "test-labels": self.test.labels,
            "test-groups": self.test_groups.groups,
            "feature-sizes": np.asarray(self.feature_sizes, dtype=np.int64),
            "noised-evaluation": np.asarray([self.noised_evaluation], dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> SealedRecords:
        return cls(
            NonSensitiveDivision(arrays["train-features"], arrays["train-labels"]),
            SensitiveDivision(arrays["train-groups"]),
            NonSensitiveDivision(arrays["test-features"], arrays["test-labels"]),
            SensitiveDivision(arrays["test-groups"]),
            tuple(int(v) for v in arrays["feature-sizes"]),
            bool(arrays["noised-evaluation"][0]),
        )


def receive_records(
    keys: pk.PartyKeys, party: SensitivePartyData, boxes: Mapping[str, bytes], feature_parties: int, job: str
) -> SealedRecords:
    """Step 3 at sensitive party c: the records every feature party sealed to it, each checked to be one c holds
    and to come once, joined with c's groups (in the order received)."""
    what = f"records received by {keys.name}"
    expected = [pk.feature_name(j) for j in range(feature_parties)]
    if sorted(boxes, key=_party_index) != expected:
        raise MessageError(
            f"{what}: expected one sealed message from each of {', '.join(expected)}, got {sorted(boxes)}"
        )
    info = party.info
    own = {split: pk.pseudonyms(keys, getattr(party, f"{split}_ids")) for split in SPLITS}
    position = {split: {key: k for k, key in enumerate(_keys_of(own[split]))} for split in SPLITS}
    seen = {split: np.zeros(len(own[split]), dtype=bool) for split in SPLITS}
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {split: [] for split in SPLITS}
    sizes = []
    noised = False
    names = tuple(f"{split}-{column}" for split in SPLITS for column in ("pseudonyms", "features", "labels"))
    for name in expected:
        arrays, meta = _unpack(pk.open_sealed(keys, name, RECORDS, job, boxes[name]), names, f"{what} from {name}")
        n_train = meta.get("n-train")
        if not isinstance(n_train, int) or n_train < 1:
            raise MessageError(f"{what} from {name}: 'n-train' must be the feature party's train size (>= 1)")
        sizes.append(n_train)
        if meta.get("evaluation") not in ("exact", "noised"):
            raise MessageError(f"{what} from {name}: 'evaluation' must be 'exact' or 'noised'")
        noised = noised or meta["evaluation"] == "noised"
        for split in SPLITS:
            where = f"{what} from {name} ({split})"
            pseudonyms = _pseudonym_array(arrays[f"{split}-pseudonyms"], where)
            features, labels = arrays[f"{split}-features"], arrays[f"{split}-labels"]
            n = len(pseudonyms)
            if features.dtype != np.float32 or features.shape != (n, info.num_features):
                raise MessageError(
                    f"{where}: features must be float32 ({n}, {info.num_features}), got {features.shape}"
                )
            if labels.dtype != np.int64 or labels.shape != (n,):
                raise MessageError(f"{where}: labels must be int64 ({n},), got {labels.dtype} {labels.shape}")
            if n and not np.isfinite(features).all():
                raise MessageError(f"{where}: features must be finite")
            if n and (int(labels.min()) < 0 or int(labels.max()) >= info.num_labels):
                raise MessageError(f"{where}: labels must be in 0..{info.num_labels - 1}")
            at = np.array([position[split].get(key, -1) for key in _keys_of(pseudonyms)], dtype=np.int64)
            if (at < 0).any():
                raise MessageError(
                    f"{where}: {int((at < 0).sum())} records whose sensitive attribute this party does not hold; a "
                    "feature party sends each sensitive party only the records that party holds"
                )
            if np.unique(at).size != at.size or seen[split][at].any():
                raise MessageError(f"{where}: a record arrived twice; each record comes from one feature party once")
            seen[split][at] = True
            groups = getattr(party, f"{split}_groups")[at]
            parts[split].append((features, labels, groups))

    def joined(split: str) -> tuple[NonSensitiveDivision, SensitiveDivision]:
        chunks = parts[split]
        features = np.concatenate([f for f, _, _ in chunks]) if chunks else np.zeros((0, info.num_features), np.float32)
        labels = np.concatenate([y for _, y, _ in chunks]).astype(np.int64)
        groups = np.concatenate([s for _, _, s in chunks]).astype(np.int64)
        return NonSensitiveDivision(np.ascontiguousarray(features), labels), SensitiveDivision(groups)

    train, train_groups = joined("train")
    test, test_groups = joined("test")
    return SealedRecords(train, train_groups, test, test_groups, tuple(sizes), noised)
