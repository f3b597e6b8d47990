"""Server checkpoints: the state after a completed round, written atomically, so that a restarted server continues.

A run with an `out-dir` keeps its checkpoint in `OUT/checkpoint/`:

* `state.npz`: the model arrays, the strategy's own arrays (:meth:`~strategies.base.SiloflStrategy.state_arrays`:
  SteFFLe's W, DP-mu2-FL's w, x and x_prev, FedSC's correlation cache and FedAdam's moments, ...) and a JSON
  metadata block (the run config, the number of rounds and delta, the federation the run was set up with, the last
  completed round, the silos' latest privacy reports, SteFFLe's noised group counts, the elapsed time). Written to
  a temporary file, flushed to disk, then renamed over the previous one: a server that dies while writing leaves the
  previous checkpoint intact.
* `rounds.jsonl`: one line per completed round (the per-round record of result.json), appended. The metadata says
  how many bytes of it belong to the checkpoint, so lines appended by a server that died before renaming
  `state.npz` are ignored (and cut off when the run resumes). Appending keeps a checkpoint O(1) per round in runs of
  tens of thousands of rounds.

On the in-process engine the checkpoint also holds the simulated silos' own state (their ledgers, calibrations,
DP-mu2-FL momentum, ...; :meth:`server.inprocess_grid.InProcessGrid.silo_states`), taken after the same round: in
simulation the server and the silos are one process and die together, so a restarted `silofl run --resume` puts
both back. Silos with a `state-dir` (deployed ones) keep their own state on disk instead (:mod:`client.privacy_state`).

There is no random-number state to save: every draw the server makes is a function of (seed, round) (DP-mu2-FL's
trusted-server noise in simulation, FedSC's participants) or comes from the operating system's entropy (a deployed
trusted server), and the silos derive or keep their own. A resumed run therefore equals the uninterrupted one bit for
bit on the in-process engine (tests/system/test_faults.py).

`checkpoint-every` = n > 0 writes after every n-th round; 0 (the default) after a round once `AUTO_SECONDS` have
passed since the last write: every round in a deployment (rounds take seconds), a few writes per second at most in
simulation. A run that stops with a RoundError writes the state after its last completed round before it reports
the error, and the last round is always written.

Resuming (`resume = true`, or `silofl run ... --resume DIR`) needs the same run config (only `out-dir`, `resume`,
`round-timeout` and `checkpoint-every` may differ) and the same federation: the silos answer the setup round again
(node ids may have changed) and must describe the same data. SteFFLe's group counts are not asked for again (the silos
spent budget on them once); they come from the checkpoint. FedSC's round has two exchanges (the correlation share,
then the train message) and is checkpointed after both: a resumed FedSC round asks for its share again with the same
request, which simulated silos (put back as of the previous round) compute again with the same draws and silos with
a `state-dir` replay from their journal, charging nothing twice.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import log

from silofl.protocols import messages as msg
from silofl.protocols.config import ConfigError, RunConfig
from silofl.protocols.record_codec import decode_record, encode_record
from silofl.strategies.base import SiloflStrategy
from silofl.strategies.federation import Federation, RoundError, RoundRecord, RunHistory

FORMAT = 1
CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.npz"
ROUNDS_FILE = "rounds.jsonl"
AUTO_SECONDS = 2.0
#: Run-config keys a resumed run may change: where it writes, how long it waits, how often it checkpoints.
OPERATIONAL_KEYS = frozenset({"out_dir", "resume", "round_timeout", "checkpoint_every"})
_META = "__meta__"
_MODEL = "model::"
_STRATEGY = "strategy::"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or belongs to another run; the message names the file and the fix."""


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


# -- writing ----------------------------------------------------------------------------------------------------------


@dataclass
class _Snapshot:
    """The server's state right after one completed round (kept in memory, written according to the policy)."""

    server_round: int
    model: ArrayRecord  # referenced: the strategy builds a new record every round, it never changes one
    strategy: dict[str, np.ndarray]
    silo_reports: dict[int, msg.TrainReport]
    silo_states: dict[int, dict[str, Any]] | None


@dataclass
class CheckpointWriter:
    """Takes a snapshot after every completed round and writes it to `out_dir/checkpoint/` by the policy."""

    out_dir: Path
    config: RunConfig
    federation: Federation
    rounds: int
    delta: float
    group_counts: np.ndarray | None = None
    elapsed_before: float = 0.0
    resumed_from: int = 0
    silo_states: Callable[[], dict[int, dict[str, Any]]] | None = None
    _snapshot: _Snapshot | None = field(default=None, init=False)
    _written_round: int = field(default=0, init=False)
    _written_lines: int = field(default=0, init=False)
    _rounds_bytes: int = field(default=0, init=False)
    _last_write: float = field(default_factory=time.monotonic, init=False)
    _t0: float = field(default_factory=time.perf_counter, init=False)
    _history: RunHistory | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.directory = checkpoint_dir(self.out_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        rounds_path = self.directory / ROUNDS_FILE
        if self.resumed_from:
            # Keep exactly the lines of the checkpoint we resume from (drop those of rounds it never committed).
            meta = _read_meta(self.directory / STATE_FILE)
            with open(rounds_path, "r+b") as fh:
                fh.truncate(meta["rounds_bytes"])
            self._rounds_bytes = meta["rounds_bytes"]
            self._written_round = self._written_lines = meta["completed"]
        else:
            # A new run in this out-dir: an earlier run's checkpoint must not survive into this one. Silos that keep
            # their state (node config `state-dir`) refuse to answer rounds of that earlier run again by themselves.
            _warn_unfinished(self.directory / STATE_FILE)
            (self.directory / STATE_FILE).unlink(missing_ok=True)
            rounds_path.write_bytes(b"")

    def after_round(self, strategy: SiloflStrategy, history: RunHistory) -> None:
        """Snapshot the state after the round `history` just recorded; write it if the policy says so."""
        record = history.rounds[-1]
        self._history = history
        self._snapshot = _Snapshot(
            server_round=record.server_round,
            model=history.arrays,
            strategy=strategy.state_arrays(),
            silo_reports=dict(history.silo_reports),
            silo_states=self.silo_states() if self.silo_states is not None else None,
        )
        every = self.config.checkpoint_every
        due = record.server_round % every == 0 if every > 0 else time.monotonic() - self._last_write >= AUTO_SECONDS
        if due or record.server_round >= self.rounds:
            self.write()

    def write(self) -> Path | None:
        """Write the latest snapshot (no-op if it is already on disk); the path of `state.npz`."""
        snap, history = self._snapshot, self._history
        path = self.directory / STATE_FILE
        if snap is None or history is None or snap.server_round == self._written_round:
            return path if path.exists() else None
        lines = history.rounds[self._written_lines : snap.server_round]
        if lines:
            text = "".join(json.dumps(_round_to_json(r)) + "\n" for r in lines).encode()
            with open(self.directory / ROUNDS_FILE, "ab") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            self._rounds_bytes += len(text)
            self._written_lines = snap.server_round
        meta = {
            "format": FORMAT,
            "config": self.config.to_json(),
            "rounds": self.rounds,
            "delta": self.delta,
            "completed": snap.server_round,
            "rounds_bytes": self._rounds_bytes,
            "federation": _federation_json(self.federation),
            "silo_reports": {str(k): r.model_dump(by_alias=True) for k, r in sorted(snap.silo_reports.items())},
            "group_counts": None if self.group_counts is None else np.asarray(self.group_counts).tolist(),
            "elapsed_seconds": self.elapsed_before + time.perf_counter() - self._t0,
            "resumed_from": self.resumed_from,
            "written_at": time.time(),
            "silo_states": None
            if snap.silo_states is None
            else {
                str(pid): {name: encode_record(rec) for name, rec in records.items()}
                for pid, records in sorted(snap.silo_states.items())
            },
        }
        arrays = {_MODEL + k: a.numpy() for k, a in snap.model.items()}
        arrays |= {_STRATEGY + k: v for k, v in snap.strategy.items()}
        arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        _atomic_savez(path, arrays)
        self._written_round = snap.server_round
        self._last_write = time.monotonic()
        return path


def _warn_unfinished(path: Path) -> None:
    if not path.is_file():
        return
    try:
        meta = _read_meta(path)
    except (OSError, ValueError, KeyError):
        return
    if int(meta.get("completed", 0)) < int(meta.get("rounds", 0)):
        log(
            WARNING,
            "starting a new run over the checkpoint of a run that stopped after round %s of %s in %s (resume=true "
            "would have continued it)",
            meta.get("completed"),
            meta.get("rounds"),
            path.parent.parent,
        )


def _round_to_json(record: RoundRecord) -> dict[str, Any]:
    return {
        "round": record.server_round,
        "seconds": record.seconds,
        "lr": record.lr,
        "epsilon_spent": record.epsilon_spent,
        "evaluation": record.evaluation,
    }


def _round_from_json(d: Mapping[str, Any]) -> RoundRecord:
    return RoundRecord(
        server_round=int(d["round"]),
        seconds=float(d["seconds"]),
        lr=d["lr"],
        epsilon_spent=d["epsilon_spent"],
        evaluation=d["evaluation"],
    )


def _federation_json(federation: Federation) -> list[dict[str, Any]]:
    return [
        {
            "silo_id": e.info.silo_id,
            "n_train": e.info.n_train,
            "n_test": e.info.n_test,
            "schema_hash": e.info.schema_hash,
        }
        for e in federation.silos
    ]


def _atomic_savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


# -- reading ----------------------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A checkpoint read back from disk: everything a restarted server needs to continue the run."""

    path: Path
    config: dict[str, Any]
    rounds: int
    delta: float
    completed: int
    federation: list[dict[str, Any]]
    silo_reports: dict[int, msg.TrainReport]
    group_counts: np.ndarray | None
    elapsed_seconds: float
    model: dict[str, np.ndarray]
    strategy: dict[str, np.ndarray]
    history_rounds: list[RoundRecord]
    silo_states: dict[int, dict[str, Any]] | None = None

    def history(self) -> RunHistory:
        """The run's history up to the checkpoint's round, as `SiloflStrategy.start` continues it."""
        return RunHistory(
            arrays=self.model_record(),
            rounds=list(self.history_rounds),
            silo_reports=dict(self.silo_reports),
        )

    def model_record(self) -> ArrayRecord:
        return msg.arrays_record(self.model)

    def check_config(self, config: RunConfig) -> None:
        """Refuse to continue with a config that differs in anything but the operational keys."""
        saved = RunConfig.parse(self.config, other_algorithms="ignore")
        fields = type(config).model_fields
        if type(saved) is not type(config):
            differ = ["algorithm"]
        else:
            differ = [
                name
                for name in fields
                if name not in OPERATIONAL_KEYS and getattr(saved, name) != getattr(config, name)
            ]
        if differ:
            details = ", ".join(
                f"{fields[n].alias or n}: checkpoint {_show(getattr(saved, n))}, now {_show(getattr(config, n))}"
                for n in differ
            )
            raise ConfigError(
                f"cannot resume from {self.path}: the run config differs from the checkpoint's ({details}). Resume "
                "with the checkpoint's settings (its 'config' block), or start a new run in another out-dir"
            )

    def check_federation(self, federation: Federation) -> None:
        """The silos that answered the setup round must be the ones the checkpoint was written with."""
        now = _federation_json(federation)
        if now != self.federation:
            was = {d["silo_id"]: d for d in self.federation}
            got = {d["silo_id"]: d for d in now}
            problems = []
            for silo_id in sorted(set(was) | set(got)):
                if silo_id not in got:
                    problems.append(f"silo {silo_id} did not answer")
                elif silo_id not in was:
                    problems.append(f"silo {silo_id} was not part of the run")
                elif got[silo_id] != was[silo_id]:
                    fields = [k for k in got[silo_id] if got[silo_id][k] != was[silo_id][k]]
                    problems.append(f"silo {silo_id} now describes different data ({', '.join(fields)})")
            raise RoundError(
                f"cannot resume from {self.path}: the federation differs from the checkpoint's: {'; '.join(problems)}"
            )

    def check_run(self, rounds: int, delta: float) -> None:
        if rounds != self.rounds or delta != self.delta:
            raise RoundError(
                f"cannot resume from {self.path}: the run now has {rounds} rounds and delta {delta:g}, the checkpoint "
                f"{self.rounds} rounds and delta {self.delta:g}"
            )


def _show(value: Any) -> str:
    return "inf" if isinstance(value, float) and math.isinf(value) else repr(value)


def _read_meta(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as data:
        return json.loads(bytes(data[_META]).decode())


def load(out_dir: str | Path) -> Checkpoint:
    """Read the checkpoint of the run in `out_dir`; CheckpointError naming the file if it is missing or damaged."""
    directory = checkpoint_dir(out_dir)
    path = directory / STATE_FILE
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint to resume from: {path} does not exist (a run writes it after its rounds when it has an "
            "out-dir); drop 'resume' to start the run afresh"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data[_META]).decode())
            model = {k.removeprefix(_MODEL): data[k] for k in data.files if k.startswith(_MODEL)}
            strategy = {k.removeprefix(_STRATEGY): data[k] for k in data.files if k.startswith(_STRATEGY)}
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, this silofl reads {FORMAT}")
    completed = int(meta["completed"])
    try:
        raw = (directory / ROUNDS_FILE).read_bytes()[: int(meta["rounds_bytes"])]
        history_rounds = [_round_from_json(json.loads(line)) for line in raw.decode().splitlines()]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory / ROUNDS_FILE}: unreadable round records ({exc})") from None
    if [r.server_round for r in history_rounds] != list(range(1, completed + 1)):
        raise CheckpointError(
            f"{directory / ROUNDS_FILE}: holds rounds {[r.server_round for r in history_rounds][:5]}..., the "
            f"checkpoint says rounds 1..{completed}"
        )
    counts = meta.get("group_counts")
    try:
        states = meta.get("silo_states")
        silo_states = (
            None
            if states is None
            else {int(pid): {n: decode_record(r) for n, r in recs.items()} for pid, recs in states.items()}
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable silo states ({exc})") from None
    return Checkpoint(
        path=path,
        config=meta["config"],
        rounds=int(meta["rounds"]),
        delta=float(meta["delta"]),
        completed=completed,
        federation=meta["federation"],
        silo_reports={int(k): msg.TrainReport.model_validate(v) for k, v in meta["silo_reports"].items()},
        group_counts=None if counts is None else np.asarray(counts, dtype=np.float64),
        elapsed_seconds=float(meta["elapsed_seconds"]),
        model=model,
        strategy=strategy,
        history_rounds=history_rounds,
        silo_states=silo_states,
    )


def resume_config(config: RunConfig, directory: str | Path, *, out_given: bool) -> RunConfig:
    """`silofl run ... --resume DIR`: the command line's config, with `out-dir` = DIR and `resume` on.

    The remaining flags must describe the same run as the checkpoint (checked when the run starts, naming every key
    that differs)."""
    directory = str(directory)
    if out_given and Path(config.out_dir).resolve() != Path(directory).resolve():
        raise ConfigError(f"--resume {directory} continues the run in that folder; drop --out {config.out_dir}")
    if not (checkpoint_dir(directory) / STATE_FILE).is_file():
        raise CheckpointError(f"--resume {directory}: no checkpoint there ({checkpoint_dir(directory) / STATE_FILE})")
    return RunConfig.parse({**config.to_json(), "out-dir": directory, "resume": True})
