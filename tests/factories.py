"""Small factories shared by the tests: objects several test modules build the same way, with their defaults.

Import them as `from tests.factories import ...`.
"""

from __future__ import annotations

from typing import Any

from silofl.protocols import messages as msg


def silo_info(silo_id: int, n_train: int, **fields: Any) -> msg.SiloInfo:
    """The SiloInfo a silo of a small synthetic federation reports at setup: silo `silo_id` with `n_train` training
    records, role "silo", dataset "t", 2 features, 2 labels ("0", "1"), 2 groups ("a", "b"), 4 test records,
    schema hash "abc", exact evaluation; `fields` override any of these."""
    values: dict[str, Any] = {
        "silo_id": silo_id,
        "role": "silo",
        "dataset": "t",
        "num_features": 2,
        "num_labels": 2,
        "num_groups": 2,
        "n_train": n_train,
        "n_test": 4,
        "schema_hash": "abc",
        "label_names": ("0", "1"),
        "group_names": ("a", "b"),
        "evaluation": "exact",
    } | fields
    return msg.SiloInfo(**values)
