"""SteFFLe's silo side (SteFFLe Algorithm 1, lines 6-9; DP-FERMI when there is one silo), in two divisions.

* The non-sensitive division holds features, labels and the model. It draws its minibatch B1 by Poisson sampling
  (rate q = m / n_j) and computes the loss gradient g_j = mean_{i in B1} grad loss(x_i, y_i; theta) (line 7). g_j
  does not depend on any sensitive attribute and is sent as is. It hands the sensitive division what it needs of the
  model: the model itself (to evaluate F(x; theta) = softmax(logits) and its Jacobian) and the features and labels of
  the records the sensitive division samples. It never reads a sensitive attribute.
* The sensitive division holds the sensitive attributes. It draws its own Poisson sample B2, independent of B1 (the
  paper's line 6 draws one minibatch for both divisions; silofl draws two so that amplification by sampling holds for
  the noised releases although g_j is released in the clear), computes the per-sample fairness gradients of psi_i
  (Lemma D.1; `protocols.steffle.gradients`), clips the theta-part to C, sums, and adds Gaussian noise to both parts
  before they leave (line 8).

Privacy is w.r.t. the sensitive attributes (DP-FERMI Definition 2.2; SteFFLe Definition 2.3): neighbours differ in one
record's s_i. Record i's contribution to the theta-sum lies in the ball of radius C around 0 whatever s_i is; its
contribution to the W-sum is -2 W (.) F_i (independent of s_i) plus 2 e_{s_i} F_i^T / sqrt(p(s_i)), whose norm is at
most 2 / sqrt(rho) with rho the smallest prior probability (||F_i||_2 <= 1). So each release is a Poisson-subsampled
Gaussian under the replace-one relation with radius C (theta) and R_W = 2 / sqrt(rho) (W); the silo adds noise
sigma * C and sigma * R_W, and the two releases are one composed mechanism (`releases = 2`). lambda never enters what
the silo releases (the server applies it), so the noise does not depend on lambda (the papers' W noise is calibrated for
lambda <= 1 only).

With the run option `sampling = shuffle` (the paper's accounting assumes Poisson sampling; the authors' released code
shuffles) both functions are handed their records (`sample`: the round's batch of the division's own shuffled epoch,
`client.batches`) instead of drawing a Poisson sample; the sums are still divided by q n_j = min(m, n_j). The balls
above are unchanged, but nothing is amplified: the silo accounts each epoch as one unsampled release of the two
(`protocols.shuffled_epochs` has the argument).

Whole-record privacy (the run option `protect = record`; DP-FERMI Theorem D.2, second part; issue 34):
:func:`record_gradients`. Neighbours differ by one whole record (x_i, s_i, y_i) added or removed, so every release must
be a noised sum of per-record terms in bounded balls, the loss gradient included. The silo then draws ONE Poisson
sample (the paper's minibatch B_t; there is nothing un-noised left that its amplification must be kept apart from)
and releases on it, each at the same noise multiplier sigma: the per-record loss gradients clipped to C, the
theta-gradients of psi clipped to C, the s-dependent W-gradients (radius R_W as above) and, in place of the
s-independent -2 W (.) F_i (whose norm grows with the server's W), each record's soft predictions F_i in its W block
(radius 1, `protocols.steffle.output_block_sums_checked`); the -2 W (.) F part is computed from that noised sum
(post-processing, `protocols.steffle.w_output_term`). Four releases of one Poisson-subsampled Gaussian under add/remove,
one mechanism of multiplier sigma / 2 for the accountant. Every sum is divided by the run's public batch size m, never
by the silo's own count: under add/remove a divisor min(m, n_j) would move with the record (`client.noisy_gradient`;
the loss release is its `loss_release`). With lambda = 0 the round releases the loss gradient alone.

Device (`--device`, `protocols.devices`): the model's forward and per-sample backward passes run on the model's
device; the sensitive attributes, labels, W, the W-sums and the noise stay on the CPU, and what leaves is on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from silofl.client.batches import step_batch, step_sample
from silofl.client.data.tabular import NonSensitiveDivision, SensitiveDivision
from silofl.client.gradients import mean_gradient_and_logits
from silofl.client.noisy_gradient import loss_release
from silofl.protocols.models import TabularModel, head_clipped_sum, linear_stack_clipped_sum, model_device
from silofl.protocols.privacy.gaussian import GaussianMechanism
from silofl.protocols.steffle import (
    GroupPrior,
    clipped_psi_theta_sum,
    output_block_sums_checked,
    psi_logit_grads,
    psi_output_cotangents_checked,
    psi_w_sensitive_sum_checked,
    w_output_term,
)


def w_radius_of(prior: GroupPrior) -> float:
    """R_W = 2 / sqrt(rho): the radius of the ball that record i's s-dependent W-gradient lies in (rho: the smallest
    prior probability the objective uses; ||F_i||_2 <= 1). For the group-balanced objective
    (`protocols.fairness_prior`) a record's W-gradient is weighted by omega = (1/k) / p(s_i) and written with the prior
    1/k: R_W = 2 / (sqrt(k) rho) (`GroupPrior.w_gradient_bound`)."""
    if prior.balanced:
        return prior.w_gradient_bound()
    return 2.0 / math.sqrt(prior.rho)


def balanced_w_base(w: torch.Tensor, w_sensitive: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    """The -2 W (.) mean_i omega_i F_i term of the balanced objective's W-gradient, from the NOISED s-dependent part.

    With the balanced prior the term depends on s_i through omega_i, so the non-sensitive division cannot compute it.
    It is a post-processing of the released sum instead: entry (b, r, u) of the s-dependent part is
    2 sqrt(k) sum_{i in b, s_i = r} omega_i F_iu / (q n_j), so its sum over r, divided by sqrt(k), is
    2 sum_{i in b} omega_i F_iu / (q n_j), and the term is -W times that (every W block and group alike)."""
    sqrt_k = math.sqrt(prior.num_groups)
    return -w * (w_sensitive.sum(dim=-2, keepdim=True) / sqrt_k)


def w_gradient_base(probs: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, prior: GroupPrior) -> torch.Tensor:
    """The part of mean_i d psi_i / d W that does not depend on any s_i: mean_i of -2 W (.) F_i in the sample's block.

    d psi_i / d W_ru = -2 W_ru F_u(x_i) + 2 [s_i = r] F_u(x_i) / sqrt(p(r)) (Lemma D.1): the first term needs only
    F and the label (to pick the block for "eo"/"eopp"), so the non-sensitive division computes it on its own sample
    and sends it in the clear; only the second term is the sensitive division's (see the module docstring).
    """
    n = max(len(labels), 1)
    if prior.notion == "dp":
        return -2.0 * w * (probs.sum(dim=0) / n).unsqueeze(0)
    per_label = torch.zeros(prior.num_labels, probs.shape[1], dtype=probs.dtype)
    per_label.index_add_(0, labels, probs)
    per_label /= n
    if prior.notion == "eo":  # W (l, k, l): block y from the samples with label y
        return -2.0 * w * per_label.unsqueeze(1)
    return -2.0 * w * per_label[prior.num_labels - 1].unsqueeze(0)  # eopp: the positive label's block


def nonsensitive_step(
    model: nn.Module,
    data: NonSensitiveDivision,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    rate: float,
    rng: np.random.Generator | None = None,
    sample: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-sensitive division's share (line 7): on its own Poisson sample (or its given `sample`, a shuffled
    epoch's batch), the mean loss gradient g_j and the s-independent part of the W-gradient (zeros for an empty
    sample). It reads no sensitive attribute."""
    idx = step_sample(len(data.labels), rate, rng, sample)
    if len(idx) == 0:
        return torch.zeros(sum(p.numel() for p in model.parameters())), torch.zeros_like(w)
    x, y = step_batch(model, data, idx)
    g, logits = mean_gradient_and_logits(model, x, y)  # one forward pass for both g and F, on the model's device
    # W's part on the CPU, where W arrived (on the CPU `.cpu()` is the tensor itself: the same numbers as before)
    return g.cpu(), w_gradient_base(torch.softmax(logits, dim=1).cpu(), y.cpu(), w, prior)


def fairness_gradients(
    model: nn.Module,
    data: NonSensitiveDivision,
    sensitive: SensitiveDivision,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    rate: float,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator | None = None,
    generator: torch.Generator,
    w_noise: str = "isotropic",
    sample: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sensitive division's noised (h_theta, s-dependent h_W), each a sum over its own Poisson sample / (q n_j).

    ``sample`` given (a shuffled epoch's batch, `client.batches`): the sums are over those records instead, still
    divided by q n_j = min(m, n_j), the public batch size.

    ``w_noise = "per-group"`` noises each group's row of the W release at that row's own bound
    (:func:`per_group_w_release`) instead of every entry at the largest one.

    For the group-balanced objective (``prior.balanced``) h_W is the whole W-gradient: the s-dependent part plus
    :func:`balanced_w_base` computed from it after the noise (post-processing); the caller adds nothing to it.

    Record i's theta-contribution is clipped into the ball of radius C around 0, and its s-dependent W-contribution
    lies in the ball of radius R_W around 0; 0 is also what a record that is not sampled contributes. That is the
    geometry dp-accounting's replace-one Poisson-subsampled Gaussian assumes (mu_upper/mu_lower = q N(+-R) +
    (1 - q) N(0)). The s-independent term -2 W (.) F_i is kept out of the noised sum on purpose: it would move a
    sampled record's contribution away from the unsampled point 0 by up to 2 D, outside that geometry (and its norm
    would have to be paid for in the noise).

    Whatever finite model and W the server sends, both sums stay finite: a record whose theta term or its norm is not
    finite (huge parameters can overflow it for s_i = 1 and not for s_i = 0) and one whose F_i = softmax(logits) is
    not finite contribute exactly 0, the centre of both balls (`protocols.models.clip_factors`,
    `protocols.steffle.psi_w_sensitive_sum_checked`), and the noise is added to a finite value
    (`protocols.privacy.gaussian`).
    """
    idx = step_sample(len(sensitive.groups), rate, rng, sample)
    theta_sum, w_sum, _, _ = _fairness_sums(model, data, sensitive, idx, w=w, prior=prior, clip=clip)
    if noise_multiplier > 0:
        theta_sum = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier).release(theta_sum, generator)
        w_sum = w_release(w_sum, prior, noise_multiplier, generator, w_noise)
    expected = rate * len(sensitive.groups)
    if prior.balanced:  # the whole W-gradient: its s-independent-looking term depends on s through omega_i
        return theta_sum / expected, w_sum / expected + balanced_w_base(w, w_sum / expected, prior)
    return theta_sum / expected, w_sum / expected


@dataclass(frozen=True)
class RecordSums:
    """The noised sums of a whole-record round (:func:`record_sums`), in the order their noise is drawn: the loss
    gradients (radius C), the theta-gradients of psi (C), the s-dependent W-gradients (R_W) and the soft predictions
    per W block (radius 1; None for the balanced objective). Without the fairness releases (lambda = 0) only `loss`."""

    loss: torch.Tensor
    theta: torch.Tensor | None = None
    w: torch.Tensor | None = None
    outputs: torch.Tensor | None = None


def record_sums(
    model: nn.Module,
    data: NonSensitiveDivision,
    sensitive: SensitiveDivision,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    sample: np.ndarray,
    w_noise: str = "isotropic",
    fairness: bool = True,
) -> RecordSums:
    """What a whole-record round releases (module docstring), before any division or post-processing: on the round's
    one sample `sample`, each sum of per-record terms in its ball around 0, noised at `noise_multiplier` (0: the
    clipped sums themselves). The noise is drawn from `generator` in the order of :class:`RecordSums`' fields."""
    idx = sample
    g = loss_release(model, data, idx, clip=clip, noise_multiplier=noise_multiplier, generator=generator)
    if not fairness:
        return RecordSums(g)
    theta_sum, w_sum, probs, y = _fairness_sums(model, data, sensitive, idx, w=w, prior=prior, clip=clip)
    outputs = torch.zeros(prior.blocks(), w.shape[-1], dtype=w.dtype)
    if probs is not None:
        outputs = output_block_sums_checked(probs, prior, labels=y).to(w.dtype)
    if noise_multiplier > 0:
        theta_sum = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier).release(theta_sum, generator)
        w_sum = w_release(w_sum, prior, noise_multiplier, generator, w_noise)
        if not prior.balanced:
            unit = GaussianMechanism(sensitivity=OUTPUTS_RADIUS, noise_multiplier=noise_multiplier)
            outputs = unit.release(outputs, generator)
    return RecordSums(g, theta_sum, w_sum, None if prior.balanced else outputs)


def record_gradients(
    model: nn.Module,
    data: NonSensitiveDivision,
    sensitive: SensitiveDivision,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    batch_size: int,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    sample: np.ndarray,
    w_noise: str = "isotropic",
    fairness: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A round under whole-record privacy (module docstring): the noised ``(g, h_theta, h_W)`` of :func:`record_sums`,
    each divided by the public batch size m = `batch_size`; h_W is the whole W-gradient, its -2 W (.) F part computed
    from the noised soft predictions (or, for the balanced objective, from the s-dependent release): post-processing.
    Without `fairness` (lambda = 0): ``(g, None, None)``. With `noise_multiplier` 0 (a run without noise) each
    release is its clipped sum / m."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (the public divisor m of the noisy sums), got {batch_size}")
    sums = record_sums(
        model,
        data,
        sensitive,
        w=w,
        prior=prior,
        clip=clip,
        noise_multiplier=noise_multiplier,
        generator=generator,
        sample=sample,
        w_noise=w_noise,
        fairness=fairness,
    )
    if sums.theta is None or sums.w is None:
        return sums.loss / batch_size, None, None
    w_sensitive = sums.w / batch_size
    if sums.outputs is None:  # balanced: the whole W-gradient from the s-dependent release
        w_gradient = w_sensitive + balanced_w_base(w, w_sensitive, prior)
    else:
        w_gradient = w_output_term(w, sums.outputs / batch_size, prior) + w_sensitive
    return sums.loss / batch_size, sums.theta / batch_size, w_gradient


#: The radius of one record's soft predictions F_i in its W block (||F_i||_2 <= ||F_i||_1 = 1): the `outputs`
#: release of a whole-record round.
OUTPUTS_RADIUS = 1.0


def _fairness_sums(
    model: nn.Module,
    data: NonSensitiveDivision,
    sensitive: SensitiveDivision,
    idx: np.ndarray,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The un-noised sums of the records `idx` that the sensitive division releases: the clipped theta-gradients of
    psi and the s-dependent W-gradients; with the records' soft predictions F (None for no record) and labels."""
    # Only the features go to the model's device (the forward and per-sample backward passes); the groups, labels and
    # W stay on the CPU, with the cotangents and the W-sum computed from them, and the noise (`protocols.devices`).
    x = torch.from_numpy(data.features[idx]).to(model_device(model))
    y = torch.from_numpy(data.labels[idx])
    s = torch.from_numpy(sensitive.groups[idx])
    if not len(idx):
        return clipped_psi_theta_sum(model, x, s, w, prior, clip, labels=y).cpu(), torch.zeros_like(w), None, y
    theta_sum, probs = _clipped_theta_sum_and_outputs(model, x, s, w, prior, clip, y)
    theta_sum, probs = theta_sum.cpu(), probs.cpu()
    # d psi_i / d W at W = 0 is exactly the s-dependent term 2 [s_i = r] F_u / sqrt(p(r)): the only part of the
    # W-gradient released here (the rest comes from the non-sensitive division, `w_gradient_base`). Inputs checked
    # where they entered the silo (W at the message boundary, s and y with the silo's data, probs its own).
    return theta_sum, psi_w_sensitive_sum_checked(probs, s, prior, labels=y), probs, y


def w_release(
    w_sum: torch.Tensor, prior: GroupPrior, noise_multiplier: float, generator: torch.Generator, w_noise: str
) -> torch.Tensor:
    """The s-dependent W-sum noised as `w_noise` says (a silo's and a separate sensitive party's release alike):
    "per-group", :func:`per_group_w_release`; "isotropic", every entry at the largest bound R_W = `w_radius_of`."""
    if w_noise == "per-group":
        return per_group_w_release(w_sum, prior, noise_multiplier, generator)
    isotropic = GaussianMechanism(sensitivity=w_radius_of(prior), noise_multiplier=noise_multiplier)
    return isotropic.release(w_sum, generator)


def per_group_w_release(
    w_sum: torch.Tensor, prior: GroupPrior, noise_multiplier: float, generator: torch.Generator
) -> torch.Tensor:
    """The s-dependent W-sum noised row by row: row (b, r) of W gets noise std sigma * B_br, with B_br the largest
    norm of one record's contribution to that row (`GroupPrior.w_row_bounds`: 2 / sqrt(p_b(r))).

    A record of group r in block b contributes to row (b, r) only, with norm <= B_br. Dividing each row by its B_br
    maps every record's contribution into the unit ball around 0 (0: a record that is not sampled), whatever its s:
    the replace-one Poisson-subsampled Gaussian of radius 1 the accountant assumes, at the same noise multiplier as
    the isotropic release of radius max B = R_W. Multiplying back is post-processing. The large groups' rows, whose
    bound is small, are no longer noised at the smallest group's bound."""
    bounds = torch.from_numpy(prior.w_row_bounds()).to(w_sum.dtype).reshape(*w_sum.shape[:-1], 1)
    return (
        GaussianMechanism(sensitivity=1.0, noise_multiplier=noise_multiplier).release(w_sum / bounds, generator)
        * bounds
    )


def _clipped_theta_sum_and_outputs(
    model: nn.Module,
    x: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`clipped_psi_theta_sum(model, x, s, w, prior, clip, labels=y)` and F = softmax(model(x)) (detached).

    For a TabularModel this is `protocols.steffle.theta`'s own route for it (cotangents a_i, one backward pass of
    sum_i <a_i, F(x_i)> through `protocols.models.linear_stack_clipped_sum`) with F kept from that pass's forward,
    where a second forward pass would compute the very same values; the inputs are the silo's own records and the
    checked W, so `clipped_psi_theta_sum`'s checks of its arguments are not repeated (the cotangents come from
    `psi_output_cotangents_checked`, the same values as `psi_output_cotangents`). Tests check that both give the same
    bits. Other models take `clipped_psi_theta_sum` and a forward pass.
    """
    if isinstance(model, TabularModel):
        a = psi_output_cotangents_checked(s, w, prior, labels=y).to(x.device)
        kept: list[torch.Tensor] = []
        if model.hidden is None:  # logistic regression: closed-form d/d logits, no backward pass (the same bits)

            def logit_grads(logits: torch.Tensor) -> torch.Tensor:
                kept.append(torch.softmax(logits, dim=-1))
                return psi_logit_grads(a, kept[0])

            return head_clipped_sum(model, x, logit_grads, clip), kept[0]

        def total(logits: torch.Tensor) -> torch.Tensor:
            probs = torch.softmax(logits, dim=-1)
            kept.append(probs.detach())
            return (a * probs).sum()

        return linear_stack_clipped_sum(model, x, total, clip), kept[0]
    theta_sum = clipped_psi_theta_sum(model, x, s, w, prior, clip, labels=y)
    with torch.no_grad():
        return theta_sum, torch.softmax(model(x), dim=1)
