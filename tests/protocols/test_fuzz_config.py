"""Fuzzing of the run configuration (protocols/config.py: RunConfig.parse).

Hypothesis generates run configs as a user, a TOML table or `flwr run --run-config` could give them: valid ones
(which must parse and survive the result.json round trip), one key with a wrong-typed, out-of-range, NaN or infinite
value, misspelled keys, and arbitrary JSON-like tables. Each must be accepted or refused with a ConfigError (never a
bare pydantic ValidationError, TypeError, ...) that names the key at fault; a key misspelled by one edit gets a
suggestion at most two edits away. The number of generated cases is counted and printed.
"""

from __future__ import annotations

import functools
import math
import typing
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from silofl.protocols import algorithms
from silofl.protocols.config import ConfigError, RunConfig, all_keys
from tests import fuzz_cases

#: Each algorithm's own option model: a key's type, bounds and default are the algorithm's (`lambda` >= 0 for both
#: steffle and tran, `model` 'logreg' only for mu2fl).
MODELS = {spec.name: spec.config_model for spec in algorithms.specs()}
ALIASES = {name: field.alias or name for model in MODELS.values() for name, field in model.model_fields.items()}
KNOWN = set(ALIASES.values()) | set(ALIASES)  # kebab-case keys; the python names are accepted too
#: Keys whose valid values do not depend on other keys (the others are set per algorithm in BASES).
FREE = [
    "num_silos",
    "partition",
    "heterogeneity",
    "classes_per_silo",
    "dirichlet_alpha",
    "max_train_records",
    "hidden",
    "batch_size",
    "lr",
    "lr_decay",
    "lr_decay_epochs",
    "local_epochs",
    "clip",
    "fairness",
    "lam",
    "w_radius",
    "w_lr",
    "counts_share",
    "domain_diameter",
    "projection_dim",
    "width",
    "momentum",
    "weight_decay",
    "grad_clip",
    "mu",
    "views",
    "alpha_start",
    "alpha_end",
    "share_start",
    "share_every",
    "participation",
    "calr_relation",
    "calr_sampling_rate",
    "local_steps",
    "server_optimizer",
    "server_lr",
    "eval_data",
    "device",
    "probe_epochs",
    "knn_k",
    "knn_tau",
    "delta",
    "accountant",
    "seed",
    "eval_every",
    "round_timeout",
]
#: A valid config of each algorithm this test knows (an algorithm added later is fuzzed through the others' keys).
BASES: list[dict[str, Any]] = [
    {"algorithm": "fedavg", "rounds": 3},
    {"algorithm": "fedavg", "epochs": 2.5, "model": "mlp"},
    {"algorithm": "dp-fedsgd", "epochs": 1, "epsilon": 1.0},
    {"algorithm": "dp-fedsgd", "rounds": 10, "epsilon": "inf", "dataset": "adult"},
    {"algorithm": "steffle", "rounds": 5, "epsilon": 2.0, "dataset": "x.csv", "target": "y", "sensitive": "s"},
    {"algorithm": "mu2fl", "rounds": 5, "rho": 4.0, "dataset": "digits"},
    {"algorithm": "noisy-sgd", "epochs": 1, "epsilon": 3.0, "dataset": "mnist"},
    {"algorithm": "fedsc", "rounds": 2, "model": "cnn", "dataset": "digits", "epsilon": 6.0},
    {"algorithm": "fedavg-sc", "rounds": 2, "model": "resnet20", "dataset": "cifar10"},
]
INF_OK = {"epsilon"}

CASES: Counter[str] = Counter()


fuzz = fuzz_cases.fuzz


_report_cases = fuzz_cases.summary_fixture(
    "silofl-fuzz-config-summary",
    lambda: (
        f"fuzz config: {CASES.total()} cases: {CASES['rejected']} bad run configs rejected with a ConfigError "
        f"naming the key, {CASES['accepted']} valid ones parsed and round-tripped"
    ),
)


_ran = functools.partial(fuzz_cases.run_counted, CASES)


def _fields(base: dict[str, Any]) -> dict[str, Any]:
    """The fields of the base config's algorithm."""
    return MODELS[base["algorithm"]].model_fields


def _bounds(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"ge": None, "gt": None, "le": None, "lt": None, "min_length": None}
    for meta in fields[name].metadata:
        for key in out:
            if getattr(meta, key, None) is not None:
                out[key] = getattr(meta, key)
    return out


def _kind(name: str, fields: dict[str, Any]) -> str:
    ann = fields[name].annotation
    if typing.get_origin(ann) is typing.Literal:
        return "literal"
    return {int: "int", float: "float", str: "str", bool: "bool"}[ann]


def valid_value(name: str, fields: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind, b = _kind(name, fields), _bounds(name, fields)
    if kind == "int":
        lo = b["ge"] if b["ge"] is not None else b["gt"] + 1
        hi = b["le"] if b["le"] is not None else 2**40
        return st.integers(lo, hi)
    if kind == "float":
        return st.floats(
            min_value=b["ge"] if b["ge"] is not None else b["gt"],
            max_value=b["le"] if b["le"] is not None else b["lt"],
            exclude_min=b["gt"] is not None,
            exclude_max=b["lt"] is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "literal":
        return st.sampled_from(typing.get_args(fields[name].annotation))
    if kind == "bool":
        return st.booleans()
    return st.text(max_size=10)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.strip().lower() in {"none"}
    return True


def invalid_value(name: str, fields: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values key `name` must refuse (run-config values are TOML/JSON scalars: numbers given as text are fine)."""
    kind, b = _kind(name, fields), _bounds(name, fields)
    junk = st.none() | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers())
    options: list[st.SearchStrategy[Any]] = [junk]
    if kind in ("int", "float"):
        # ("" is not bad: it asks for the algorithm's default, as pyproject's run-config table lists every key so)
        options += [st.booleans(), st.text(min_size=1, max_size=8).filter(lambda s: not _is_number(s))]
        if kind == "int":
            options.append(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()))
        else:
            options.append(st.just(math.nan) | st.just(-math.inf) | st.just("nan"))
            if name not in INF_OK:
                options.append(st.sampled_from([math.inf, "inf", "infinity"]))
        lower = b["ge"] if b["ge"] is not None else b["gt"]
        if lower is not None:
            below = (
                st.integers(max_value=lower - 1)
                if kind == "int"
                else st.floats(max_value=lower, exclude_max=b["ge"] is not None, allow_nan=False, allow_infinity=False)
            )
            options.append(below)
        upper = b["le"] if b["le"] is not None else b["lt"]
        if upper is not None:
            above = (
                st.integers(min_value=upper + 1)
                if kind == "int"
                else st.floats(min_value=upper, exclude_min=b["le"] is not None, allow_nan=False, allow_infinity=False)
            )
            options.append(above)
    elif kind == "literal":
        choices = typing.get_args(fields[name].annotation)
        options += [
            st.integers(),
            st.floats(allow_nan=False),
            st.text(min_size=1, max_size=10).filter(lambda s: s not in choices),
        ]
    elif kind == "str":
        options += [st.integers(), st.floats(allow_nan=False)]
    else:  # bool
        options += [st.text(min_size=2, max_size=6).filter(lambda s: s.lower() not in _BOOL_WORDS), st.integers(2)]
    return st.one_of(options)


_BOOL_WORDS = {"0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"}


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    values = dict(draw(st.sampled_from(BASES)))
    fields = _fields(values)
    free = [name for name in FREE if name in fields]  # the algorithm's own keys
    for name in draw(st.lists(st.sampled_from(free), unique=True, max_size=8)):
        key = draw(st.sampled_from([ALIASES[name], name]))  # kebab-case, or the python name
        values[key] = draw(valid_value(name, fields))
    return values


# -- valid configs ------------------------------------------------------------------------------------------------
@fuzz(250)
@given(values=valid_configs())
def _valid_configs(values: dict[str, Any]) -> None:
    config = RunConfig.parse(values)
    again = RunConfig.parse(config.to_json())  # result.json's config block reruns the job
    assert again == config
    for value in config.to_run_config().values():  # Flower's run config holds scalars only
        assert isinstance(value, str | int | float | bool) and not (isinstance(value, float) and math.isnan(value))
    CASES["accepted"] += 1


def test_valid_configs_parse_and_roundtrip() -> None:
    _ran(_valid_configs, 250)


# -- one bad value ------------------------------------------------------------------------------------------------
@fuzz(600)
@given(base=st.sampled_from(BASES), data=st.data())
def _bad_values(base: dict[str, Any], data: st.DataObject) -> None:
    values, fields = dict(base), _fields(base)
    name = data.draw(st.sampled_from(sorted(fields)), label="key")  # one of the algorithm's own keys
    values.pop(name, None)
    key = data.draw(st.sampled_from([ALIASES[name], name]))
    values[key] = data.draw(invalid_value(name, fields), label=f"bad {key}")
    with pytest.raises(ConfigError) as err:
        RunConfig.parse(values)
    text = str(err.value)
    assert f"key '{key}'" in text or f"key '{ALIASES[name]}'" in text, f"{key} not named: {text}"
    assert "allowed:" in text
    CASES["rejected"] += 1


@pytest.mark.slow
def test_wrong_types_ranges_nan_and_inf_are_rejected_naming_the_key() -> None:
    _ran(_bad_values, 600)


def test_regressions_found_by_fuzzing() -> None:
    """What the fuzzing above first found accepted: infinities with no meaning, a bool as a number, a typo with no
    suggestion, a config that is not a table."""
    for key in ["clip", "w-radius", "mu", "round-timeout", "lr-decay-epochs", "knn-tau", "dirichlet-alpha"]:
        for algorithm in all_keys()[key]:  # each algorithm that has the key, with that algorithm's defaults
            with pytest.raises(ConfigError, match=f"key '{key}' = inf: Input should be a finite number"):
                RunConfig.parse({"algorithm": algorithm, "rounds": 2, key: math.inf})
    with pytest.raises(ConfigError, match="key 'rho' = inf"):
        RunConfig.parse({"algorithm": "mu2fl", "rounds": 2, "dataset": "digits", "rho": math.inf})
    with pytest.raises(ConfigError, match="key 'rounds' = True: a boolean is not a number"):
        RunConfig.parse({"algorithm": "fedavg", "rounds": True})
    with pytest.raises(ConfigError, match="unknown key 'epsilom' \\(did you mean 'epsilon'\\?\\)"):
        RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 2, "epsilom": 1.0})
    for values in [None, 5, [("algorithm", "fedavg")], "algorithm=fedavg"]:
        with pytest.raises(ConfigError, match="expected a table"):
            RunConfig.parse(values)  # type: ignore[arg-type]
    assert math.isinf(RunConfig.parse({"algorithm": "dp-fedsgd", "rounds": 2, "epsilon": "inf"}).epsilon)


# -- misspelled keys ----------------------------------------------------------------------------------------------
def _distance(a: str, b: str) -> int:
    """Optimal string alignment distance (edits: insert, delete, substitute, swap neighbours)."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


@st.composite
def typos(draw: st.DrawFn) -> tuple[str, str]:
    """(meant, typed): one edit of a key of length >= 5 (shorter keys have too many neighbours to guess from)."""
    meant = draw(st.sampled_from(sorted(k for k in ALIASES.values() if len(k) >= 5)))
    i = draw(st.integers(0, len(meant) - 1))
    letter = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz-"))
    edit = draw(st.sampled_from(["delete", "insert", "substitute", "swap"]))
    if edit == "delete":
        typed = meant[:i] + meant[i + 1 :]
    elif edit == "insert":
        typed = meant[:i] + letter + meant[i:]
    elif edit == "substitute":
        typed = meant[:i] + letter + meant[i + 1 :]
    else:  # swap characters i and i + 1
        i = min(i, len(meant) - 2)
        typed = meant[:i] + meant[i + 1] + meant[i] + meant[i + 2 :]
    return meant, typed


@fuzz(300)
@given(base=st.sampled_from(BASES), typo=typos())
def _typos(base: dict[str, Any], typo: tuple[str, str]) -> None:
    meant, typed = typo
    if typed in KNOWN or typed.replace("_", "-") in KNOWN:
        return
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**base, typed: 1})
    text = str(err.value)
    assert f"unknown key '{typed}' (did you mean '" in text, text
    suggested = text.split(f"unknown key '{typed}' (did you mean '")[1].split("'")[0]
    assert suggested in KNOWN
    assert _distance(typed, suggested) <= 2, (typed, meant, suggested)  # `meant` is one edit away
    CASES["rejected"] += 1


def test_misspelled_keys_get_a_close_suggestion() -> None:
    _ran(_typos, 300)


# -- arbitrary tables ---------------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
keys = st.sampled_from(sorted(KNOWN)) | st.text(max_size=12)


@fuzz(400)
@given(values=st.dictionaries(keys, json_values, max_size=8), base=st.sampled_from([{}, *BASES]))
def _arbitrary_tables(values: dict[str, Any], base: dict[str, Any]) -> None:
    table = {**base, **values}
    try:
        RunConfig.parse(table)
    except ConfigError as err:
        text = str(err)
        lines = text.split("\n  - ")[1:]  # (a key may itself hold line breaks)
        assert lines, text
        for line in lines:  # each problem names a key, or (a combination rule) the keys it involves
            assert "key '" in line or "'" in line, line
        CASES["rejected"] += 1
    else:
        CASES["accepted"] += 1


@pytest.mark.slow
def test_arbitrary_tables_parse_or_raise_config_error() -> None:
    _ran(_arbitrary_tables, 400)
