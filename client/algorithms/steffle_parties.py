"""SteFFLe with separate parties (../shared/specs/steffle-hybrid.md; SteFFLe Section 4 and Appendix F): the pure
tensor code of one round, without transport.

A record's features and label live at a *feature party*, its sensitive attribute at a *sensitive party*; they share
only a universal record id. One round goes through the server twice (the spec's "One round"):

1. :func:`feature_party_step`: feature party j Poisson-samples J_j from its ids at rate q_f and returns the SUM of the
   loss gradients over J_j (no noise: it does not depend on any s), |J_j|, and per sampled record the rows
   :class:`FeatureRows` (id, y, F(x_i) = softmax(logits), J_F(x_i) = d F(x_i) / d theta, l x P).
2. :func:`sensitive_party_step`: sensitive party c keeps the requested ids it holds (R_c), each with its own secret
   coin at rate q_s, and returns the noised sums of the clipped per-record d psi / d theta = J_F(x_i)^T a_i (a_i from
   :func:`protocols.ermi.psi_output_cotangents`, Lemma D.1) and of the s-dependent W-gradient (Lemma D.1, W part at
   W = 0). The noise has the standard deviation the party's plan fixes and never depends on |R_c|: a party holding
   none of the ids answers with pure noise of the same shape (the paper's "dummy" noise, Appendix F).
3. :func:`combine_sensitive_sums`: the server's h = (sum over c of the noisy sums) / (q_s * sum_j |J_j|).

The s-independent part of the W-gradient, -2 W (.) F_i, needs only F and the label: the server computes it from the
rows (:func:`protocols.ermi.psi_w_gradients` minus its s-dependent term), as the non-sensitive division does in the
silo mode (`client.algorithms.steffle.w_gradient_base`).

Privacy (spec, "Privacy (decisions)"; this differs from the paper, which amplifies by the feature parties' sample):
the feature parties choose the sample and the server relays it, so both know which records were used. A sensitive
party therefore claims amplification by sampling only from its own secret coins (rate q_s); with q_s = 1 every round
is an un-amplified Gaussian release. Record i's theta-contribution is clipped into the ball of radius C around 0 and
its W-contribution lies in the ball of radius R_W = 2 / sqrt(rho) around 0 (0 is what an unsampled or absent record
contributes), the replace-one geometry of `client.algorithms.steffle`: the party adds sigma * C and sigma * R_W,
or, with per-group W noise (`w_noise`, the default through `w-noise auto`), sigma times each row's own bound
2 / sqrt(p_b(r)) (:func:`client.algorithms.steffle.per_group_w_release`: a record's W term lies in one row, within
that row's bound, as in the silo mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from client.algorithms.dp_fedsgd import poisson_sample
from client.algorithms.steffle import w_release
from protocols.ermi import GroupPrior, probability_rows, psi_output_cotangents, psi_w_gradients
from protocols.models import TabularModel, clipped_row_sum, loss_fn
from protocols.privacy.gaussian import GaussianMechanism


@dataclass(frozen=True)
class FeatureRows:
    """What a feature party tells the sensitive parties about its sampled records (ids, labels, outputs and their
    Jacobians are non-sensitive in this model; the spec's step 1).

    ids: int64 (n,), universal record ids. labels: int64 (n,). outputs: (n, l), F(x_i) = softmax(model(x_i)).
    jacobians: (n, l, P), d F(x_i) / d theta flattened in `protocols.models.parameter_spec` order.
    """

    ids: np.ndarray
    labels: torch.Tensor
    outputs: torch.Tensor
    jacobians: torch.Tensor

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.ids.dtype != np.int64 or self.ids.ndim != 1:
            raise ValueError(f"FeatureRows.ids must be int64 of shape (n,), got {self.ids.dtype} {self.ids.shape}")
        if len(np.unique(self.ids)) != n:
            raise ValueError("FeatureRows.ids holds a record id twice; each sampled record appears once")
        if tuple(self.labels.shape) != (n,):
            raise ValueError(f"FeatureRows.labels must have shape ({n},), got {tuple(self.labels.shape)}")
        if self.outputs.ndim != 2 or self.outputs.shape[0] != n:
            raise ValueError(f"FeatureRows.outputs must have shape ({n}, l), got {tuple(self.outputs.shape)}")
        if self.jacobians.ndim != 3 or tuple(self.jacobians.shape[:2]) != tuple(self.outputs.shape):
            raise ValueError(
                f"FeatureRows.jacobians must have shape ({n}, {self.outputs.shape[1]}, P), "
                f"got {tuple(self.jacobians.shape)}"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def select(self, index: np.ndarray) -> FeatureRows:
        """The rows at positions `index` (int64)."""
        at = torch.from_numpy(index)
        return FeatureRows(self.ids[index], self.labels[at], self.outputs[at], self.jacobians[at])

    @staticmethod
    def concat(parts: list[FeatureRows]) -> FeatureRows:
        """The rows of several feature parties, in order (the server's broadcast of step 2)."""
        if not parts:
            raise ValueError("FeatureRows.concat needs at least one part")
        return FeatureRows(
            np.concatenate([p.ids for p in parts]),
            torch.cat([p.labels for p in parts]),
            torch.cat([p.outputs for p in parts]),
            torch.cat([p.jacobians for p in parts]),
        )


def output_jacobians(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(F, J): F(x_i) = softmax(model(x_i)) (n, l) and d F(x_i) / d theta (n, l, P), flattened in the model's
    parameter order: in closed form for silofl's tabular models (:func:`tabular_output_jacobians`), else per record
    via ``torch.func`` (``vmap(jacrev(...))``)."""
    if isinstance(model, TabularModel):
        return tabular_output_jacobians(model, x)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def outputs(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        return torch.softmax(functional_call(model, p, (xi.unsqueeze(0),)), dim=-1)[0]

    with torch.no_grad():
        F = torch.softmax(model(x), dim=-1)
    if x.shape[0] == 0:
        total = sum(p.numel() for p in params.values())
        return F, F.new_zeros((0, F.shape[1], total))
    jac = vmap(jacrev(outputs), in_dims=(None, 0))(params, x)  # {name: (n, l, *shape)}
    n, l_out = F.shape
    return F, torch.cat([jac[name].reshape(n, l_out, -1) for name in params], dim=2)


def tabular_output_jacobians(model: TabularModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(F, J) of :func:`output_jacobians` for a :class:`protocols.models.TabularModel`, by the chain rule instead of
    one reverse pass per record and output (a whole-row request, `share-rows = all`, is n_j records every round).

    With logits = to_logits(z), z = head(h), h = x (logistic regression) or relu(a), a = hidden(x):
    dF/dlogits = diag(F) - F F^T; G = dF/dz (the binary head's logits are [0, z]: column 1); the head's weight
    Jacobian is G (x) h and its bias' G; the hidden layer's, with G_h = (G W_head) * [a > 0], G_h (x) x and G_h.
    """
    with torch.no_grad():
        a = None if model.hidden is None else model.hidden(x)
        h = x if a is None else torch.relu(a)
        F = torch.softmax(model.to_logits(model.head(h)), dim=-1)
        n, l_out = F.shape
        d_logits = torch.diag_embed(F) - F[:, :, None] * F[:, None, :]  # (n, l, l)
        G = d_logits[:, :, 1:] if model.num_labels == 2 else d_logits  # (n, l, k)
        parts = []
        if a is not None:
            G_h = (G @ model.head.weight) * (a > 0).to(G.dtype)[:, None, :]  # (n, l, H)
            parts += [(G_h[..., None] * x[:, None, None, :]).reshape(n, l_out, -1), G_h]
        parts += [(G[..., None] * h[:, None, None, :]).reshape(n, l_out, -1), G]
        return F, torch.cat(parts, dim=2)


def feature_party_step(
    model: nn.Module,
    ids: np.ndarray,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    rate: float,
    rng: np.random.Generator,
    all_rows: bool = False,
) -> tuple[torch.Tensor, int, FeatureRows]:
    """Step 1 at feature party j: on a Poisson sample J_j (rate q_f) of its records, the SUM of the loss gradients
    (flat (P,), zeros for an empty sample), |J_j| and the rows the sensitive parties need: those of J_j, or with
    `all_rows` those of every record (the sensitive parties then sample with their secret coins alone). Reads no
    sensitive value."""
    idx = poisson_idx = poisson_sample(len(ids), rate, rng)
    x, y = torch.from_numpy(features[idx]), torch.from_numpy(labels[idx])
    params = [p for _, p in model.named_parameters()]
    if len(idx):
        loss = loss_fn(model(x), y) * len(idx)  # the mean loss times |J_j|: the sum of the per-record losses
        grad_sum = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    else:
        grad_sum = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
    if all_rows:
        idx = np.arange(len(ids))
        x, y = torch.from_numpy(features), torch.from_numpy(labels)
    F, J = output_jacobians(model, x)
    return grad_sum.detach(), len(poisson_idx), FeatureRows(np.asarray(ids)[idx].astype(np.int64), y, F, J)


@dataclass(frozen=True)
class SensitiveParty:
    """What sensitive party c holds: its ids S_c and their groups (aligned). The only place s is read.

    Kept sorted by id (sorted here unless given sorted: a party that answers every round builds it from its data's
    cached sorted arrays, `SensitivePartyData.sorted_train`, so a round costs a lookup, not a sort)."""

    ids: np.ndarray
    groups: np.ndarray

    def __post_init__(self) -> None:
        if self.ids.shape != self.groups.shape or self.ids.ndim != 1:
            raise ValueError(f"ids {self.ids.shape} and groups {self.groups.shape} must be aligned 1-D arrays")
        if not _strictly_increasing(self.ids):
            order = np.argsort(self.ids, kind="stable")
            object.__setattr__(self, "ids", self.ids[order])
            object.__setattr__(self, "groups", self.groups[order])
            if not _strictly_increasing(self.ids):
                raise ValueError("a sensitive party holds a record id twice")

    def lookup(self, requested: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in `requested` of the ids this party holds, their groups): R_c = S_c intersect requested."""
        if not len(self.ids):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        where = np.minimum(np.searchsorted(self.ids, requested), len(self.ids) - 1)
        positions = np.flatnonzero(self.ids[where] == requested).astype(np.int64)
        return positions, self.groups[where[positions]].astype(np.int64)


def _strictly_increasing(ids: np.ndarray) -> bool:
    return bool(np.all(ids[1:] > ids[:-1]))


def sensitive_party_step(
    party: SensitiveParty,
    rows: FeatureRows,
    *,
    w: torch.Tensor,
    prior: GroupPrior,
    clip: float,
    noise_multiplier: float,
    keep_rate: float,
    rng: np.random.Generator,
    generator: torch.Generator,
    w_noise: str = "isotropic",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 at sensitive party c: the noised sums (theta (P,), s-dependent W (w.shape)) over the requested records
    it holds, each kept with the party's secret coin at rate q_s = `keep_rate`.

    Record i's theta term is clip(J_F(x_i)^T a_i, C) (Lemma D.1 theta part, clipped as in the silo mode); its W term
    is 2 [s_i = r] F_iu / sqrt(p(r)) in its block (Lemma D.1 W part at W = 0). Noise N(0, (sigma C)^2) and
    N(0, (sigma R_W)^2) is added to the sums whatever |R_c| is, so an empty R_c gives pure noise of the same shape.
    ``w_noise = "per-group"``: each row of the W sum noised at its own bound instead of R_W (the silo mode's
    :func:`~client.algorithms.steffle.per_group_w_release`, the same mechanism for the accountant).

    J_F and F come from the server. A record whose theta term, or its norm, is not finite (a huge J_F can overflow
    J_F^T a_i for one value of s_i and not the other) contributes 0 to the theta sum, and one whose row of F is not
    a probability vector (`protocols.ermi.probability_rows`: not finite, or finite but outside the simplex, where
    the W term's bound 2 / sqrt(p(s_i)) fails) contributes 0 to the W sum. 0 is in both balls whatever s_i is (what
    an absent record contributes), the rule reads only that record's own values, and nothing raises.
    """
    if not 0.0 < keep_rate <= 1.0:
        raise ValueError(f"keep_rate (q_s) must be in (0, 1], got {keep_rate}")
    positions, groups = party.lookup(rows.ids)
    if keep_rate < 1.0 and len(positions):
        kept = rng.random(len(positions)) < keep_rate
        positions, groups = positions[kept], groups[kept]
    dtype = rows.jacobians.dtype
    theta_sum = torch.zeros(rows.jacobians.shape[2], dtype=dtype)
    w_sum = torch.zeros_like(w, dtype=dtype)
    if len(positions):
        mine = rows.select(positions)
        s = torch.from_numpy(groups)
        a = psi_output_cotangents(s, w.to(dtype), prior, mine.labels).to(dtype)  # (n, l)
        per_record = torch.einsum("nlp,nl->np", mine.jacobians, a)  # J_F(x_i)^T a_i
        # a record whose term or its norm is not finite contributes 0 (protocols.models.clip_factors)
        theta_sum = clipped_row_sum([per_record], torch.linalg.vector_norm(per_record, dim=1), clip)
        outputs, labels = mine.outputs.to(dtype), mine.labels
        valid = probability_rows(outputs)
        if not bool(valid.all()):  # rows the server sent that are not soft predictions: their W term is 0
            outputs, s, labels = outputs[valid], s[valid], labels[valid]
        w_sum = psi_w_gradients(outputs, s, torch.zeros_like(w, dtype=dtype), prior, labels).sum(0)
    if noise_multiplier > 0:
        theta_sum = GaussianMechanism(sensitivity=clip, noise_multiplier=noise_multiplier).release(theta_sum, generator)
        w_sum = w_release(w_sum, prior, noise_multiplier, generator, w_noise)
    return theta_sum, w_sum


def combine_sensitive_sums(
    sums: list[tuple[torch.Tensor, torch.Tensor]], sampled: int, keep_rate: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3 at the server: h = (sum over sensitive parties of the noisy sums) / (q_s * sum_j |J_j|); an empty
    round (no record sampled anywhere) divides by 1 (the sums are then pure noise, as the silo mode's empty batch)."""
    if not sums:
        raise ValueError("combine_sensitive_sums needs the reply of every sensitive party")
    theta = torch.stack([t for t, _ in sums]).sum(0)
    w = torch.stack([m for _, m in sums]).sum(0)
    scale = keep_rate * max(sampled, 1)
    return theta / scale, w / scale
