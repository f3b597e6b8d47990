"""A silo operator's policy: what the silo answers, whatever the server asks (pure; no Flower, no torch).

The server names the job; the silo's operator decides what the silo will do for any job. The policy is a TOML file
(`silofl silo start --policy FILE`; in simulation `silofl run ... --silo-policy FILE` for every simulated silo), read
and validated before the silo joins anything, so a mistake in it stops the silo at start with the key named:

.. code-block:: toml

    lifetime-epsilon = 4.0        # the silo's total over every job it ever answers (its lifetime ledger), under
                                  # replacing one record: a DP-FedSGD job of epsilon 1 (add/remove) costs 1.2-2 here
    lifetime-delta = 1e-6         # the delta of that total (required with lifetime-epsilon)
    max-epsilon-per-job = 2.0     # a job asking for more is calibrated for this (more noise), never refused for it
    max-delta = 1e-5              # default 1/n_j (n_j: the silo's training records); a job asking more is refused
    algorithms = ["dp-fedsgd"]    # default with a budget: the algorithms whose releases are noised for this node's data
    protect = "record"            # answer only jobs whose every release is noised over the whole record (SteFFLe and
                                  # Tran et al. with protect = record, DP-FedSGD, ...), never with epsilon = inf
    allow-trusted-server = false  # DP-mu2-FL's trusted mode sends the momentum un-noised
    evaluation = "noised"         # "noised" | "exact" | "refuse"; default "noised" with a budget, else "exact"
    evaluation-noise = 20.0       # std of the Gaussian noise on each confusion count of a noised evaluation
    evaluation-loss-bound = 10.0  # a test record's loss is clipped to this in a noised evaluation
    model-modules = ["mypkg.models"]  # the user models (--model MODULE:FACTORY) this node may import: a module or a
                                  # package (and its submodules); default none, a deployed node refuses them

A *budget* is a finite `lifetime-epsilon` or `max-epsilon-per-job`. Without one, and without a policy at all, a silo
behaves as it did before policies existed (simulation gives the same numbers). A policy the silo cannot satisfy for a
job (an algorithm it does not allow, a delta above `max-delta`, a job its lifetime budget cannot hold, a trusted
server it does not allow) stops that job before anything is released, with an error naming the key and the value the
server asked for (`client.silo_policy`).

`protect = "record"` is the operator's floor on what the noise covers: a job whose releases are not all noised over
the node's whole records is refused, whatever the server's instruction says and even if `algorithms` lists the
algorithm (a SteFFLe or Tran et al. job with `protect` = sensitive sends its loss gradient un-noised), and so is a
job calibrated for no noise. The default (no key) leaves that to `algorithms` and the budget, as before.

`model-modules` is not about privacy but about code: a run's `--model MODULE:FACTORY` makes every silo import
MODULE and call FACTORY, i.e. run code the server names. A deployed node does it only for the modules its operator
lists (installed there for the purpose); a simulated silo, which runs in the user's own processes, always may.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

EVALUATION_MODES = ("noised", "exact", "refuse")
#: A dotted module path (`model-modules`).
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: std of the Gaussian noise on each count of a noised evaluation, unless the policy says otherwise: about 1 % of
#: accuracy on a test split of 5,000 records (8 cells), and an epsilon of about 0.3 per evaluation at delta 1e-6.
DEFAULT_EVALUATION_NOISE = 20.0
#: A test record's loss is clipped to this (nats) in a noised evaluation, so that one record moves the loss sum by at
#: most this much (cross-entropy is unbounded).
DEFAULT_EVALUATION_LOSS_BOUND = 10.0
#: Keys that earlier versions read and this one does not, with what to do (a policy naming one is refused, not
#: silently half-applied).
REMOVED_KEYS = {
    "evaluation-groups-epsilon": "it set the randomized response of a sensitive party's test groups, which the "
    "separate parties no longer send (they evaluate on the records sealed to them at setup); delete the line",
}


class PolicyError(ValueError):
    """A policy file that cannot be read or is not valid: the message names the file, the key and the fix."""


class SiloPolicy(BaseModel):
    """The operator's policy (module docstring). ``None`` fields take their defaults from the job or the silo's data
    (:meth:`max_delta_for`, :meth:`evaluation_mode`, :meth:`allows`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    lifetime_epsilon: float = Field(default=math.inf, alias="lifetime-epsilon", gt=0)
    lifetime_delta: float | None = Field(default=None, alias="lifetime-delta", gt=0, lt=1)
    max_epsilon_per_job: float = Field(default=math.inf, alias="max-epsilon-per-job", gt=0)
    max_delta: float | None = Field(default=None, alias="max-delta", ge=0, lt=1)
    algorithms: tuple[str, ...] | None = None
    protect: Literal["sensitive", "record"] | None = None
    allow_trusted_server: bool = Field(default=False, alias="allow-trusted-server")
    evaluation: Literal["noised", "exact", "refuse"] | None = None
    evaluation_noise: float = Field(default=DEFAULT_EVALUATION_NOISE, alias="evaluation-noise", gt=0, le=1e6)
    evaluation_loss_bound: float = Field(
        default=DEFAULT_EVALUATION_LOSS_BOUND, alias="evaluation-loss-bound", gt=0, le=1e6
    )
    model_modules: tuple[str, ...] = Field(default=(), alias="model-modules")

    @field_validator("model_modules")
    @classmethod
    def _module_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _MODULE.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a module name (a dotted Python module or package path such as mypkg.models; "
                    "no ':FACTORY', no wildcard)"
                )
        return value

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        from silofl.protocols import algorithms

        names = []
        for name in value:
            try:
                names.append(algorithms.get(name).name)
            except KeyError as exc:
                raise ValueError(str(exc).strip("'\"")) from None
        return tuple(dict.fromkeys(names))

    @model_validator(mode="after")
    def _lifetime_delta_with_epsilon(self) -> SiloPolicy:
        if math.isfinite(self.lifetime_epsilon) and self.lifetime_delta is None:
            raise ValueError(
                "lifetime-epsilon needs lifetime-delta: the delta of the silo's total over all its jobs (e.g. 1e-6, "
                "well below 1/n for n records)"
            )
        if not math.isfinite(self.lifetime_epsilon) and self.lifetime_delta is not None:
            raise ValueError("lifetime-delta is set without lifetime-epsilon: set both, or neither")
        return self

    # -- what the policy says ------------------------------------------------------------------------------------------

    @property
    def has_budget(self) -> bool:
        """Whether the operator set a budget (a finite lifetime or per-job epsilon)."""
        return math.isfinite(self.lifetime_epsilon) or math.isfinite(self.max_epsilon_per_job)

    @property
    def job_epsilon_cap(self) -> float:
        """The most epsilon one job may spend, in the job's own accounting: `max-epsilon-per-job` (inf: none). The
        lifetime budget is not a per-job cap: it is measured under replacing one record, where a job of epsilon 1
        under add/remove costs up to about 2 (`client.lifetime_ledger`), and it admits or refuses a job whole."""
        return self.max_epsilon_per_job

    def evaluation_mode(self) -> str:
        """How the silo answers evaluations: the policy's choice, else ``noised`` with a budget and ``exact``
        without (today's behaviour)."""
        if self.evaluation is not None:
            return self.evaluation
        return "noised" if self.has_budget else "exact"

    def max_delta_for(self, records: int) -> float | None:
        """The largest delta a job may ask of a node holding `records` training records: `max-delta`, else 1/n_j
        with a budget (a larger delta lets a mechanism publish a record outright), else none (None)."""
        if self.max_delta is not None:
            return self.max_delta
        if self.has_budget:
            return 1.0 / max(records, 1)
        return None

    def allows(self, algorithm: str, role: str, protect: str = "sensitive") -> bool:
        """Whether the node answers `algorithm` (a registry name) in `role` for a job whose `protect` is `protect`:
        with `protect = "record"` in the policy only jobs whose every release is noised over everything a node of
        `role` holds (:meth:`covers_whole_records`); then the listed algorithms, else with a budget the jobs whose
        releases are so noised, else every algorithm."""
        whole = self.covers_whole_records(algorithm, role, protect)
        if self.protect == "record" and not whole:
            return False
        if self.algorithms is not None:
            return algorithm in self.algorithms
        if not self.has_budget:
            return True
        return whole

    @staticmethod
    def covers_whole_records(algorithm: str, role: str, protect: str = "sensitive") -> bool:
        """Whether every release of `algorithm` in `role` is noised over everything the node holds, for a job whose
        `protect` is `protect` (`Algorithm.noised_roles`)."""
        from silofl.protocols import algorithms

        return role in algorithms.get(algorithm).noised_roles(protect)

    def allows_model_module(self, module: str) -> bool:
        """Whether a deployed node may import `module` for a user's model: it, or a package above it, is listed in
        `model-modules` (``mypkg`` allows ``mypkg.models``; ``mypkg.models`` does not allow ``mypkg``)."""
        return any(module == allowed or module.startswith(allowed + ".") for allowed in self.model_modules)

    def allowed_algorithms(self, role: str, protect: str = "sensitive") -> list[str]:
        """The registry names this policy answers in `role` for jobs whose `protect` is `protect` (for messages and
        `silofl silo budget`)."""
        from silofl.protocols import algorithms

        return [name for name in algorithms.names() if self.allows(name, role, protect)]

    def summary(self) -> dict[str, object]:
        """The policy as its TOML keys, defaults resolved where they do not depend on the data (for reports)."""
        out = self.model_dump(by_alias=True)
        out["evaluation"] = self.evaluation_mode()
        return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}


#: The policy of a node without a policy file: no budget, every algorithm, exact evaluations.
PERMISSIVE = SiloPolicy()


def parse_policy(values: dict, *, source: str = "policy") -> SiloPolicy:
    """A policy from its TOML keys; PolicyError naming `source`, each bad key and what it must be."""
    try:
        return SiloPolicy.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(the whole policy)"
            if error["type"] == "extra_forbidden" and key in REMOVED_KEYS:
                problems.append(f"'{key}' is no longer read: {REMOVED_KEYS[key]}")
            elif error["type"] == "extra_forbidden":
                known = ", ".join(sorted(f.alias or n for n, f in SiloPolicy.model_fields.items()))
                problems.append(f"unknown key '{key}' (the keys are: {known})")
            else:
                problems.append(f"'{key}': {error['msg']} (got {error.get('input')!r})")
        raise PolicyError(f"{source}: " + "; ".join(problems)) from None


def load_policy(path: str | Path) -> SiloPolicy:
    """Read and validate the policy file at `path` (TOML); PolicyError naming the file and the key."""
    file = Path(path).expanduser()
    try:
        values = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise PolicyError(f"silo policy {file}: no such file (give the path of a TOML policy file)") from None
    except OSError as exc:
        raise PolicyError(f"silo policy {file}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"silo policy {file}: not valid TOML ({exc})") from None
    return parse_policy(values, source=f"silo policy {file}")
