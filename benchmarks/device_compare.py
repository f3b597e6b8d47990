"""The same silofl runs on the CPU and on a GPU (`--device cpu|cuda`): seconds per round of each and how far apart
their final metrics are.

Each case is a real `silofl run` (the installed entry point's module, progress bar off) run once per device with the
same seed; the numbers come from each run's result.json (`timing.seconds_per_round` excludes setup, data loading and
the first round's calibration, which `timing.total_seconds` holds). The noise is drawn on the CPU on both devices
(protocols/devices.py), so the final metrics should differ by float rounding only: the `max |diff|` column says by how
much. Run from the project root on a machine with a GPU (benchmarks/README.md, "GPU runs"):

    python benchmarks/device_compare.py --out runs/device-compare

`--devices cpu` alone sizes the cases on a machine without one. Adult is read from $SILOFL_DATA_DIR (the cases that
name `--dataset adult`); FedSC uses scikit-learn's bundled digits, so it needs no data folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

# name -> the arguments of `silofl run` (seed, device, output folder and --no-progress are added per run).
CASES: dict[str, str] = {
    "dp-fedsgd mlp 256": "dp-fedsgd --dataset adult --model mlp --hidden 256 --epochs 2 --epsilon 1",
    "dp-fedsgd mlp 4096": "dp-fedsgd --dataset adult --model mlp --hidden 4096 --epochs 1 --epsilon 1",
    "dp-fedsgd user model (tiny)": "dp-fedsgd --dataset adult --model tests.custom_models:tiny --epochs 2 --epsilon 1",
    "steffle logreg": "steffle --dataset adult --epsilon 1 --lambda 1",
    "fedsc cnn": "fedsc --rounds 5",
    "fedsc resnet20": "fedsc --model resnet20 --rounds 3",
}


def machine() -> dict[str, object]:
    """What the numbers were measured on: the GPU, torch's and CUDA's versions, the CPU count and its load."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min": os.getloadavg()[0],
    }


def run_case(args: str, device: str, out: Path) -> dict[str, object]:
    """One `silofl run` on one device; its timing and final metrics from result.json."""
    command = [sys.executable, "-m", "silofl.server.cli", "run", *shlex.split(args)]
    command += ["--seed", "0", "--device", device, "--no-progress", "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-2000:]}", "wall_seconds": wall}
    result = json.loads((out / "result.json").read_text())
    return {
        "wall_seconds": wall,
        "total_seconds": result["timing"]["total_seconds"],
        "seconds_per_round": result["timing"]["seconds_per_round"],
        "rounds": len(result["rounds"]),
        "final": result["final"],
    }


def max_metric_gap(a: dict[str, object], b: dict[str, object]) -> float:
    """The largest absolute difference between two runs' numeric final metrics."""
    gaps = [
        abs(float(a[key]) - float(b[key]))
        for key in a
        if isinstance(a[key], (int, float)) and isinstance(b.get(key), (int, float))
    ]
    return max(gaps) if gaps else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/device-compare"), help="where the runs are written")
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE")
    options = parser.parse_args()

    info = machine()
    print(json.dumps(info))
    rows: dict[str, dict[str, dict[str, object]]] = {}
    for case in options.cases:
        rows[case] = {}
        for device in options.devices:
            slug = case.replace(" ", "-").replace("(", "").replace(")", "")
            rows[case][device] = outcome = run_case(CASES[case], device, options.out / f"{slug}-{device}")
            print(json.dumps({"case": case, "device": device, **outcome}), flush=True)

    columns = " | ".join(f"{device} s/round" for device in options.devices)
    print(f"\n| case | {columns} | speed-up | max abs diff of final metrics |")
    print(f"|---|{'---|' * len(options.devices)}---|---|")
    for case, by_device in rows.items():
        cells = [
            f"{by_device[d]['seconds_per_round']:.4f}" if "error" not in by_device[d] else "failed"
            for d in options.devices
        ]
        speedup = gap = "-"
        ok = all("error" not in by_device[d] for d in ("cpu", "cuda") if d in by_device)
        if ok and {"cpu", "cuda"} <= set(by_device):
            speedup = f"{by_device['cpu']['seconds_per_round'] / by_device['cuda']['seconds_per_round']:.2f}x"
            gap = f"{max_metric_gap(by_device['cpu']['final'], by_device['cuda']['final']):.2e}"
        print(f"| {case} | {' | '.join(cells)} | {speedup} | {gap} |")
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "summary.json").write_text(json.dumps({"machine": info, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
