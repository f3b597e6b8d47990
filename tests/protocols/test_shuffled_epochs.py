"""protocols.shuffled_epochs: the shuffled-epoch sampler (every record once per epoch, the last batch smaller, the
same batches from the same seed in any process) and the epochs it is accounted for."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from silofl.protocols import shuffled_epochs as se

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("n", "m"), [(1500, 256), (1536, 256), (7, 3), (5, 5), (4, 9), (10, 1)])
def test_every_record_is_in_exactly_one_batch_of_an_epoch_and_the_last_batch_is_smaller(n: int, m: int) -> None:
    batches = se.batches_per_epoch(n, m)
    assert batches == math.ceil(n / m)
    for seed in (0, 123456789):
        parts = [se.batch_indices(n, m, b, seed) for b in range(batches)]
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
        sizes = [len(p) for p in parts]
        assert sizes == [m] * (batches - 1) + [n - (batches - 1) * m]
        assert all(np.all(np.diff(p) > 0) for p in parts)  # increasing indices, no repeat


def test_rounds_walk_the_batches_of_consecutive_epochs() -> None:
    batches = 6
    positions = [se.position(t, batches) for t in range(1, 14)]
    assert positions[:7] == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 0)]
    assert positions[12] == (3, 0)
    assert [se.epoch_of(t, batches) for t in (0, 1, 6, 7, 12, 13)] == [0, 1, 1, 2, 2, 3]
    assert se.accounted_steps(12, 1500, 256) == 2  # B = 6: two whole epochs
    assert se.accounted_steps(13, 1500, 256) == 3  # a partial third epoch counts in full
    assert se.accounted_steps(5, 100, 256) == 5  # m >= n: every round is an epoch (q = 1 each)


def test_different_epochs_draw_different_permutations() -> None:
    n, m = 200, 32
    first = [se.batch_indices(n, m, 0, seed) for seed in (11, 12)]
    assert not np.array_equal(first[0], first[1])
    assert se.batch_indices(n, m, 3, 11).tolist() == se.batch_indices(n, m, 3, 11).tolist()


@pytest.mark.slow
def test_the_same_seed_gives_the_same_batch_in_a_fresh_process() -> None:
    code = (
        "from protocols.shuffled_epochs import batch_indices; from client.randomness import epoch_seed, EPOCH_ORDER; "
        "print(batch_indices(1500, 256, 4, epoch_seed(seed=3, silo_id=1, epoch=2, stream=EPOCH_ORDER)).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    from silofl.client.randomness import EPOCH_ORDER, epoch_seed

    here = se.batch_indices(1500, 256, 4, epoch_seed(seed=3, silo_id=1, epoch=2, stream=EPOCH_ORDER))
    assert out.strip() == str(here.tolist())


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: se.batches_per_epoch(0, 4), "records must be an integer >= 1"),
        (lambda: se.batches_per_epoch(10, 0), "batch_size must be an integer >= 1"),
        (lambda: se.position(0, 3), "server_round must be an integer >= 1"),
        (lambda: se.batch_indices(10, 4, 3, 0), r"batch must be an integer in \[0, 3\)"),
        (lambda: se.accounted_steps(0, 10, 4), "rounds must be an integer >= 1"),
    ],
)
def test_invalid_arguments_are_named(call, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        call()
