"""Differential fuzz of a silo's privacy against a malicious server, through the real ClientApp.

For each algorithm hypothesis forges a run of 1-3 rounds: instruction values across their allowed ranges (clip, batch
size, lr, lambda, epsilon and delta, total rounds, domain diameter, keep rate, ...) and arrays (model, W, prior,
multipliers, global loss, query points, the feature parties' outputs and Jacobians) whose magnitudes go from 0 to the
dtype's largest finite value (zeros, constants, signs, a few huge entries). Each message goes, byte for byte the same,
to a silo (or a separate sensitive party) on D and to one on D', neighbours in the algorithm's relation (a record
replaced for the record-level algorithms and for steffle and tran with `protect` record, one record's sensitive
attribute changed for steffle, tran and the sensitive party otherwise), both with the same seeds. The two must behave
the same (`tests/malicious_server.py`, `behaviour_difference`): both refuse for the same reason, or both answer with
the same records and arrays, every value finite, and the records that carry no noise byte for byte equal.

The privacy parameters come from a few profiles (a calibration costs 0.1-15 s; the silo caches them per process) and
the silos are small (24 records), so the module runs in well under two minutes. The number of generated cases is
counted and printed at the end of the session (and checked per test).
"""

from __future__ import annotations

import functools
import logging
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from silofl.client.data.tabular import SiloData
from silofl.protocols import algorithms
from silofl.protocols import messages as msg
from silofl.protocols import parties as pm
from tests import fuzz_cases
from tests import malicious_server as ms

N = 24  # training records of every fuzzed silo
FEATURES = 3
LABELS = 2
GROUPS = 2
EXAMPLES = 40  # per algorithm (FedSC: half)

F32_MAX = float(np.finfo(np.float32).max)
F64_MAX = float(np.finfo(np.float64).max)
#: Magnitudes of the forged arrays, per dtype: 0 to the largest finite value (shrinks towards 0).
MAGNITUDES = {
    "float32": (0.0, 1e-30, 1e-3, 1.0, 30.0, 1e4, 1e6, 1e8, 1e19, 1e30, 1e37, 1e38, F32_MAX),
    "float64": (0.0, 1e-300, 1e-3, 1.0, 30.0, 1e4, 1e6, 1e8, 1e30, 1e154, 1e300, 1e307, 1e308, F64_MAX),
}
#: Candidate values of the positive scalars of the instructions (clip, mu), then of lr, lambda and the loss bound,
#: the domain diameter; each kept only where the algorithm's schema allows it, beside the range's own ends.
POSITIVE = (1.0, 1e-30, 1e-6, 0.01, 10.0, 1e4, 1e8, 1e30, 1e300, F64_MAX)
LR = (0.1, 1e-30, 1e-3, 1.0)
LAMBDA = (1.0, 0.0, 1e-3)
DIAMETER = (0.1, 1e-3, 1.0, 1e4, 1e300)
#: (epsilon, delta, total rounds) the silos calibrate for: cheap calibrations, cached by the silo across cases.
PROFILES = ((1.0, 1e-5, 3), (math.inf, 0.0, 3), (0.5, 1e-9, 10))


fuzz = fuzz_cases.fuzz


CASES: Counter[str] = Counter()


_report_cases = fuzz_cases.summary_fixture(
    "silofl-fuzz-neighbours-summary",
    lambda: (
        f"fuzz neighbours: {sum(CASES[a] for a in ALGORITHMS)} cases ("
        + ", ".join(f"{a} {CASES[a]}" for a in ALGORITHMS)
        + f"): {CASES['answered']} messages answered alike on D and D', {CASES['refused']} refused alike"
    ),
)


@pytest.fixture(scope="module", autouse=True)
def _quiet_accountant() -> Iterator[None]:
    """dp-accounting's RDP accountant logs a warning for every order it cannot evaluate (thousands per sampled
    calibration): kept out of the fuzz's output."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


_ran = functools.partial(fuzz_cases.run_counted, CASES)


# -- strategies ------------------------------------------------------------------------------------------------------
def style(data: st.DataObject, label: str, dtype: str = "float32") -> tuple[str, float]:
    """How to fill a forged array: zeros, a constant, random signs, uniform values or a few huge entries among small
    ones, and a magnitude from 0 to the dtype's largest finite value."""
    pattern = data.draw(st.sampled_from(("zeros", "constant", "signs", "spikes", "uniform")), label=f"{label} pattern")
    if pattern == "zeros":
        return pattern, 0.0
    top, width = (F32_MAX, 32) if dtype == "float32" else (F64_MAX, 64)
    magnitude = data.draw(
        st.sampled_from(MAGNITUDES[dtype]) | st.floats(0.0, 1e6, width=width) | st.floats(0.0, top, width=width),
        label=f"{label} magnitude",
    )
    return pattern, magnitude


def extreme(
    data: st.DataObject,
    shape: tuple[int, ...],
    label: str,
    dtype: str = "float32",
    how: tuple[str, float] | None = None,
) -> np.ndarray:
    """An array of `shape` filled as `how` says (drawn when None: :func:`style`)."""
    pattern, magnitude = how or style(data, label, dtype)
    if pattern == "zeros":
        return np.zeros(shape, dtype)
    top = F32_MAX if dtype == "float32" else F64_MAX
    size = math.prod(shape)
    if pattern == "constant":
        values = np.full(size, magnitude * data.draw(st.sampled_from((1.0, -1.0)), label=f"{label} sign"))
    else:
        rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label=f"{label} seed"))
        if pattern == "signs":
            values = magnitude * rng.choice((-1.0, 1.0), size)
        elif pattern == "uniform":
            values = magnitude * rng.uniform(-1.0, 1.0, size)
        else:
            values = rng.normal(0.0, 1.0, size)
            spikes = rng.choice(size, min(size, data.draw(st.integers(1, 3), label=f"{label} spikes")), replace=False)
            values[spikes] = magnitude * rng.choice((-1.0, 1.0), spikes.size)
    return np.clip(values, -top, top).astype(dtype).reshape(shape)


def arrays(
    data: st.DataObject, spec: list[tuple[str, tuple[int, ...]]], label: str, dtype: str = "float32"
) -> dict[str, np.ndarray]:
    """Forged arrays of a model (`spec`: names and shapes): each filled its own way, or all one way (one pattern and
    magnitude for every layer, which a record's overflow needs more often than a single layer's)."""
    how = style(data, f"{label} (every array)", dtype) if data.draw(st.booleans(), label=f"{label} one way") else None
    return {name: extreme(data, shape, f"{label} {name}", dtype, how) for name, shape in spec}


def limits(algorithm: str, name: str) -> tuple[float, float, bool, bool]:
    """(low, high, low excluded, high excluded): the bounds the algorithm's instruction schema puts on a field."""
    low, high, low_open, high_open = -F64_MAX, F64_MAX, False, False
    for meta in algorithms.get(algorithm).instruction_model.model_fields[name].metadata:
        if getattr(meta, "ge", None) is not None:
            low, low_open = float(meta.ge), False
        if getattr(meta, "gt", None) is not None:
            low, low_open = float(meta.gt), True
        if getattr(meta, "le", None) is not None:
            high, high_open = float(meta.le), False
        if getattr(meta, "lt", None) is not None:
            high, high_open = float(meta.lt), True
    return low, high, low_open, high_open


def allowed(algorithm: str, name: str, value: float) -> bool:
    """Whether the schema accepts `value` for the field."""
    low, high, low_open, high_open = limits(algorithm, name)
    return (value > low if low_open else value >= low) and (value < high if high_open else value <= high)


def scalar(data: st.DataObject, algorithm: str, name: str, extremes: tuple[float, ...]) -> float:
    """A value of the float field `name` across its allowed range: `extremes` (the first is what a failure shrinks
    towards) and the range's own finite ends, or any float in the range."""
    low, high, low_open, high_open = limits(algorithm, name)
    ends = [v for v in (low, high) if abs(v) < F64_MAX]
    candidates = [v for v in (*extremes, *ends) if allowed(algorithm, name, v)]
    between = st.floats(low, high, exclude_min=low_open, exclude_max=high_open)
    return data.draw(st.sampled_from(candidates) | between, label=name.replace("_", " "))


def choice(data: st.DataObject, algorithm: str, name: str, values: tuple[Any, ...], label: str = "") -> Any:
    """One of `values` the schema accepts for the field `name`."""
    return data.draw(st.sampled_from([v for v in values if allowed(algorithm, name, v)]), label=label or name)


def sgd_values(data: st.DataObject, algorithm: str) -> dict[str, float]:
    """A round's clip norm and learning rate."""
    return {"clip": scalar(data, algorithm, "clip", POSITIVE), "lr": scalar(data, algorithm, "lr", LR)}


def privacy(data: st.DataObject, algorithm: str, *, sampled: bool = True) -> dict[str, Any]:
    """epsilon, delta, total rounds, and a batch size m: q = m / n = 1 (m >= n, up to 2^62) or, with `sampled`,
    q = 1/2 at the first profile (calibrating a sampled mechanism costs seconds)."""
    epsilon, delta, total = data.draw(st.sampled_from(PROFILES), label="epsilon, delta, total rounds")
    sizes = (N, 3 * N, 10**6, 2**62) + ((N // 2,) if sampled and (epsilon, delta) == PROFILES[0][:2] else ())
    return {
        "epsilon": epsilon,
        "delta": delta,
        "total_rounds": total,
        "batch_size": choice(data, algorithm, "batch_size", sizes, "batch size"),
    }


def model_kind(data: st.DataObject) -> dict[str, Any]:
    return {
        "model": data.draw(st.sampled_from(("logreg", "mlp")), label="model"),
        "hidden": data.draw(st.sampled_from((1, 3)), label="hidden"),
    }


def model_arrays(data: st.DataObject, kind: dict[str, Any], label: str, dtype: str = "float32") -> dict[str, Any]:
    return arrays(data, ms.tabular_spec(kind["model"], FEATURES, LABELS, kind["hidden"]), label, dtype)


def prior(data: st.DataObject, notion: str, label: str) -> np.ndarray:
    """A group prior: probabilities (possibly tiny, some float32 denormal) summing to 1 per row, or any array."""
    shape = (GROUPS,) if notion == "dp" else (LABELS, GROUPS)
    if data.draw(st.booleans(), label=f"{label} any array"):
        return extreme(data, shape, label)
    tiny = data.draw(st.sampled_from((0.5, 1e-3, 1e-20, 1e-38, 1e-44)), label=f"{label} smallest probability")
    row = np.array([1.0 - tiny, tiny])
    return np.broadcast_to(row, shape).astype(np.float32)


def fairness_shape(notion: str) -> tuple[int, ...]:
    return (LABELS, GROUPS, LABELS) if notion == "eo" else (GROUPS, LABELS)


# -- neighbouring data -----------------------------------------------------------------------------------------------
def silo(data: st.DataObject, *, low: float, high: float, num_features: int = FEATURES) -> SiloData:
    seed = data.draw(st.integers(0, 3), label="data seed")
    return ms.make_silo(
        N, num_features=num_features, num_labels=LABELS, num_groups=GROUPS, seed=seed, low=low, high=high
    )


def replaced(data: st.DataObject, base: SiloData, values: tuple[float, ...]) -> SiloData:
    """D' = `base` with one record replaced: features from `values`, label and group drawn. The fuzzed silos of the
    record-level algorithms hold small features (at most 0.1 in magnitude) and `values` reach 1, so that a forged
    message can overflow on the replaced record alone."""
    index = data.draw(st.integers(0, N - 1), label="replaced record")
    width = base.info.num_features
    x = np.array(data.draw(st.lists(st.sampled_from(values), min_size=width, max_size=width), label="its features"))
    return ms.replace_record(
        base,
        index,
        x,
        data.draw(st.integers(0, LABELS - 1), label="its label"),
        data.draw(st.integers(0, GROUPS - 1), label="its group"),
    )


def attribute_changed(data: st.DataObject, base: SiloData) -> SiloData:
    """D' = `base` with one record's sensitive attribute changed."""
    return ms.change_attribute(base, data.draw(st.integers(0, N - 1), label="record whose attribute changes"))


# -- running a case --------------------------------------------------------------------------------------------------
def exchange(
    twins: ms.Twins, algorithm: str, kind: str, content: Any, server_round: int, protect: str = "sensitive"
) -> bool:
    """Send one message to both silos; fail unless they behave the same. True when both answered. `protect`: the
    job's mode (`ms.noised_records`)."""
    first, second = twins.send(kind, content, server_round)
    problem = ms.behaviour_difference(first, second, ms.noised_records(algorithm, kind, protect))
    assert problem is None, f"{algorithm}, {kind} of round {server_round}: {problem}"
    CASES["refused" if first.has_error() else "answered"] += 1
    return not first.has_error()


def case(algorithm: str, d: Any, d_prime: Any, messages: Callable[[ms.Twins], None], **node_config: Any) -> None:
    """Twins on D and D' (with `node_config`) in a fresh folder; `messages(twins)` sends the run."""
    CASES[algorithm] += 1
    with tempfile.TemporaryDirectory() as folder:
        messages(ms.Twins(d, d_prime, Path(folder), **node_config))


# -- the algorithms --------------------------------------------------------------------------------------------------
@fuzz(EXAMPLES)
@given(data=st.data())
def _dp_fedsgd(data: st.DataObject) -> None:
    base = silo(data, low=-0.1, high=0.1)
    d_prime = replaced(data, base, (-1.0, 0.0, 0.5, 1.0))
    kind, run = model_kind(data), privacy(data, "dp-fedsgd")

    def messages(twins: ms.Twins) -> None:
        for t in range(1, data.draw(st.integers(1, 3), label="rounds") + 1):
            values = {**run, **kind, **sgd_values(data, "dp-fedsgd")}
            content = ms.train("dp-fedsgd", model_arrays(data, kind, f"round {t} model"), server_round=t, **values)
            exchange(twins, "dp-fedsgd", msg.TRAIN, content, t)

    case("dp-fedsgd", base, d_prime, messages)


@pytest.mark.slow
def test_dp_fedsgd_behaves_the_same_on_neighbouring_silos() -> None:
    """DP-FedSGD (a record replaced): forged models, clip norms, learning rates and batch sizes."""
    _ran(_dp_fedsgd, EXAMPLES)


@fuzz(EXAMPLES)
@given(data=st.data())
def _fedfdp(data: st.DataObject) -> None:
    base = silo(data, low=-0.1, high=0.1)
    d_prime = replaced(data, base, (-1.0, 0.0, 0.5, 1.0))
    kind, run = model_kind(data), privacy(data, "fedfdp")
    run |= {"lam": scalar(data, "fedfdp", "lam", LAMBDA), "loss_bound": scalar(data, "fedfdp", "loss_bound", LAMBDA)}

    def messages(twins: ms.Twins) -> None:
        for t in range(1, data.draw(st.integers(1, 3), label="rounds") + 1):
            values = {**run, **kind, **sgd_values(data, "fedfdp")}
            loss = {msg.GLOBAL_LOSS: {"value": extreme(data, (1,), f"round {t} global loss")}}
            content = ms.train(
                "fedfdp", model_arrays(data, kind, f"round {t} model"), records=loss, server_round=t, **values
            )
            exchange(twins, "fedfdp", msg.TRAIN, content, t)

    case("fedfdp", base, d_prime, messages)


@pytest.mark.slow
def test_fedfdp_behaves_the_same_on_neighbouring_silos() -> None:
    """FedFDP (a record replaced): forged models, global losses, lambda, loss bounds, clip norms."""
    _ran(_fedfdp, EXAMPLES)


def _fairness_run(data: st.DataObject, algorithm: str, model: str) -> None:
    """steffle or tran with `model`: one record's attribute changed (with `protect` record: a whole record replaced);
    the group counts, then 1-3 rounds."""
    base = silo(data, low=-1.0, high=1.0)
    protect = data.draw(st.sampled_from(("sensitive", "record")), label="protect")
    d_prime = replaced(data, base, (-1.0, 0.0, 0.5, 1.0)) if protect == "record" else attribute_changed(data, base)
    kind = {"model": model, "hidden": data.draw(st.sampled_from((1, 3)), label="hidden")}
    notion = data.draw(st.sampled_from(("dp", "eo", "eopp")), label="fairness")
    run = {
        **privacy(data, algorithm),
        **kind,
        "fairness": notion,
        "lam": scalar(data, algorithm, "lam", LAMBDA),
        "sampling": data.draw(st.sampled_from(("poisson", "shuffle")), label="sampling"),
        "protect": protect,
    }
    if algorithm == "steffle":
        run |= {
            "w_noise": data.draw(st.sampled_from(("auto", "isotropic", "per-group")), label="w-noise"),
            "group_weight": data.draw(st.sampled_from(("prior", "balanced")), label="group-weight"),
        }
    name = "w" if algorithm == "steffle" else "multipliers"

    def messages(twins: ms.Twins) -> None:
        if not exchange(twins, algorithm, msg.GROUPS, ms.groups(algorithm, **run), 0, protect):
            return
        for t in range(1, data.draw(st.integers(1, 3), label="rounds") + 1):
            values = {**run, **sgd_values(data, algorithm)}
            fair = {
                name: extreme(data, fairness_shape(notion), f"round {t} {name}"),
                "prior": prior(data, notion, f"round {t} prior"),
            }
            content = ms.train(
                algorithm,
                model_arrays(data, kind, f"round {t} model"),
                records={msg.FAIRNESS: fair},
                server_round=t,
                **values,
            )
            exchange(twins, algorithm, msg.TRAIN, content, t, protect)

    case(algorithm, base, d_prime, messages)


@fuzz(EXAMPLES)
@given(data=st.data())
def _steffle_logreg(data: st.DataObject) -> None:
    _fairness_run(data, "steffle", "logreg")


@pytest.mark.slow
def test_steffle_logreg_behaves_the_same_on_neighbouring_silos() -> None:
    """SteFFLe, logistic regression (one attribute changed): forged models, W, priors, lambda, w-noise, weighting."""
    _ran(_steffle_logreg, EXAMPLES)


@fuzz(EXAMPLES)
@given(data=st.data())
def _steffle_mlp(data: st.DataObject) -> None:
    _fairness_run(data, "steffle", "mlp")


@pytest.mark.slow
def test_steffle_mlp_behaves_the_same_on_neighbouring_silos() -> None:
    """SteFFLe, MLP (one attribute changed)."""
    _ran(_steffle_mlp, EXAMPLES)


@fuzz(EXAMPLES)
@given(data=st.data())
def _tran(data: st.DataObject) -> None:
    _fairness_run(data, "tran", data.draw(st.sampled_from(("logreg", "mlp")), label="model"))


@pytest.mark.slow
def test_tran_behaves_the_same_on_neighbouring_silos() -> None:
    """Tran et al. (one attribute changed): forged models, signed multipliers, priors."""
    _ran(_tran, EXAMPLES)


def _single_pass_run(data: st.DataObject, algorithm: str) -> None:
    """mu2fl or noisy-sgd, untrusted: features in [0, 1], a record replaced; forged query points (float64), domain
    diameters, rho or epsilon, batch sizes."""
    base = silo(data, low=0.0, high=0.1)
    d_prime = replaced(data, base, (0.0, 0.5, 1.0))
    rounds = data.draw(st.integers(1, 3), label="rounds")
    b = data.draw(st.sampled_from((1, 2, N // rounds)), label="batch size")
    epsilon, delta, _ = data.draw(st.sampled_from(PROFILES), label="epsilon, delta")
    # rho at most 1: a large rho means a small noise multiplier (0.001 at rho = 1e3), which the accountant prices
    # with a PLD of ~1e9 points (8 GB, minutes): a resource problem, not the one fuzzed here.
    rho = choice(data, algorithm, "rho", (0.0, 0.5, 1.0))
    run = {
        "trust": "untrusted",
        "batch_size": b,
        "total_rounds": data.draw(st.sampled_from((rounds, N // b)), label="total rounds"),
        "epsilon": math.inf if rho else epsilon,
        "delta": delta if math.isfinite(epsilon) else 1e-5,
        "rho": rho,
        "domain_diameter": scalar(data, algorithm, "domain_diameter", DIAMETER),
    }
    kind = {"model": "logreg", "hidden": 1}

    def messages(twins: ms.Twins) -> None:
        point = model_arrays(data, kind, "round 1 query point", "float64")
        previous = point
        for t in range(1, rounds + 1):
            if t > 1:
                previous, point = (
                    point,
                    (
                        point
                        if data.draw(st.booleans(), label=f"round {t} same point")
                        else model_arrays(data, kind, f"round {t} query point", "float64")
                    ),
                )
            content = ms.train(algorithm, point, records={msg.PREVIOUS: previous}, server_round=t, **run)
            if not exchange(twins, algorithm, msg.TRAIN, content, t):
                return

    case(algorithm, base, d_prime, messages)


@fuzz(EXAMPLES)
@given(data=st.data())
def _mu2fl(data: st.DataObject) -> None:
    _single_pass_run(data, "mu2fl")


@pytest.mark.slow
def test_mu2fl_behaves_the_same_on_neighbouring_silos() -> None:
    """DP-mu2-FL, untrusted (a record replaced)."""
    _ran(_mu2fl, EXAMPLES)


@fuzz(EXAMPLES)
@given(data=st.data())
def _noisy_sgd(data: st.DataObject) -> None:
    _single_pass_run(data, "noisy-sgd")


@pytest.mark.slow
def test_noisy_sgd_behaves_the_same_on_neighbouring_silos() -> None:
    """Single-pass noisy SGD, untrusted (a record replaced)."""
    _ran(_noisy_sgd, EXAMPLES)


@fuzz(EXAMPLES)
@given(data=st.data())
def _sensitive_party(data: st.DataObject) -> None:
    base = silo(data, low=-1.0, high=1.0)
    d, d_prime = ms.sensitive_party(base), ms.sensitive_party(attribute_changed(data, base))
    kind = model_kind(data)
    notion = data.draw(st.sampled_from(("dp", "eo", "eopp")), label="fairness")
    run = {**privacy(data, "steffle"), **kind, "fairness": notion}
    run["lam"] = scalar(data, "steffle", "lam", LAMBDA)
    run["w_noise"] = data.draw(st.sampled_from(("auto", "isotropic", "per-group")), label="w-noise")

    def messages(twins: ms.Twins) -> None:
        ms.sealed_exchange(twins, base)  # the records' features and labels: the same for D and D'
        if not exchange(twins, "steffle", msg.GROUPS, ms.groups("steffle", **run), 0):
            return
        for t in range(1, data.draw(st.integers(1, 3), label="rounds") + 1):
            fair = {
                "w": extreme(data, fairness_shape(notion), f"round {t} w"),
                "prior": prior(data, notion, f"round {t} prior"),
            }
            content = ms.train(
                "steffle",
                model_arrays(data, kind, f"round {t} model"),
                records={msg.FAIRNESS: fair},
                server_round=t,
                **{**run, **sgd_values(data, "steffle")},
            )
            exchange(twins, "steffle", pm.SENSITIVE_QUERY, content, t)

    case("sensitive-party", d, d_prime, messages, **{"party-secret": ms.PARTY_SECRET})


def test_a_sensitive_party_behaves_the_same_on_neighbouring_data() -> None:
    """A separate SteFFLe sensitive party holding sealed records (one attribute changed): forged models, W, priors."""
    _ran(_sensitive_party, EXAMPLES)


H = 4  # FedSC's representation size in the fuzz


@fuzz(EXAMPLES // 2)
@given(data=st.data())
def _fedsc(data: st.DataObject) -> None:
    base = silo(data, low=0.0, high=0.1, num_features=64)
    d_prime = replaced(data, base, (0.0, 0.5, 1.0))
    epsilon, delta, _ = data.draw(st.sampled_from(PROFILES[:2]), label="epsilon, delta")
    rounds = data.draw(st.integers(1, 2), label="rounds")
    run = {
        "epsilon": epsilon,
        "delta": delta,
        "total_rounds": rounds,
        "planned_shares": rounds,
        "projection_dim": H,
        "views": data.draw(st.sampled_from((1, 2)), label="views"),
        "mu": scalar(data, "fedsc", "mu", POSITIVE),
        "calr_sampling_rate": data.draw(st.sampled_from((1.0, 0.5)), label="calr sampling rate"),
        "calr_relation": data.draw(st.sampled_from(("replace_one", "add_remove")), label="calr relation"),
    }
    spec = [(name, value.shape) for name, value in ms.ssl_model(64, projection_dim=H).items()]

    def messages(twins: ms.Twins) -> None:
        for t in range(1, rounds + 1):
            params = arrays(data, spec, f"round {t} model")
            exchange(twins, "fedsc", msg.CORRELATION, ms.correlation(params, server_round=t, **run), t)

    case("fedsc", base, d_prime, messages)


@pytest.mark.slow
def test_fedsc_correlation_behaves_the_same_on_neighbouring_silos() -> None:
    """FedSC's DP-CalR share (a record replaced): forged SSL models, mu, views, sampling rate and relation."""
    _ran(_fedsc, EXAMPLES // 2)


ALGORITHMS = (
    "dp-fedsgd",
    "fedfdp",
    "steffle",
    "tran",
    "mu2fl",
    "noisy-sgd",
    "sensitive-party",
    "fedsc",
)
