"""The torch device of a run (`--device auto|cpu|cuda`) and the GPU share of a simulated node.

Which algorithms honour it: the ones whose silos train a torch model, i.e. `fedavg`, `dp-fedsgd`, `steffle`, `tran`,
`fedfdp` (the tabular models, built-in or your own: `protocols.models`) and `fedsc`, `fedavg-sc` (the image encoders).
`mu2fl` and `noisy-sgd` compute in closed form with numpy, on the CPU, and have no device option.

Where each part of a round runs (`client.rounds`, `client.algorithms`): the model, the silo's records of the step
and the per-sample gradient maths (`torch.func`, or one backward pass for silofl's stacks of Linear layers), the
clipping and the sums run on the device; every sum is moved to the CPU BEFORE its Gaussian noise is added, with the
silo's seeded CPU generator, and the release leaves the silo as CPU numpy, as before. The Poisson samples are numpy
draws, also on the CPU. So the noise a silo adds is the same draw on every device (a function of the run's seed and
the silo's round alone), and on the CPU nothing moves: `cpu` gives bit for bit the numbers silofl gave before the
option existed. On a GPU the sums differ from the CPU's by float rounding (other kernels, other summation orders).
FedSC's augmented views are the exception: kornia draws them from the generator of the device the images are on
(seeded per round, so a GPU run is reproducible), and CUDA's generator gives other draws than the CPU's from the same
seed, so its model differs from the CPU run's by more than rounding (benchmarks/README.md, "GPU runs").

`auto` is resolved where the model runs: at each silo (a deployed silo on its own hardware), by
:func:`resolve_device`. The command line refuses `cuda` on a machine without a GPU before anything runs
(:func:`device_problem`) when the silos run on that machine (the in-process engine, or a local Ray); a deployed silo,
or a Ray cluster's node, without one refuses the run's first message.

Pure but for :func:`resolve_device` and :func:`visible_gpus`, which import torch when called.
"""

from __future__ import annotations

import math
from typing import Any, Literal

Device = Literal["cpu", "cuda", "auto"]
DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")
#: Ray accepts fractional GPU requests to 4 decimals; a share is rounded down to this so that the nodes fit.
RAY_GPU_RESOLUTION = 10_000


def resolve_device(name: str) -> Any:  # -> torch.device
    """The torch device for a run's `device` setting: "cpu", "cuda" (refused clearly without one) or "auto" (cuda
    when torch sees a GPU, else cpu). ValueError for anything else."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device here; use device 'cpu' or 'auto'")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {name!r}")
    return torch.device(name)


def visible_gpus() -> int:
    """The CUDA devices torch sees on this machine (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_problem(device: str, gpus: int) -> str | None:
    """Why a run asking for `device` cannot run its silos on a machine with `gpus` GPUs (None: it can)."""
    if device == "cuda" and gpus < 1:
        return (
            "--device cuda: torch sees no CUDA GPU on this machine (torch.cuda.is_available() is False), where the "
            "simulated silos would run; use --device cpu, or --device auto (cuda when a GPU is there, else cpu)"
        )
    return None


def ray_client_resources(device: str, num_nodes: int, gpus: int | None) -> dict[str, float]:
    """Flower's Ray `client_resources` for the run's `device`: one CPU per node, and the GPU share each node takes.

    * ``cpu``, or ``auto`` without a GPU: no GPU (Ray 2.x hides the GPUs from a worker that asked for none, so `auto`
      resolves to cpu there; Ray says a future version will stop doing so);
    * ``cuda``, or ``auto`` with ``gpus`` GPUs: ``min(1, gpus / num_nodes)`` rounded down to Ray's 1e-4, so that all
      the nodes fit on the GPUs at once (3 nodes on 1 GPU: 0.3333 each; 8 nodes on 4 GPUs: 0.5; 2 nodes on 4 GPUs:
      1 each, a node never spans GPUs);
    * ``gpus`` None (a Ray cluster, whose GPUs this machine cannot count before it joins): ``cuda`` takes one whole
      GPU per node (Ray runs as many nodes at a time as the cluster has GPUs), ``auto`` none (give ``cuda`` on a
      cluster).

    ValueError for ``cuda`` with ``gpus`` = 0: Flower would start an empty actor pool.
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    share = 0.0
    if gpus is None:
        share = 1.0 if device == "cuda" else 0.0
    elif device == "cuda" or (device == "auto" and gpus > 0):
        problem = device_problem(device, gpus)
        if problem:
            raise ValueError(problem)
        share = min(1.0, math.floor(gpus / num_nodes * RAY_GPU_RESOLUTION) / RAY_GPU_RESOLUTION)
        if share <= 0.0:
            raise ValueError(
                f"{num_nodes} nodes cannot share {gpus} GPU(s) at Ray's resolution of 1e-4 GPU; use --device cpu"
            )
    return {"num_cpus": 1, "num_gpus": share}
