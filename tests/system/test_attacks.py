"""A malicious server against one silo's differential privacy, through the real ClientApp (`tests/malicious_server.py`).

Each test forges what a server sends (values, instructions, arrays) to a silo (or a separate sensitive party) and its
neighbour, D and D' differing in one record (record-level algorithms: the record replaced; steffle, tran and a
sensitive party: only its sensitive attribute changed), with the same seeds, and checks that the silo's guarantee
holds: the two behave the same (both refuse for the same reason, or both answer finite values whose un-noised parts
are identical), it refuses what its calibration does not cover, and its release has the sensitivity the noise is
calibrated for.

1. Non-finite values past clipping: a huge but finite model, W, prior, global loss or query point makes one
   record's term inf or NaN, so the release is NaN, or the silo refuses, exactly when that record is there (or has
   s = 1).
2. DP-mu2-FL's domain diameter D, trust and batch size are bound at the silo's calibration, and its query points lie in
   the domain K (the ball of radius D / 2).
3. Shuffled epochs (steffle, tran) bind the batch size: moved batch boundaries put a record in two batches of an epoch
   that is charged once.
4. DP-CalR with `calr-relation = add_remove` replies the noised sum divided by q (the server divides by n_j): one
   added record moves the reply by exactly 0 or its own term / q.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from silofl.client import randomness
from silofl.client.data.tabular import SiloData
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from silofl.protocols import shuffled_epochs
from tests import malicious_server as ms

N = 20  # training records of the small silos
F32_HUGE = 3e38  # finite in float32 (max 3.4e38); twice it is not


def _instruction(algorithm: str, **values: float | int | str) -> dict:
    """Round values every attack below shares (a private run, every record in every Poisson sample: q = 1)."""
    return {"total_rounds": 3, "batch_size": 64, "lr": 0.1, "epsilon": 1.0, "delta": 1e-5, "clip": 1.0, **values}


def _silo(*, low: float = 0.0, high: float = 0.2, groups: int | None = None, first: tuple = ()) -> SiloData:
    """N records with small features in [low, high]; every attribute `groups` if given; record 0's features set to
    `first` if given."""
    silo = ms.make_silo(N, low=low, high=high)
    features, labels = silo.train.nonsensitive.features.copy(), silo.train.nonsensitive.labels
    attributes = np.full(N, groups, np.int64) if groups is not None else silo.train.sensitive.groups
    if first:
        features[0] = first
    return ms.with_train(silo, features, labels, attributes)


# -- 1. non-finite values get past clipping ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Attack:
    """Neighbouring data (`d`, `d_prime`) and the messages the server sends both, in order: (kind, content, round)."""

    algorithm: str
    d: object
    d_prime: object
    messages: list[tuple[str, RecordDict, int]]
    #: the nodes' extra node config, and what both are given before the messages (a sensitive party: its records)
    node_config: dict | None = None
    prepare: Callable[[ms.Twins], None] | None = None


def _record_level(
    algorithm: str, params: dict, *, records: dict | None = None, label: int = 1, **values: float | int | str
) -> Attack:
    """Record 0 holds x = 0 in D and x = 1 (label `label`, group 1) in D'; every other record x in [0, 0.2]^4 with
    feature 0 at 0."""
    base = _silo(first=(0.0, 0.0, 0.0, 0.0))
    features = base.train.nonsensitive.features.copy()
    features[:, 0] = 0.0
    base = ms.with_train(base, features, base.train.nonsensitive.labels, base.train.sensitive.groups)
    d_prime = ms.replace_record(base, 0, np.ones(4), label, 1)
    content = ms.train(algorithm, params, records=records, **_instruction(algorithm, server_round=1, **values))
    return Attack(algorithm, base, d_prime, [(msg.TRAIN, content, 1)])


def _fairness(algorithm: str, params: dict, fair: dict, **values) -> Attack:
    """Every record in group 0; record 0 in group 1 in D'. The group counts first, then one round."""
    base = _silo(groups=0)
    d_prime = ms.change_attribute(base, 0, 1)
    instr = _instruction(algorithm, **values)
    return Attack(
        algorithm,
        base,
        d_prime,
        [
            (msg.GROUPS, ms.groups(algorithm, **instr), 0),
            (msg.TRAIN, ms.train(algorithm, params, records={msg.FAIRNESS: fair}, server_round=1, **instr), 1),
        ],
    )


def _mlp(hidden_first: float, head: float) -> dict:
    """An MLP (hidden 8) whose hidden units read feature 0 only, with weight `hidden_first`, and a head of `head`."""
    params = ms.tabular_model("mlp", 4, 2, hidden=8)
    params["hidden.weight"][:, 0] = hidden_first
    params["head.weight"][:] = head
    return params


def _huge_logreg(weight: float, bias: float = 0.0, dtype: type = np.float32) -> dict:
    params = ms.tabular_model("logreg", 4, 2, dtype=dtype)
    params["head.weight"][:] = weight
    params["head.bias"][:] = bias
    return params


def _tiny_group(w: float, tiny: float) -> dict:
    """SteFFLe's W with only group 1's row nonzero, and a prior that gives group 1 probability `tiny` (float32)."""
    return {"w": np.array([[0.0, 0.0], [w, -w]], np.float32), "prior": np.array([1.0 - tiny, tiny], np.float32)}


def _fedfdp_loss(value: float) -> dict:
    return {msg.GLOBAL_LOSS: {"value": np.array([value], np.float32)}}


def _single_pass(algorithm: str) -> Attack:
    """mu2fl / noisy-sgd, one round over all N records (b = N): the query point's weights 1e308 (float64) overflow the
    logits of a record with features 1 and no other (D: every feature 0)."""
    base = ms.make_silo(N)
    base = ms.with_train(base, np.zeros((N, 4)), np.zeros(N, np.int64), base.train.sensitive.groups)
    d_prime = ms.replace_record(base, 0, np.ones(4), 1, 1)
    point = _huge_logreg(1e308, dtype=np.float64)
    content = ms.train(
        algorithm,
        point,
        records={msg.PREVIOUS: point},
        server_round=1,
        total_rounds=1,
        batch_size=N,
        epsilon=1.0,
        delta=1e-5,
    )
    return Attack(algorithm, base, d_prime, [(msg.TRAIN, content, 1)])


def _sensitive_party(params: dict, fair: dict, **values) -> Attack:
    """A separate sensitive party holding every record's group (all 0; record 0's is 1 in D') and, from the sealed
    exchange, the records' features and labels (the same for D and D'); the group counts, then one round of
    query.sensitive with the forged model and W (it computes F and J_F itself, as a silo's sensitive division)."""
    silo = _silo(groups=0)
    d, d_prime = ms.sensitive_party(silo), ms.sensitive_party(ms.change_attribute(silo, 0, 1))
    instr = _instruction("steffle", **values)
    content = ms.train("steffle", params, records={msg.FAIRNESS: fair}, server_round=1, **instr)
    return Attack(
        "steffle",
        d,
        d_prime,
        [(msg.GROUPS, ms.groups("steffle", **instr), 0), (pm.SENSITIVE_QUERY, content, 1)],
        node_config={"party-secret": ms.PARTY_SECRET},
        prepare=lambda twins: ms.sealed_exchange(twins, silo),
    )


def _fedsc(first_conv: float) -> Attack:
    """FedSC's correlation query (replace_one, every record shared: q = 1) with a first convolution of `first_conv`:
    D's images are all black (the convolution gives 0), D' has one white image (it overflows)."""
    silo = ms.make_silo(N, num_features=64)
    base = ms.with_train(silo, np.zeros((N, 64)), silo.train.nonsensitive.labels, silo.train.sensitive.groups)
    d_prime = ms.replace_record(base, 0, np.ones(64), 1, 1)
    params = ms.ssl_model(64, projection_dim=8)
    params["backbone.0.0.weight"][:] = first_conv
    for name in ("backbone.0.1.weight", "backbone.1.1.weight", "backbone.2.1.weight"):
        params[name][:] = 1.0
    params["projector.2.bias"][0] = 1.0
    content = ms.correlation(
        params,
        server_round=1,
        total_rounds=1,
        epsilon=1.0,
        delta=1e-5,
        projection_dim=8,
        views=2,
        calr_sampling_rate=1.0,
        planned_shares=1,
    )
    return Attack("fedsc", base, d_prime, [(msg.CORRELATION, content, 1)])


#: The attacks of part 1, by name: what the forged message holds and which record it singles out.
ATTACKS: dict[str, Callable[[], Attack]] = {
    # dp-fedsgd: logits of x = 1 overflow to inf, its gradient is NaN and clipping keeps it
    "dp-fedsgd-logreg-weight-3e38": lambda: _record_level("dp-fedsgd", _huge_logreg(F32_HUGE)),
    "dp-fedsgd-mlp-1e30": lambda: _record_level("dp-fedsgd", _mlp(1e30, 1e30), model="mlp", hidden=8),
    # fedfdp: the fair weight 1 + lambda (f_j - F_t) of the target overflows: "weights must be finite" from D' only
    "fedfdp-logreg-weight-3e38": lambda: _record_level("fedfdp", _huge_logreg(F32_HUGE), records=_fedfdp_loss(0.5)),
    "fedfdp-mlp-1e30": lambda: _record_level(
        "fedfdp", _mlp(1e30, 1e30), records=_fedfdp_loss(0.5), model="mlp", hidden=8
    ),
    "fedfdp-huge-global-loss": lambda: _record_level(  # f_j = 4e37 for the target only; F_t = -3.2e38
        "fedfdp", _huge_logreg(1e37), records=_fedfdp_loss(-3.2e38), label=0, lam=1.0
    ),
    # steffle: a_i = 2 W_s / sqrt(p_s) overflows for s = 1 only (tiny prior); a huge W makes every release NaN
    "steffle-logreg-tiny-prior": lambda: _fairness(
        "steffle", ms.tabular_model("logreg", 4, 2), _tiny_group(1e17, 1e-44)
    ),
    "steffle-mlp-tiny-prior": lambda: _fairness(
        "steffle", ms.tabular_model("mlp", 4, 2, hidden=8), _tiny_group(1e17, 1e-44), model="mlp", hidden=8
    ),
    "steffle-mlp-balanced-tiny-prior": lambda: _fairness(
        "steffle",
        ms.tabular_model("mlp", 4, 2, hidden=8),
        _tiny_group(1.0, 1e-44),
        model="mlp",
        hidden=8,
        group_weight="balanced",
    ),
    "steffle-logreg-huge-w": lambda: _fairness("steffle", ms.tabular_model("logreg", 4, 2), _tiny_group(F32_HUGE, 0.5)),
    # tran: group 1's signed multipliers overflow the constraint gradient of s = 1 only
    "tran-logreg-multipliers-3e38": lambda: _fairness(
        "tran",
        ms.tabular_model("logreg", 4, 2),
        {"multipliers": _tiny_group(F32_HUGE, 0.5)["w"], "prior": np.array([0.5, 0.5], np.float32)},
    ),
    "tran-mlp-multipliers-3e38": lambda: _fairness(
        "tran",
        ms.tabular_model("mlp", 4, 2, hidden=8),
        {"multipliers": _tiny_group(F32_HUGE, 0.5)["w"], "prior": np.array([0.5, 0.5], np.float32)},
        model="mlp",
        hidden=8,
    ),
    # single pass: the query point's logits of the target overflow (float64)
    "mu2fl-query-point-1e308": lambda: _single_pass("mu2fl"),
    "noisy-sgd-query-point-1e308": lambda: _single_pass("noisy-sgd"),
    # a separate sensitive party: as steffle's silo, a_i overflows for s = 1 only, or a huge W makes it NaN
    "sensitive-party-tiny-prior": lambda: _sensitive_party(ms.tabular_model("logreg", 4, 2), _tiny_group(1e17, 1e-44)),
    "sensitive-party-huge-w": lambda: _sensitive_party(ms.tabular_model("logreg", 4, 2), _tiny_group(F32_HUGE, 0.5)),
    # ... and at the largest model and W it accepts, with a prior at the floor: answered, finite, the same
    "sensitive-party-at-the-bounds": lambda: _sensitive_party(_huge_logreg(1e6), _tiny_group(1e6, 1e-3)),
    # fedsc: the representation of a non-black image is NaN
    "fedsc-correlation-conv-1e30": lambda: _fedsc(1e30),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_huge_finite_message_behaves_the_same_on_neighbouring_data(tmp_path: Path, name: str) -> None:
    """Attack 1: a finite but huge message (model, W, prior, global loss, Jacobians, query point) must not make the
    release non-finite or the silo refuse depending on one record: on D and D' the silo either refuses both for the
    same reason (a refusal that depends only on the message) or answers both with finite values (un-noised parts
    identical)."""
    attack = ATTACKS[name]()
    twins = ms.Twins(attack.d, attack.d_prime, tmp_path, **(attack.node_config or {}))
    if attack.prepare is not None:
        attack.prepare(twins)
    for kind, content, server_round in attack.messages:
        first, second = twins.send(kind, content, server_round)
        ms.assert_same_behaviour(first, second, ms.noised_records(attack.algorithm, kind), f"{name}, {kind}")


# -- 2. DP-mu2-FL binds D, trust and batch size, and keeps its query points in K -------------------------------------
MU2_ROUNDS = 5


def _mu2_node(tmp_path: Path, **node_config: object) -> ms.Node:
    node = ms.Node(ms.make_silo(N), tmp_path / "silo", **node_config)
    node.setup()
    return node


def _mu2_round(node: ms.Node, t: int, point: np.ndarray, previous: np.ndarray, **values: float | int | str) -> Message:
    """Round t of an untrusted DP-mu2-FL run (b = 1, 5 rounds, rho = 1) with query points x_t, x_(t-1) (flat)."""
    spec = ms.tabular_spec("logreg", 4, 2)

    def named(flat: np.ndarray) -> dict[str, np.ndarray]:
        out, start = {}, 0
        for name, shape in spec:
            size = math.prod(shape)
            out[name] = np.asarray(flat[start : start + size], np.float64).reshape(shape)
            start += size
        return out

    instr = {"total_rounds": MU2_ROUNDS, "batch_size": 1, "rho": 1.0, "delta": 1e-5, "domain_diameter": 0.1, **values}
    content = ms.train("mu2fl", named(point), records={msg.PREVIOUS: named(previous)}, server_round=t, **instr)
    return node.send(msg.TRAIN, content, t)


def _point(norm: float) -> np.ndarray:
    """A query point (5 parameters: head.weight (1, 4) and head.bias) of Euclidean norm `norm`."""
    return np.full(5, norm / math.sqrt(5.0))


ZERO = np.zeros(5)


def test_mu2fl_refuses_a_larger_domain_diameter_than_it_calibrated_with(tmp_path: Path) -> None:
    """Attack 2: D = 0.1 in round 1, then D = 1e4 with a query step of 1e3 that passes Lemma 4.2's check for 1e4 (not
    for 0.1), x_2 inside the ball of radius 5e3: the silo's noise covers query steps of its calibrated D only, so the
    round is refused naming `domain-diameter` and nothing is released."""
    node = _mu2_node(tmp_path)
    first = _mu2_round(node, 1, ZERO, ZERO)
    assert not first.has_error(), first.error.reason
    reason = ms.error_reason(_mu2_round(node, 2, _point(1e3), ZERO, domain_diameter=1e4))
    assert "domain-diameter" in reason


def test_mu2fl_refuses_a_smaller_domain_diameter_than_it_calibrated_with(tmp_path: Path) -> None:
    """Attack 2, the other way: calibrated at D = 1e4 (round 1), then D = 0.1, with honest query points (0): any
    change of D from the calibrated value is refused, naming `domain-diameter` (sigma is recomputed from D)."""
    node = _mu2_node(tmp_path)
    first = _mu2_round(node, 1, ZERO, ZERO, domain_diameter=1e4)
    assert not first.has_error(), first.error.reason
    assert "domain-diameter" in ms.error_reason(_mu2_round(node, 2, ZERO, ZERO, domain_diameter=0.1))


def test_mu2fl_refuses_a_switch_to_a_trusted_server_mid_run(tmp_path: Path) -> None:
    """Attack 2: an untrusted run switched to `trust = trusted` in round 2 would get the silo's momentum un-noised
    although its operator allows trusted servers: the change itself is refused, naming `trust`."""
    node = _mu2_node(tmp_path, **{"allow-trusted-server": True})
    first = _mu2_round(node, 1, ZERO, ZERO)
    assert not first.has_error(), first.error.reason
    assert "trust" in ms.error_reason(_mu2_round(node, 2, ZERO, ZERO, trust="trusted"))


def test_mu2fl_refuses_a_changed_batch_size_naming_it(tmp_path: Path) -> None:
    """Attack 2: b = 1 in round 1, b = 2 in round 2 (the single pass would reuse records): refused, the reason naming
    the field `batch-size`."""
    node = _mu2_node(tmp_path)
    first = _mu2_round(node, 1, ZERO, ZERO)
    assert not first.has_error(), first.error.reason
    assert "batch-size" in ms.error_reason(_mu2_round(node, 2, ZERO, ZERO, batch_size=2))


@pytest.mark.parametrize("server_round", [1, 2])
def test_mu2fl_query_points_must_lie_in_the_domain(tmp_path: Path, server_round: int) -> None:
    """Attack 2: the noise is calibrated for query points in K, the ball of radius D / 2 = 0.05. A point at radius
    0.05 (1 + 1e-6) is refused naming the domain, in round 1 (no query step is checked there) and in round 2 after a
    point inside K, with a step of 0.001 that Lemma 4.2's check lets through; a point just inside K is answered."""
    node = _mu2_node(tmp_path)
    inside, outside = _point(0.05 * (1 - 1e-6)), _point(0.05 * (1 + 1e-6))
    previous = inside
    if server_round == 2:
        previous = _point(0.049)  # x_1, inside K; x_2 = outside: (t - 1) ||x_2 - x_1|| = 0.001 < 2 D
        first = _mu2_round(node, 1, previous, previous)
        assert not first.has_error(), first.error.reason
    reason = ms.error_reason(_mu2_round(node, server_round, outside, previous))
    assert "domain" in reason.lower()
    fresh = _mu2_node(tmp_path / "fresh")
    answered = _mu2_round(fresh, 1, inside, inside)
    assert not answered.has_error(), answered.error.reason


# -- 3. shuffled epochs bind the batch size --------------------------------------------------------------------------
SHUFFLED = 1500  # records: batch 256 gives B = 6 batches per epoch, as 250 and 299 do
FAIRNESS = {
    "steffle": {"w": np.array([[0.5, -0.5], [-0.5, 0.5]], np.float32), "prior": np.array([0.5, 0.5], np.float32)},
    "tran": {"multipliers": np.array([[0.0, 1.0], [0.0, -1.0]], np.float32), "prior": np.array([0.5, 0.5], np.float32)},
}


@pytest.mark.parametrize("changed", [299, 250])
@pytest.mark.parametrize("algorithm", ["steffle", "tran"])
def test_shuffled_epochs_refuse_a_batch_size_changed_within_the_run(
    tmp_path: Path, algorithm: str, changed: int
) -> None:
    """Attack 3: 1,500 records, batch 256 (6 batches per epoch). The server moves the batch boundaries in round 2
    (256 -> `changed`, still 6 batches) and back in round 3: with one permutation per epoch, a record lands in two
    batches of epoch 1, whose release is charged once. Expected: round 2 is refused, naming `batch-size`, on D and
    on D' alike. (On a silo that answers, the test reads from the real replies which rounds record i's attribute
    moved.)"""
    schedule = [256, changed, 256]
    seed = randomness.epoch_seed(seed=0, silo_id=0, epoch=1, stream=randomness.SENSITIVE_EPOCH_ORDER)
    batches = [set(shuffled_epochs.batch_indices(SHUFFLED, m, t, seed).tolist()) for t, m in enumerate(schedule)]
    twice = sorted((batches[0] & batches[1]) | (batches[1] & batches[2]))
    assert twice, "the schedule puts no record in two batches of the epoch"
    record = twice[0]
    silo = ms.make_silo(SHUFFLED, low=-1.0, high=1.0)
    twins = ms.Twins(silo, ms.change_attribute(silo, record), tmp_path)
    values = {"total_rounds": 12, "lr": 0.1, "epsilon": 1.0, "delta": 1e-6, "clip": 1.0, "sampling": "shuffle"}
    counts = twins.send(msg.GROUPS, ms.groups(algorithm, batch_size=256, **values), 0)
    assert not counts[0].has_error(), counts[0].error.reason
    params = ms.tabular_model("logreg", 4, 2, fill=0.1)
    touched, spent = [], []
    for t, batch_size in enumerate(schedule, start=1):
        content = ms.train(
            algorithm,
            params,
            records={msg.FAIRNESS: FAIRNESS[algorithm]},
            server_round=t,
            batch_size=batch_size,
            **values,
        )
        first, second = twins.send(msg.TRAIN, content, t)
        ms.assert_same_behaviour(first, second, ms.noised_records(algorithm, msg.TRAIN), f"round {t}")
        if t == 2 and first.has_error():
            assert "batch-size" in first.error.reason
            return
        assert not first.has_error(), f"round {t} (batch {batch_size}) refused: {first.error.reason}"
        mine, theirs = ms.arrays_of(first, msg.FAIR_UPDATE), ms.arrays_of(second, msg.FAIR_UPDATE)
        if any(mine[k].tobytes() != theirs[k].tobytes() for k in mine):
            touched.append(t)
        spent.append(msg.read_config(first.content, msg.TrainReport, record=msg.REPORT).epsilon_spent)
    pytest.fail(
        f"round 2 with batch-size {changed} (calibrated with 256) was answered: record {record}'s attribute moved the "
        f"releases of rounds {touched} of epoch 1, charged once (epsilon spent {spent})"
    )


# -- 4. DP-CalR add_remove: the reply is the noised sum divided by q --------------------------------------------------
H, MU, VIEWS, SHARES = 8, 4.0, 2, 6


def _constant_representation() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """An SSL model whose representation is z = sqrt(mu) e_1 for every input (zero weights, last bias e_1, then
    normalized to norm sqrt(mu)), and T = z z^T, every record's term (its mean over views of z z^T): exact in float."""
    params = ms.ssl_model(64, projection_dim=H)
    params["projector.2.bias"][0] = 1.0
    term = np.zeros((H, H))
    term[0, 0] = MU
    return params, term


def _shares(twins: ms.Twins, params: dict, rate: float, relation: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """SHARES correlation matrices of D and D' at epsilon = inf (no noise), one per round."""
    out = []
    for t in range(1, SHARES + 1):
        content = ms.correlation(
            params,
            server_round=t,
            total_rounds=SHARES,
            epsilon=math.inf,
            projection_dim=H,
            views=VIEWS,
            mu=MU,
            calr_sampling_rate=rate,
            calr_relation=relation,
            planned_shares=SHARES,
        )
        first, second = twins.send(msg.CORRELATION, content, t)
        mine, theirs = (ms.arrays_of(reply, msg.CORRELATION_MATRIX)["R"] for reply in (first, second))
        out.append((mine, theirs))
    return out


@pytest.mark.parametrize(("rate", "simulated"), [(0.5, False), (0.25, False), (1.0, True)])
def test_dp_calr_add_remove_replies_the_noised_sum_over_q(tmp_path: Path, rate: float, simulated: bool) -> None:
    """Attack 4: under add_remove the silo's reply must not divide by its own count n_j (one added record would move
    every other record's term too, by far more than the radius the noise covers). The reply is (sum over the sampled
    records of their terms + noise) / q, the server divides by n_j. Through the ClientApp, D' = D plus one record
    appended (its Poisson coin drawn after D's, `torch.rand(n)`), every record's term the same matrix T, epsilon =
    inf: reply(D) = k T / q for an integer k, and reply(D') - reply(D) is exactly 0 (the record not sampled) or
    exactly T / q (sampled); both happen over the shares when q < 1. Under replace_one (the default) the reply is
    unchanged: k T / (q n_j). A deployed silo at q < 1; at q = 1 a simulated one (the refusal of add_remove at rate 1
    by a deployed silo is not what is tested)."""
    silo = ms.make_silo(N, num_features=64)
    d_prime = ms.append_record(silo, np.full(64, 0.5), 1, 1)
    params, term = _constant_representation()
    twins = ms.Twins(silo, d_prime, tmp_path / "add", simulated=simulated)
    seen, counts = set(), []
    for t, (mine, theirs) in enumerate(_shares(twins, params, rate, "add_remove"), start=1):
        k = mine[0, 0] * rate / MU
        assert k == round(k) and 0 <= k <= N, f"share {t}: reply {mine[0, 0]!r} is not k T / q for an integer k"
        counts.append(round(k))
        if rate == 1.0:
            assert k == N, f"share {t}: at q = 1 every record is in the sum, got k = {k}"
        np.testing.assert_array_equal(mine, round(k) * term / rate)
        change = theirs - mine
        if np.array_equal(change, np.zeros_like(term)):
            seen.add("not sampled")
        else:
            np.testing.assert_array_equal(change, term / rate, err_msg=f"share {t}: the added record's change")
            seen.add("sampled")
    assert seen == ({"sampled"} if rate == 1.0 else {"sampled", "not sampled"}), seen
    # replace_one: the same coins (same seeds), the same records: k T / (q n_j)
    replaced = _shares(ms.Twins(silo, silo, tmp_path / "replace", simulated=simulated), params, rate, "replace_one")
    for k, (mine, _) in zip(counts, replaced, strict=True):
        np.testing.assert_allclose(mine, k * term / (rate * N), rtol=1e-12, atol=0)
