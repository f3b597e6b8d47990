"""The maths of SteFFLe (`silofl run steffle`) and of DP-FERMI / FERMI (SteFFLe on one silo): the ERMI fairness
regularizer, its min-max form ``psi_i`` and per-sample gradients (pure maths, no Flower).

Source: the DP-FERMI paper (Lowy, Gupta, Razaviyayn, "Stochastic Differentially Private and Fair Learning", ICLR 2023),
with its matrix forms written entry-wise in the modules: Definition 3.1 (ERMI), Appendix B eq. (5) (the equalized-odds
ERMI), Appendix C Theorem C.1 eq. (6) (the min-max form and ``psi_i``) and Lemma D.1 (its gradients), used by Algorithm
1 lines 5-6 of DP-FERMI and by the sensitive division of SteFFLe's Algorithm 1 (Gupta et al. 2024, line 8).

Notation. ``F (n, l)``: the model's soft predictions ``F(x_i; theta) = softmax(logits)`` (rows on the simplex; for the
binary logistic model ``F = (1 - sigmoid(z), sigmoid(z))``, so ``l = 2`` and the FULL ``k x l`` W of the papers is used,
never the authors' released code's 1x1 reduction). ``s_i in [0, k)`` the sensitive group, ``y_i in [0, l)`` the label,
``p_S`` the global group frequencies (:class:`GroupPrior`). Per sample (eq. (6), Theorem C.1 written entry-wise)::

    psi_i(theta, W) = - sum_{r,u} W_ru^2 F_u(x_i) + 2 p_S(s_i)^(-1/2) sum_u W_{s_i,u} F_u(x_i) - 1
                    = <a_i, F(x_i)> - 1,   a_iu = - sum_r W_ru^2 + 2 W_{s_i,u} / sqrt(p_S(s_i))

The algorithm's registry entry is `protocols.algorithms.steffle`; Tran et al.'s baseline (`protocols.tran`) uses the
same prior and block layout.

One module a job; the public names are re-exported here (`from silofl.protocols import steffle`,
`steffle.GroupPrior`):

* `protocols.fairness_prior` (shared with Tran et al.'s baseline, re-exported here): the fairness notions and their
  ``W`` blocks (`w_shape`), the group prior `GroupPrior` (and the group-balanced objective of issue 20), the prior
  floors `PRIOR_FLOOR` and `MIN_SILO_PRIOR`.
* `objective`: ``psi`` and its batch mean (eq. (6)), the maximiser `optimal_w`, `ermi_value` (Definition 3.1, eq. (5))
  and `block_weights`.
* `gradients`: per-sample W-gradients and output cotangents (Lemma D.1), the checked-input kernels of the silo's hot
  path, and `w_output_term`.
* `theta`: the theta-gradients (Lemma D.1 through the model) and their clipped sum, `psi_logit_grads`.
* `projection`: `project_frobenius`, the server's projection of ``W``.
* `layout`: the per-sample block layout and the cotangents the others are written on.
* `checks`: the argument checks the others share, and `probability_rows`.

Dtypes: float32 in, float32 out; float64 works throughout (tests). ``W`` and the prior are cast to ``F``'s (or the
model's) dtype.
"""

from silofl.protocols.fairness_prior import FAIRNESS_NOTIONS, MIN_SILO_PRIOR, PRIOR_FLOOR, GroupPrior, w_shape
from silofl.protocols.steffle.checks import probability_rows
from silofl.protocols.steffle.gradients import (
    output_block_sums_checked,
    psi_output_cotangents,
    psi_output_cotangents_checked,
    psi_w_gradients,
    psi_w_sensitive_sum_checked,
    w_output_term,
)
from silofl.protocols.steffle.objective import block_weights, ermi_objective, ermi_value, optimal_w, psi
from silofl.protocols.steffle.projection import project_frobenius
from silofl.protocols.steffle.theta import clipped_psi_theta_sum, psi_logit_grads, psi_theta_gradients

__all__ = [
    "FAIRNESS_NOTIONS",
    "MIN_SILO_PRIOR",
    "PRIOR_FLOOR",
    "GroupPrior",
    "block_weights",
    "clipped_psi_theta_sum",
    "ermi_objective",
    "ermi_value",
    "optimal_w",
    "output_block_sums_checked",
    "probability_rows",
    "project_frobenius",
    "psi",
    "psi_logit_grads",
    "psi_output_cotangents",
    "psi_output_cotangents_checked",
    "psi_theta_gradients",
    "psi_w_gradients",
    "psi_w_sensitive_sum_checked",
    "w_output_term",
    "w_shape",
]
