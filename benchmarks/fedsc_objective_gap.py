"""How much FedSC's objective is worth under label skew, without federation: a central diagnostic.

    SILOFL_DATA_DIR=../shared/data python benchmarks/fedsc_objective_gap.py [--out docs/results/fedsc_objective_gap.md]
        [--steps 600] [--per-class 13] [--records 500] [--optimizers sgd,adam]

FedSC's local gradients sum to the gradient of the global spectral contrastive loss (eq. 6): -Tr R+ + 1/2 ||R||_F^2
with R the correlation of *all* silos' representations. FedAvg+SC's sum to the gradient of sum_j q_j L_j, the same
loss computed inside each silo, which with one class per silo is the global loss plus 1/2 sum_j q_j ||R_j - R||_F^2
(the spec's "wrong regularizer"). This script trains one model centrally on each objective with identical data,
views, batches and steps (every step draws `--per-class` images of each of the 10 classes): "global" concatenates the
10 class batches into one loss, "per-class" averages 10 single-class losses. The gap between the two linear probes is
what a perfect FedSC (no staleness of R_-j, no local drift) could gain over a perfect FedAvg+SC at this budget.

Same model, augmentations and loss code as `silofl run fedsc` (small GroupNorm CNN, H = 128, mu = 4, gradient clip
3). Evaluation: linear probe (Adam 3e-3, 30 epochs) on the frozen backbone's features of 10,000 seeded training
images, accuracy on all 10,000 test images; kNN (k = 200, tau = 0.1) on the same features. One core per run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("global", "per-class")


def train(mode: str, optimizer: str, args: argparse.Namespace) -> dict:
    """Train on one objective; the probe and kNN accuracy at the start and every `eval_every` steps."""
    import numpy as np
    import torch

    from silofl.client.augment import make_views, ssl_augmentation
    from silofl.client.data.loaders import load_dataset
    from silofl.protocols.fedsc import local_loss, normalize_rows
    from silofl.protocols.ssl_eval import extract_features, knn_accuracy, linear_probe
    from silofl.protocols.ssl_models import build_ssl_model

    torch.set_num_threads(1)
    data = load_dataset("fashion-mnist", data_dir=os.environ.get("SILOFL_DATA_DIR") or None)
    rng = np.random.default_rng(args.seed)
    images = torch.from_numpy(data.train.nonsensitive.features).reshape(-1, 1, 28, 28)
    labels = data.train.nonsensitive.labels
    test_images = torch.from_numpy(data.test.nonsensitive.features).reshape(-1, 1, 28, 28)
    test_labels = data.test.nonsensitive.labels
    classes = [images[rng.choice(np.flatnonzero(labels == c), args.records, replace=False)] for c in range(10)]
    probe_rows = rng.choice(len(labels), 10_000, replace=False)
    model = build_ssl_model("cnn", (1, 28, 28), projection_dim=128, seed=args.seed)
    augment = ssl_augmentation((1, 28, 28))
    mu = 4.0

    def evaluate() -> tuple[float, float]:
        train_features = extract_features(model, images[probe_rows])
        test_features = extract_features(model, test_images)
        probe = linear_probe(train_features, labels[probe_rows], test_features, test_labels, 10, epochs=30)
        knn = knn_accuracy(train_features, labels[probe_rows], test_features, test_labels, 10, k=200, tau=0.1)
        return 100 * probe.accuracy, 100 * knn

    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    curve = [(0, *evaluate(), float("nan"))]
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        pairs = []
        for batch in classes:
            rows = torch.from_numpy(rng.choice(args.records, args.per_class, replace=False))
            v1, v2 = make_views(batch[rows], augment, 2, seed=int(rng.integers(2**62)))
            pairs.append((normalize_rows(model(v1), mu), normalize_rows(model(v2), mu)))
        if mode == "global":
            loss = local_loss(torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs]), 1.0)
        else:
            loss = sum(local_loss(a, b, 1.0) for a, b in pairs) / len(pairs)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
        opt.step()
        losses.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            curve.append((step, *evaluate(), float(np.mean(losses[-args.eval_every :]))))
    return {"curve": curve, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/fedsc_objective_gap.md")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--per-class", type=int, default=13, help="images of each class per step (batch 10x this)")
    parser.add_argument("--records", type=int, default=500, help="training images per class")
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--eval-every", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    optimizers = [o for o in args.optimizers.split(",") if o]
    unknown = sorted(set(optimizers) - {"sgd", "adam"})
    if unknown:
        parser.error(f"--optimizers: unknown {unknown}; use sgd and/or adam")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        jobs = {(m, o): pool.submit(train, m, o, args) for o in optimizers for m in MODES}
        results = {key: job.result() for key, job in jobs.items()}
    minutes = (time.perf_counter() - t0) / 60
    names = {"sgd": "SGD lr 0.05, momentum 0.9, wd 5e-4", "adam": "Adam lr 1e-3"}
    lines = [
        "# FedSC's objective against FedAvg+SC's under one class per silo (central diagnostic)",
        "",
        "Command: `SILOFL_DATA_DIR=../shared/data python "
        + " ".join(["benchmarks/fedsc_objective_gap.py", *sys.argv[1:]])
        + f"` ({minutes:.0f} minutes, {args.workers} processes).",
        "",
        f"Fashion-MNIST, {args.records} images per class, {args.steps} steps of {args.per_class} images per class "
        f"(batch {10 * args.per_class}), two views, seed {args.seed}. 'global' = the loss FedSC's gradients sum to "
        "(eq. 6), 'per-class' = the loss FedAvg+SC's gradients sum to. Probe = linear-probe test accuracy (%), "
        "kNN = kNN test accuracy (%); step 0 is the untrained backbone.",
        "",
        "| optimizer | step | global: probe | global: kNN | per-class: probe | per-class: kNN | probe gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in optimizers:
        glob, per = results[("global", o)]["curve"], results[("per-class", o)]["curve"]
        for (step, gp, gk, _), (_, pp, pk, _) in zip(glob, per, strict=True):
            lines.append(f"| {names[o]} | {step} | {gp:.1f} | {gk:.1f} | {pp:.1f} | {pk:.1f} | {gp - pp:+.1f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
