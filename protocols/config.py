"""The run configuration: what a user asks for, validated once at the boundary.

The same model validates every way a run is described: `silofl run ALG` flags, the `[tool.flwr.app.config]` table of
`pyproject.toml` and `flwr run . --run-config` overrides (Flower passes them to the ServerApp as
`context.run_config`, with kebab-case keys), sweep files and the `config` block of result.json. The model is the
algorithm's (`protocols.algorithms`): the common options (:mod:`protocols.options`) and its own, with its defaults.
An unknown, missing or out-of-range key is a :class:`ConfigError` that names the key and the allowed values, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import Field, ValidationError, model_validator

from silofl.protocols.options import BUILTIN_DATASETS, TABULAR_BUILTINS, CommonOptions


class ConfigError(ValueError):
    """A run configuration that cannot be run; the message names each bad key and what it accepts."""


class RunConfig(CommonOptions):
    """Everything needed to (re)run one federated job: the common options; each algorithm's subclass
    (`protocols.algorithms.get(name).config_model`) adds its own. Field names are the run-config keys with `-` for
    `_`. Build one with :meth:`parse`, which picks the algorithm's subclass."""

    algorithm: str = Field(min_length=1, description="the algorithm (silofl run --help lists them)")

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        if self.rounds and self.epochs:
            raise ValueError("give either 'rounds' or 'epochs', not both (set the other to 0)")
        if not self.rounds and not self.epochs:
            raise ValueError("give 'rounds' (communication rounds) or 'epochs' (passes over each silo's data)")
        is_file = self.dataset.endswith((".csv", ".parquet"))
        if not is_file and self.dataset not in BUILTIN_DATASETS:
            raise ValueError(
                f"'dataset' = {self.dataset!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}) nor a "
                ".csv/.parquet file"
            )
        if not is_file and self.missing != "error":
            raise ValueError(
                f"'missing' applies to a .csv/.parquet 'dataset'; the built-in dataset {self.dataset!r} handles its "
                "own missing values: drop the key"
            )
        if not is_file and self.target:
            raise ValueError(
                f"'target' is fixed for the built-in dataset {self.dataset!r}; drop it, or give your own table as a "
                ".csv/.parquet 'dataset' with its 'target' column"
            )
        if not is_file and self.dataset not in TABULAR_BUILTINS and (self.sensitive or self.features):
            raise ValueError(
                f"'sensitive' and 'features' choose columns of a tabular dataset ({', '.join(TABULAR_BUILTINS)} or a "
                f".csv/.parquet file); the image dataset {self.dataset!r} has no sensitive attribute: drop them"
            )
        if is_file and not (self.target and self.sensitive):
            raise ValueError(f"dataset '{self.dataset}' is a file: also give 'target' and 'sensitive' columns")
        check = self.spec.check
        if check is not None:
            check(self)
        return self

    @property
    def spec(self):  # -> protocols.algorithms.base.Algorithm
        """The algorithm's registry entry."""
        from silofl.protocols import algorithms

        return algorithms.get(self.algorithm)

    @property
    def private(self) -> bool:
        """Whether the silos add noise (a finite epsilon, or DP-mu2-FL's rho)."""
        return math.isfinite(self.target_epsilon) or float(getattr(self, "rho", 0.0)) > 0

    @property
    def target_epsilon(self) -> float:
        """The privacy target epsilon; inf for an algorithm that adds no noise."""
        return float(getattr(self, "epsilon", math.inf))

    @property
    def target_delta(self) -> float:
        """The configured delta (0: 1/n^2, resolved by the server); 0 for an algorithm that adds no noise."""
        return float(getattr(self, "delta", 0.0))

    @property
    def topology_name(self) -> str:
        """Who holds which division (SteFFLe's `topology`; "silos" for every other algorithm)."""
        return str(getattr(self, "topology", "silos"))

    @property
    def sensitive_nodes(self) -> int:
        """Separate sensitive parties of the run's topology (0: silos hold both divisions)."""
        count = getattr(self, "sensitive_count", None)
        return int(count(self.num_silos)) if count is not None else 0

    @property
    def num_nodes(self) -> int:
        """The nodes of the federation: the silos (or feature parties) and the separate sensitive parties."""
        return self.num_silos + self.sensitive_nodes

    @property
    def target_accountant(self) -> str:
        return str(getattr(self, "accountant", "none"))

    def to_run_config(self) -> dict[str, str | int | float | bool]:
        """Flower run-config form (kebab-case keys, only scalars; infinity as the string 'inf'): the algorithm and its
        options, nothing of other algorithms."""
        out: dict[str, str | int | float | bool] = {"algorithm": self.algorithm}
        for key, value in self.model_dump(by_alias=True).items():
            out[key] = "inf" if isinstance(value, float) and math.isinf(value) else value
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (the `config` block of result.json); `RunConfig.parse(...)` reads it back."""
        return self.to_run_config()

    @classmethod
    def parse(cls, values: Mapping[str, Any], *, other_algorithms: str = "error") -> RunConfig:
        """Validate a run config with the algorithm's model; raise :class:`ConfigError` naming each bad key.

        A key whose value is the empty string "" takes the algorithm's default (`pyproject.toml`'s run-config table
        lists every key of every algorithm that way, since Flower passes on only keys listed there). Giving `rounds`
        alone sets `epochs` to 0 and the other way round. A key of another algorithm (`lambda` for fedavg) is an error
        naming the algorithms it belongs to, or, with ``other_algorithms="ignore"``, dropped: for stored configs of
        older versions, which listed every key, and sweep files whose shared tables serve several algorithms.
        """
        from silofl.protocols import algorithms

        if not isinstance(values, Mapping):
            kind = type(values).__name__
            raise ConfigError(f"invalid run configuration: expected a table of key = value, got {kind}")
        values = {_canonical(str(k)): v for k, v in values.items() if not (isinstance(v, str) and v == "")}
        if "algorithm" not in values:
            raise ConfigError(f"invalid run configuration:\n  - missing key 'algorithm': give one of {_names()}")
        name = values["algorithm"]
        try:
            if not isinstance(name, str):
                raise KeyError(f"an algorithm is named by a string, got {type(name).__name__}")
            spec = algorithms.get(name)
        except KeyError as exc:
            raise ConfigError(
                f"invalid run configuration:\n  - key 'algorithm' = {name!r}: {exc.args[0]}; allowed: {_names()}"
            ) from None
        model = spec.config_model
        values["algorithm"] = spec.name
        own = _keys(model)
        problems = []
        for key in list(values):
            if key in own:
                continue
            owners = [s for s in algorithms.specs() if key in _keys(s.config_model)]
            if owners and (other_algorithms == "ignore" or all(_is_default(s, key, values[key]) for s in owners)):
                del values[key]  # ignored, or it asks for what every algorithm having it does anyway (epsilon = inf)
            elif owners:
                problems.append(
                    f"  - key '{key}' is an option of {', '.join(s.name for s in owners)}, not of {spec.name}; drop it "
                    f"(`silofl run {spec.name} --help` lists {spec.name}'s options)"
                )
        if problems:
            raise ConfigError("invalid run configuration:\n" + "\n".join(problems))
        if values.get("rounds") and "epochs" not in values:
            values["epochs"] = 0.0
        elif values.get("epochs") and "rounds" not in values:
            values["rounds"] = 0
        try:
            return model.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, model)) from None


def _is_default(spec: Any, key: str, value: Any) -> bool:
    """Whether `value` is the default of `key` for algorithm `spec` (numbers as numbers: "inf" is infinity)."""
    field = spec.config_model.model_fields["lam" if key == "lambda" else key.replace("-", "_")]
    default = field.default
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, int | float):
        try:
            return float(value) == float(default)
        except (TypeError, ValueError):
            return False
    return value == default


def flower_run_config() -> dict[str, str]:
    """`pyproject.toml`'s `[tool.flwr.app.config]`: every key of every registered algorithm, each "" (the run's
    algorithm's default) but the algorithm `flwr run .` runs without overrides and its out-dir. Flower passes on
    only keys listed there; tests/protocols/test_config.py checks the file against this."""
    table = {key: "" for key in sorted(all_keys())}
    table["algorithm"] = "dp-fedsgd"
    table["out-dir"] = "runs/flwr"  # a `flwr run .` writes its result.json there unless told otherwise
    return table


def _keys(model: type[RunConfig]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def _names() -> str:
    from silofl.protocols import algorithms

    return ", ".join(algorithms.names())


def _canonical(key: str) -> str:
    """`num_silos` and `num-silos` are the same key; `lam` is `lambda`."""
    key = key.replace("_", "-")
    return "lambda" if key == "lam" else key


def all_keys() -> dict[str, list[str]]:
    """Every run-config key of every registered algorithm -> the algorithms that have it."""
    from silofl.protocols import algorithms

    out: dict[str, list[str]] = {}
    for spec in algorithms.specs():
        for key in sorted(_keys(spec.config_model)):
            out.setdefault(key, []).append(spec.name)
    return out


def allowed_values(key: str, model: type[RunConfig] = RunConfig) -> str:
    """Human description of what run-config key `key` of `model` accepts (for error messages and `--help`)."""
    name = "lam" if key == "lambda" else key.replace("-", "_")
    field = model.model_fields.get(name)
    if field is None:
        return "one of the keys " + ", ".join(sorted(_keys(model)))
    choices = get_args(field.annotation)
    if choices and all(isinstance(c, str) for c in choices):
        return "one of " + ", ".join(repr(c) for c in choices)
    bounds = []
    for meta in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >=")):
            if getattr(meta, attr, None) is not None:
                bounds.append(f"{sym} {getattr(meta, attr)}")
    kind = getattr(field.annotation, "__name__", str(field.annotation))
    text = f"{kind} " + " and ".join(bounds) if bounds else kind
    return text + (f" ({field.description})" if field.description else "")


#: Options earlier versions had, with what replaced them: a configuration naming one is told so, not "did you mean".
REMOVED_OPTIONS = {
    "share-rows": "separate parties always exchange their records sealed at setup (the rows-through-the-server modes "
    "sampled and all were removed); drop the option",
    "keep-rate": "it thinned the rows of the removed rows-through-the-server modes; a sensitive party now samples the "
    "records sealed to it at the silos' rate itself; drop the option",
}


def _explain(exc: ValidationError, model: type[RunConfig]) -> str:
    lines = ["invalid run configuration:"]
    known = sorted(_keys(model))
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden" and key in REMOVED_OPTIONS:
            lines.append(f"  - '{key}' is no longer an option: {REMOVED_OPTIONS[key]}")
        elif err["type"] == "extra_forbidden":
            own, anywhere = _closest(key, known), _closest(key, sorted(all_keys()))
            close = anywhere if anywhere and (not own or _ratio(key, anywhere) > _ratio(key, own)) else own
            hint = f" (did you mean '{close}'?)" if close else ""
            if close and close not in known:
                hint = f" (did you mean '{close}'? an option of {', '.join(all_keys()[close])}, not of this algorithm)"
            lines.append(f"  - unknown key '{key}'{hint}; known keys: {', '.join(known)}")
        elif err["type"] == "missing":
            lines.append(f"  - missing key '{key}': give {allowed_values(key, model)}")
        elif not key:
            lines.append(f"  - {err['msg'].removeprefix('Value error, ')}")
        else:
            problem = err["msg"].removeprefix("Value error, ")
            lines.append(f"  - key '{key}' = {err.get('input')!r}: {problem}; allowed: {allowed_values(key, model)}")
    return "\n".join(lines)


def _closest(key: str, known: list[str]) -> str | None:
    """The known key `key` is most likely a typo of: a close spelling (difflib), else one containing it."""
    norm = key.lower().replace("_", "-")
    close = difflib.get_close_matches(norm, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    return next((k for k in known if len(norm) > 3 and _similar(k, key)), None)


def _ratio(typed: str, key: str) -> float:
    return difflib.SequenceMatcher(None, typed.lower().replace("_", "-"), key).ratio()


def _similar(a: str, b: str) -> bool:
    a, b = a.lower().replace("_", "-"), b.lower().replace("_", "-")
    return a == b or (len(a) > 3 and (a in b or b in a))
