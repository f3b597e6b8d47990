"""Load: many simulated silos for many rounds on one machine; peak memory, seconds per round, and a leak check.

    SILOFL_DATA_DIR=../shared/data python benchmarks/load.py [--silos 50] [--rounds 100] [--dataset adult]
        [--algorithms dp-fedsgd,fedavg] [--ray dp-fedsgd] [--tracemalloc dp-fedsgd] [--batch-size 64]
        [--out docs/LOAD.md] [--json FILE]

Each of `--algorithms` runs on the in-process engine, each of `--ray` on Flower's Ray simulation engine, each of
`--tracemalloc` in-process again with the Python heap traced. Every run is one `silofl run` job through the real
ServerApp, strategies and ClientApp (`server.engines.run_job`), in a fresh Python process of its own, so that its
peak memory is its own and one run's caches do not help the next. Per run it reports:

* seconds per round: the strategy's own wall time of each round (`rounds[*].seconds` of result.json: the train
  round trip, and on evaluation rounds the federated evaluation too; evaluation every `rounds / 20` rounds, the
  default). Round 1 is shown apart (each silo calibrates its noise there), then mean, median, p95 and max over
  rounds 2..R; "outside rounds" = the rest of the job's wall time (imports, for Ray the cluster's start, loading
  and partitioning the data, the setup round, the result);
* memory: the resident set size (RSS, `/proc/self/statm`) after setup and after every round, and the process's peak
  RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, or the largest sample if that is higher: the kernel updates its
  high-water mark lazily). For the Ray engine the silos run in Ray worker processes, so the
  sum over the benchmark's whole process tree (Ray's GCS, raylet and workers included) is sampled too, as RSS and as
  PSS (`/proc/PID/smaps_rollup`: shared pages divided among the processes that share them, so the sum does not count
  torch's libraries once per worker), with the PSS of each kind of process (driver, Ray workers, raylet, ...) at
  round 10 and at the last round, to say where memory grows;
* leak check: the memory after round 10 against after the last round, and the least-squares slope over rounds
  10..R (KB per round), both after `gc.collect()`. A `--tracemalloc` run starts tracing the Python heap (Python
  objects and numpy arrays; torch's own allocator is not traced) after round 9, so the traced memory at round R
  minus round 10 is what rounds 10..R allocated and still hold. Tracing makes rounds about 10 times slower: these
  rows' times are not the benchmark's.

The benchmark hooks into the ServerApp's progress callback (`server.progress.RunProgress`, which the ServerApp
calls after every round), so nothing in the measured code path changes. psutil is not a dependency: memory is read
from /proc (Linux only).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

MB = 1024.0 * 1024.0
#: The round after which the leak check starts: the first rounds fill caches (noise calibration, model shells,
#: the accountant's curves), which is growth by design, not a leak.
LEAK_START = 10
RESULT_PREFIX = "LOAD-RESULT "
#: Source lines listed as holding the traced Python heap at the last round (`--tracemalloc` runs).
HEAP_HOLDERS = 5
PRIVATE = {"dp-fedsgd": 1.0, "steffle": 1.0}
ALGORITHMS = ("fedavg", "dp-fedsgd", "steffle")


# ----------------------------------------------------------------------------------------------------------------
# Memory of this process and of its process tree, from /proc
# ----------------------------------------------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of one process (0 if it has gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int | str = "self") -> int:
    """Proportional set size of one process (shared pages split among their sharers); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        pass
    return 0


def peak_rss_bytes() -> int:
    """Peak RSS of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, their children, ...), from the ppid field of /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                stat = fh.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_memory(root: int | None = None) -> tuple[int, int, int]:
    """(RSS sum, PSS sum, number of processes) over `root` (default: this process) and all its descendants."""
    root = os.getpid() if root is None else root
    pids = [root, *descendants(root)]
    return sum(rss_bytes(p) for p in pids), sum(pss_bytes(p) for p in pids), len(pids)


def process_kind(pid: int) -> str:
    """A short name for a process of the benchmark's tree: this process ("driver"), or what Ray calls it (Ray
    renames its busy workers, e.g. `ray::ClientAppActor` for the silos' ClientApps)."""
    if pid == os.getpid():
        return "driver (ServerApp)"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "gone"
    text = " ".join(argv[:3])
    for needle, kind in (
        ("default_worker.py", "Ray worker (idle)"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs_server"),
        ("dashboard", "Ray dashboard"),
        ("log_monitor", "Ray log monitor"),
        ("monitor.py", "Ray monitor"),
        ("runtime_env", "Ray runtime env agent"),
    ):
        if needle in text:
            return kind
    return Path(argv[0]).name if argv else "?"


def pss_by_kind(root: int | None = None) -> dict[str, float]:
    """PSS bytes summed per :func:`process_kind` over `root` (default: this process) and its descendants."""
    root = os.getpid() if root is None else root
    out: dict[str, float] = {}
    for pid in [root, *descendants(root)]:
        kind = process_kind(pid)
        out[kind] = out.get(kind, 0.0) + pss_bytes(pid)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def round_time_stats(seconds: Sequence[float]) -> dict[str, float]:
    """Round 1 apart (it calibrates the noise); mean, median, p95 and max of rounds 2..R (of round 1 if R = 1)."""
    if not seconds:
        raise ValueError("no rounds to summarize")
    rest = list(seconds[1:]) or list(seconds)
    return {
        "first": seconds[0],
        "mean": statistics.fmean(rest),
        "p50": percentile(rest, 50),
        "p95": percentile(rest, 95),
        "max": max(rest),
    }


def growth(samples: Sequence[tuple[int, float]], start: int = LEAK_START) -> dict[str, float]:
    """Leak check over (round, bytes) samples: the change from round `start` (or the first sample after it) to the
    last round, and the least-squares slope over those rounds, in MB and KB per round."""
    window = [(r, b) for r, b in samples if r >= start]
    if len(window) < 2:
        nan = math.nan
        return {
            "from_round": nan,
            "to_round": nan,
            "from_mb": nan,
            "to_mb": nan,
            "delta_mb": nan,
            "slope_kb_per_round": nan,
        }
    rounds = [float(r) for r, _ in window]
    values = [float(b) for _, b in window]
    mr, mv = statistics.fmean(rounds), statistics.fmean(values)
    slope = sum((r - mr) * (v - mv) for r, v in zip(rounds, values, strict=True)) / sum((r - mr) ** 2 for r in rounds)
    return {
        "from_round": window[0][0],
        "to_round": window[-1][0],
        "from_mb": values[0] / MB,
        "to_mb": values[-1] / MB,
        "delta_mb": (values[-1] - values[0]) / MB,
        "slope_kb_per_round": slope / 1024.0,
    }


# ----------------------------------------------------------------------------------------------------------------
# One measured run (the worker)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSpec:
    """One measured job."""

    algorithm: str
    engine: str = "inprocess"
    silos: int = 50
    rounds: int = 100
    dataset: str = "adult"
    batch_size: int = 64
    data_dir: str = ""
    trace: bool = False
    seed: int = 0

    def run_config(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "algorithm": self.algorithm,
            "dataset": self.dataset,
            "data-dir": self.data_dir,
            "num-silos": self.silos,
            "rounds": self.rounds,
            "batch-size": self.batch_size,
            "seed": self.seed,
        }
        if self.algorithm in PRIVATE:
            values["epsilon"] = PRIVATE[self.algorithm]
        return values


@dataclass
class Sampler:
    """Memory after setup and after every round; called from the ServerApp's progress hooks."""

    checkpoints: frozenset[int]
    tree: bool = False
    trace_from: int | None = None  # start tracemalloc after this round's sample (None: no tracing)
    rss: list[tuple[int, float]] = field(default_factory=list)
    tree_rss: list[tuple[int, float]] = field(default_factory=list)
    tree_pss: list[tuple[int, float]] = field(default_factory=list)
    heap: list[tuple[int, float]] = field(default_factory=list)
    processes: int = 1
    peak_tree_rss: float = 0.0
    peak_tree_pss: float = 0.0
    eval_rounds: list[int] = field(default_factory=list)
    by_kind: dict[int, dict[str, float]] = field(default_factory=dict)  # checkpoint round -> PSS bytes per kind
    heap_holders: list[tuple[str, float, int]] = field(default_factory=list)  # (file:line, bytes, blocks) at the end

    def sample(self, server_round: int) -> None:
        """Round 0 = after setup. At the checkpoints (and round 0) collect garbage first, for a stable reading."""
        if server_round == 0 or server_round in self.checkpoints:
            gc.collect()
        self.rss.append((server_round, float(rss_bytes())))
        if tracemalloc.is_tracing():
            self.heap.append((server_round, float(tracemalloc.get_traced_memory()[0])))
            if server_round == max(self.checkpoints):  # what the traced rounds allocated and still hold, by line
                stats = tracemalloc.take_snapshot().statistics("lineno")[:HEAP_HOLDERS]
                self.heap_holders = [(str(st.traceback[0]), float(st.size), st.count) for st in stats]
        elif self.trace_from is not None and server_round >= self.trace_from:
            tracemalloc.start()
        if self.tree and server_round in self.checkpoints:
            self.by_kind[server_round] = pss_by_kind()
        if self.tree:
            rss, pss, n = tree_memory()
            self.tree_rss.append((server_round, float(rss)))
            self.tree_pss.append((server_round, float(pss)))
            self.processes = max(self.processes, n)
            self.peak_tree_rss = max(self.peak_tree_rss, rss)
            self.peak_tree_pss = max(self.peak_tree_pss, pss)


@contextlib.contextmanager
def _hooked_progress(sampler: Sampler) -> Iterator[None]:
    """Replace the ServerApp's progress bar by the sampler for the duration (the ServerApp imports it per run)."""
    import silofl.server.progress as progress_module

    original = progress_module.RunProgress

    class Recorder(original):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any, *, enabled: bool = True, console: Any = None) -> None:
            super().__init__(config, enabled=False)

        def start(self, rounds: int, federation: Any) -> None:
            sampler.sample(0)

        def update(self, record: Any) -> None:
            if record.evaluation is not None:
                sampler.eval_rounds.append(record.server_round)
            sampler.sample(record.server_round)

    progress_module.RunProgress = Recorder
    try:
        yield
    finally:
        progress_module.RunProgress = original


def measure(spec: LoadSpec) -> dict[str, Any]:
    """Run `spec` in this process and return its measurements (see the module docstring)."""
    from silofl.protocols.config import RunConfig
    from silofl.server.engines import run_job

    if spec.rounds < 1 or spec.silos < 1:
        raise ValueError(f"rounds and silos must be >= 1, got rounds={spec.rounds}, silos={spec.silos}")
    config = RunConfig.parse(spec.run_config())
    first = min(LEAK_START, spec.rounds)
    sampler = Sampler(
        checkpoints=frozenset({first, spec.rounds}),
        tree=spec.engine == "ray",
        trace_from=max(0, first - 1) if spec.trace else None,
    )
    t0 = time.perf_counter()
    try:
        with _hooked_progress(sampler):
            result = run_job(config, engine=spec.engine, progress=False)
    finally:
        wall = time.perf_counter() - t0
        heap_peak = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else math.nan
        tracemalloc.stop()
    seconds = [r["seconds"] for r in result["rounds"]]
    loop = result["timing"]["seconds_per_round"] * spec.rounds
    out: dict[str, Any] = {
        "spec": asdict(spec),
        "status": result["status"],
        "rounds_completed": len(seconds),
        "round_seconds": seconds,
        "eval_rounds": sampler.eval_rounds,
        "time": round_time_stats(seconds),
        "loop_seconds": loop,
        "wall_seconds": wall,
        "n_train": sum(s["n_train"] for s in result["federation"]["silos"]),
        "final_accuracy": result["final"]["accuracy"],
        "epsilon_spent": result["privacy"]["epsilon_spent"],
        "memory": {
            # the kernel's high-water mark lags the live counters by a few pages: take the larger of the two
            "peak_rss_mb": max(peak_rss_bytes(), max(b for _, b in sampler.rss)) / MB,
            "getrusage_peak_rss_mb": peak_rss_bytes() / MB,
            "setup_rss_mb": sampler.rss[0][1] / MB,
            "last_rss_mb": sampler.rss[-1][1] / MB,
            "rss_growth": growth(sampler.rss),
        },
        "rss_samples": sampler.rss,
    }
    if sampler.heap:
        out["memory"]["heap_peak_mb"] = heap_peak / MB
        out["memory"]["heap_holders"] = [
            {"where": _short_path(where), "kb": size / 1024.0, "blocks": count}
            for where, size, count in sampler.heap_holders
        ]
        out["memory"]["heap_last_mb"] = sampler.heap[-1][1] / MB
        out["memory"]["heap_growth"] = growth(sampler.heap)
    if sampler.tree:
        out["memory"].update(
            {
                "processes": sampler.processes,
                "tree_peak_rss_mb": sampler.peak_tree_rss / MB,
                "tree_peak_pss_mb": sampler.peak_tree_pss / MB,
                "tree_pss_growth": growth(sampler.tree_pss),
                "pss_by_kind_mb": {
                    str(r): {k: v / MB for k, v in kinds.items()} for r, kinds in sorted(sampler.by_kind.items())
                },
            }
        )
    return out


# ----------------------------------------------------------------------------------------------------------------
# The driver: one subprocess per run, a table, docs/LOAD.md
# ----------------------------------------------------------------------------------------------------------------


def _short_path(where: str) -> str:
    """`file:line` relative to the project or to site-packages, for the tables."""
    for prefix in (str(PROJECT_ROOT) + os.sep, "site-packages" + os.sep):
        if prefix in where:
            return where.split(prefix, 1)[1]
    return where


def run_in_subprocess(spec: LoadSpec, timeout: float) -> dict[str, Any]:
    """`measure(spec)` in a fresh interpreter; {"error": ...} if it fails or exceeds `timeout` seconds."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(asdict(spec))]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT)
    except subprocess.TimeoutExpired:
        return {"spec": asdict(spec), "error": f"did not finish within {timeout:.0f} s (killed)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
    return {
        "spec": asdict(spec),
        "error": f"exit {done.returncode} after {time.perf_counter() - t0:.0f} s: " + " | ".join(tail),
    }


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def time_table(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows (with a header) of seconds per round."""
    rows = [
        [
            "algorithm",
            "engine",
            "rounds",
            "outside rounds s",
            "round 1 s",
            "mean s/round",
            "p50",
            "p95",
            "max",
            "loop s",
            "accuracy",
            "epsilon",
        ]
    ]
    for r in results:
        spec = r["spec"]
        name = spec["algorithm"] + (" (tracemalloc)" if spec.get("trace") else "")
        if "error" in r:
            rows.append([name, spec["engine"], str(spec["rounds"]), r["error"], *[""] * 8])
            continue
        t = r["time"]
        eps = r["epsilon_spent"]
        rows.append(
            [
                name,
                spec["engine"],
                str(r["rounds_completed"]),
                _fmt(r["wall_seconds"] - r["loop_seconds"], 1),
                _fmt(t["first"], 3),
                _fmt(t["mean"], 3),
                _fmt(t["p50"], 3),
                _fmt(t["p95"], 3),
                _fmt(t["max"], 3),
                _fmt(r["loop_seconds"], 1),
                _fmt(r["final_accuracy"], 4),
                eps if isinstance(eps, str) else _fmt(eps, 4),
            ]
        )
    return rows


def memory_table(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows (with a header) of memory: this process, and for Ray the whole process tree."""
    rows = [
        [
            "algorithm",
            "engine",
            "peak RSS MB",
            "RSS after setup MB",
            "RSS last round MB",
            f"RSS growth r{LEAK_START}->last MB",
            "slope KB/round",
            f"Python heap growth MB (slope KB/round); peak after r{LEAK_START - 1}",
            "process tree: processes, peak RSS / PSS MB, PSS growth MB (KB/round)",
        ]
    ]
    for r in results:
        spec = r["spec"]
        name = spec["algorithm"] + (" (tracemalloc)" if spec.get("trace") else "")
        if "error" in r:
            rows.append([name, spec["engine"], r["error"], *[""] * 6])
            continue
        m = r["memory"]
        g = m["rss_growth"]
        heap = "-"
        if "heap_growth" in m:
            h = m["heap_growth"]
            heap = f"{h['delta_mb']:+.2f} ({h['slope_kb_per_round']:+.1f}); peak {m['heap_peak_mb']:.1f}"
        tree = "-"
        if "tree_peak_rss_mb" in m:
            tg = m["tree_pss_growth"]
            tree = (
                f"{m['processes']}, {m['tree_peak_rss_mb']:.0f} / {m['tree_peak_pss_mb']:.0f}, "
                f"{tg['delta_mb']:+.1f} ({tg['slope_kb_per_round']:+.0f})"
            )
        rows.append(
            [
                name,
                spec["engine"],
                _fmt(m["peak_rss_mb"], 0),
                _fmt(m["setup_rss_mb"], 0),
                _fmt(m["last_rss_mb"], 0),
                f"{g['delta_mb']:+.1f}",
                f"{g['slope_kb_per_round']:+.1f}",
                heap,
                tree,
            ]
        )
    return rows


def summary_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """One bullet per run with its headline numbers, and the Ray / in-process ratio per algorithm."""
    lines = []
    mean = {}
    for r in results:
        spec = r["spec"]
        name = f"`{spec['algorithm']}` on {spec['engine']}" + (" with tracemalloc" if spec.get("trace") else "")
        if "error" in r:
            lines.append(f"- {name}: failed: {r['error']}")
            continue
        t, m, g = r["time"], r["memory"], r["memory"]["rss_growth"]
        if not spec.get("trace"):
            mean[(spec["algorithm"], spec["engine"])] = t["mean"]
        text = (
            f"- {name}: {t['mean']:.3f} s per round (median {t['p50']:.3f}, p95 {t['p95']:.3f}; round 1 "
            f"{t['first']:.2f}); peak RSS {m['peak_rss_mb']:.0f} MB; RSS after round {g['from_round']} -> after round "
            f"{g['to_round']}: {g['from_mb']:.1f} -> {g['to_mb']:.1f} MB ({g['delta_mb']:+.1f} MB, "
            f"{100 * g['delta_mb'] / g['from_mb']:+.2f} %)"
        )
        if "heap_growth" in m:
            h = m["heap_growth"]
            text += f"; traced Python heap {h['delta_mb']:+.2f} MB over the same rounds"
        if "tree_peak_pss_mb" in m:
            tg = m["tree_pss_growth"]
            text += (
                f"; the whole process tree ({m['processes']} processes): peak PSS {m['tree_peak_pss_mb']:.0f} MB, "
                f"{tg['from_mb']:.0f} -> {tg['to_mb']:.0f} MB ({tg['delta_mb']:+.1f} MB)"
            )
        lines.append(text)
    for (algorithm, engine), value in mean.items():
        if engine == "ray" and (algorithm, "inprocess") in mean:
            ratio = value / mean[(algorithm, "inprocess")]
            lines.append(f"- `{algorithm}`: Ray / in-process mean seconds per round = {ratio:.2f}")
    return lines


def holders_table(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows (with a header) of the source lines holding the most traced heap at the last round."""
    rows = [["algorithm", "allocated at", "KB held", "blocks"]]
    for r in results:
        for h in r.get("memory", {}).get("heap_holders", []):
            rows.append([r["spec"]["algorithm"], f"`{h['where']}`", f"{h['kb']:.1f}", str(h["blocks"])])
    return rows


def kind_table(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Rows (with a header) of the Ray runs' PSS per kind of process at the leak check's two rounds."""
    rows = [["algorithm", "process kind", "PSS MB first", "PSS MB last", "growth MB"]]
    for r in results:
        by_round = r.get("memory", {}).get("pss_by_kind_mb")
        if not by_round or len(by_round) < 2:
            continue
        first, last = (by_round[k] for k in sorted(by_round, key=int)[:: len(by_round) - 1])
        for kind in sorted(set(first) | set(last), key=lambda k: -last.get(k, 0.0)):
            a, b = first.get(kind, 0.0), last.get(kind, 0.0)
            rows.append([r["spec"]["algorithm"], kind, f"{a:.1f}", f"{b:.1f}", f"{b - a:+.1f}"])
    return rows


def render_text(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def write_doc(path: Path, results: Sequence[dict[str, Any]], command: str, context: dict[str, Any]) -> None:
    """docs/LOAD.md: the command, the machine, both tables, and what each column means."""
    ok = [r for r in results if "error" not in r]
    n_train = ok[0]["n_train"] if ok else "?"
    spec = results[0]["spec"]
    private = sorted({r["spec"]["algorithm"] for r in results} & set(PRIVATE))
    noise = f"; {', '.join(private)} at epsilon = 1, delta = 1/n^2" if private else ""
    lines = [
        "# Load: many simulated silos on one machine",
        "",
        f"{spec['silos']} simulated silos, {spec['rounds']} rounds, {spec['dataset']} ({n_train} training records "
        f"split IID), batch {spec['batch_size']}, logistic regression{noise}; federated evaluation every "
        "rounds/20 rounds and after the last. "
        "Each row is one job through the real ServerApp, strategy and ClientApp (`server.engines.run_job`) in a "
        "fresh process. Generated by:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Measured {context['date']} on {context['machine']} ({context['cpus']} cores, shared with other jobs: load "
        f"average {context['load_before']} before the runs, {context['load_after']} after); the command took "
        f"{context['minutes']:.1f} minutes.",
        "",
        "## Summary",
        "",
        *summary_lines(results),
        "",
        "## Seconds per round",
        "",
        render_markdown(time_table(results)),
        "",
        "Round 1 includes each silo's noise calibration (cached per process for silos of equal size). mean, p50, p95 "
        "and max are over rounds 2..R; an evaluation round (every rounds/20 rounds) is a train and an evaluate "
        "round trip, which is what the p95 shows. `loop s` is the whole round loop; `outside rounds s` the rest of the "
        "job's wall time (imports, loading and partitioning the data, the setup round, the result; for Ray also "
        "starting and stopping the Ray cluster).",
        "",
        "## Memory",
        "",
        render_markdown(memory_table(results)),
        "",
        "RSS is the benchmark process's resident memory (`/proc/self/statm`), peak RSS its high-water mark "
        "(`getrusage`). In-process, the server and every silo live in that process. With Ray the silos run in Ray "
        "worker processes: the last column sums RSS and PSS over the whole process tree (PSS counts a shared page "
        "once, split among its sharers, so it is the better figure for the total). The leak check compares the "
        f"memory after round {LEAK_START} with the memory after the last round (both after `gc.collect()`), and fits "
        f"a least-squares slope over rounds {LEAK_START}..R; rounds before {LEAK_START} fill caches (noise "
        "calibration, model shells, the accountant's RDP curves) by design. The Python heap column (`--tracemalloc` "
        f"rows only) traces allocations from round {LEAK_START} on: its growth is what rounds {LEAK_START}..R "
        "allocated in Python objects and numpy arrays and still hold (torch's allocator is not traced), its peak the "
        f"largest traced amount after round {LEAK_START - 1}.",
        "",
    ]
    holders = holders_table(results)
    if len(holders) > 1:
        lines += [
            f"## Python heap held at the last round (allocated in rounds {LEAK_START}..R)",
            "",
            f"The {HEAP_HOLDERS} source lines whose allocations of the traced rounds are still alive at the end "
            "(`tracemalloc` statistics by line):",
            "",
            render_markdown(holders),
            "",
        ]
    kinds = kind_table(results)
    if len(kinds) > 1:
        lines += [
            "## Ray: where the memory is",
            "",
            f"PSS in MB per kind of process, after round {LEAK_START} and after the last round (both after "
            "`gc.collect()` in the driver):",
            "",
            render_markdown(kinds),
            "",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--silos", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--algorithms",
        default="dp-fedsgd,fedavg",
        help=f"run on the in-process engine; comma-separated, of {', '.join(ALGORITHMS)} ('' for none)",
    )
    parser.add_argument("--ray", default="dp-fedsgd", metavar="ALGORITHMS", help="run on Ray simulation ('' for none)")
    parser.add_argument(
        "--tracemalloc",
        default="",
        metavar="ALGORITHMS",
        help="run in-process again with the Python heap traced from round 9 on (rounds ~10x slower)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed (default 600)")
    parser.add_argument("--out", type=Path, help="write the tables and the command to this markdown file")
    parser.add_argument("--json", type=Path, help="write every measurement (per-round samples included) as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:  # one measured run, in this (fresh) process
        result = measure(LoadSpec(**json.loads(args.worker)))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    data_dir = os.environ.get("SILOFL_DATA_DIR", "")
    common = {"silos": args.silos, "rounds": args.rounds, "dataset": args.dataset, "batch_size": args.batch_size}
    specs = [LoadSpec(a, "inprocess", data_dir=data_dir, **common) for a in _choices(args.algorithms, "--algorithms")]
    specs += [LoadSpec(a, "ray", data_dir=data_dir, **common) for a in _choices(args.ray, "--ray")]
    specs += [
        LoadSpec(a, "inprocess", data_dir=data_dir, trace=True, **common)
        for a in _choices(args.tracemalloc, "--tracemalloc")
    ]
    if not specs:
        raise SystemExit("nothing to run: give --algorithms, --ray or --tracemalloc")
    t_start = time.perf_counter()
    context = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "cpus": os.cpu_count(),
        "load_before": _load(),
    }
    results = []
    for spec in specs:
        print(f"running {spec.algorithm} on {spec.engine}{' with tracemalloc' if spec.trace else ''} ...", flush=True)
        results.append(run_in_subprocess(spec, args.timeout))
        if "error" in results[-1]:
            print(f"  failed: {results[-1]['error']}", flush=True)
        else:
            print(f"  {results[-1]['wall_seconds']:.0f} s", flush=True)
    context["load_after"] = _load()
    context["minutes"] = (time.perf_counter() - t_start) / 60.0
    print()
    print(f"{args.silos} silos x {args.rounds} rounds, {args.dataset}, batch {args.batch_size}")
    print(render_text(time_table(results)))
    print()
    print(render_text(memory_table(results)))
    for extra in (holders_table(results), kind_table(results)):
        if len(extra) > 1:
            print()
            print(render_text(extra))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.out:
        shown = list(argv if argv is not None else sys.argv[1:])
        if "--json" in shown:  # where the raw samples were saved is not part of the measurement
            i = shown.index("--json")
            del shown[i : i + 2]
        command = "SILOFL_DATA_DIR=../shared/data python benchmarks/load.py " + " ".join(
            shlex.quote(a) if a else "''" for a in shown
        )
        write_doc(args.out, results, command.strip(), context)
        print(f"\nwritten: {args.out}")
    return 1 if any("error" in r for r in results) else 0


def _choices(text: str, flag: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in ALGORITHMS]
    if bad:
        raise SystemExit(f"{flag}: {', '.join(bad)} not in {', '.join(ALGORITHMS)}")
    return values


if __name__ == "__main__":
    sys.exit(main())
