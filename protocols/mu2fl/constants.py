"""The loss's constants for DP-mu2-FL (Reshef, Levy 2024, Section 5.3): G (Lipschitz), L (smoothness), D (the
diameter of the domain K) and d, from which the noise and the step size are calibrated (`calibration`).

`Mu2Constants.for_logreg` derives them for silofl's logistic regression on features in [0, 1]; the bounds are proved
in its docstring and checked, tight, in tests/protocols/mu2fl/test_mu2fl_constants.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from silofl.protocols.mu2fl import checks

__all__ = ["Mu2Constants"]


@dataclass(frozen=True)
class Mu2Constants:
    """The loss's constants on K: f(.; z) is G-Lipschitz and L-smooth, K has diameter D; dim is d (parameters).

    S = G + 2 L D bounds the per-record increment s_t of q_t (Lemma 4.2), and K is the ball of radius D/2 around 0.
    """

    G: float
    L: float
    D: float
    dim: int

    def __post_init__(self) -> None:
        for name in ("G", "L", "D"):
            checks.positive(f"Mu2Constants.{name}", getattr(self, name))
        checks.positive_int("Mu2Constants.dim", self.dim)

    @property
    def S(self) -> float:
        """S = G + 2 L D (Lemma 4.2): the bound on ||s_t||, half the L2 sensitivity of q_t."""
        return self.G + 2.0 * self.L * self.D

    @property
    def radius(self) -> float:
        """Radius D/2 of the ball K around 0."""
        return self.D / 2.0

    @classmethod
    def for_logreg(cls, num_features: int, num_classes: int, D: float = 0.1) -> Mu2Constants:
        """Constants of cross-entropy logistic regression on features in [0, 1]^n with a bias (silofl's "logreg").

        Write the bias as a constant feature: a~ = (a, 1) with ||a~||^2 <= n + 1, logits z = W a~, p = softmax(z),
        f = -log p_y.

        * num_classes > 2 (W is C x (n+1), d = C (n+1)): grad_W f = (p - e_y) a~^T, so
          ||grad||_F = ||p - e_y|| ||a~||, and ||p - e_y||^2 = (1 - p_y)^2 + sum_{k != y} p_k^2
          <= (1 - p_y)^2 + (sum_{k != y} p_k)^2 = 2 (1 - p_y)^2 <= 2: G = sqrt(2 (n+1)). The Hessian is
          (diag(p) - p p^T) kron a~ a~^T; its eigenvalues are products of the factors' eigenvalues, and
          lambda_max(diag(p) - p p^T) <= max_k 2 p_k (1 - p_k) <= 1/2 (Gershgorin: row k has diagonal p_k (1 - p_k)
          and off-diagonal absolute sum p_k (1 - p_k)), lambda_max(a~ a~^T) = ||a~||^2 <= n + 1: L = (n+1)/2.
          Both are approached (G as p -> e_k, k != y; L at p = (1/2, 1/2, 0, ...)) with a = 1, so they are tight.
          MNIST (n = 784, C = 10): G = sqrt(2 * 785) = 39.62, L = 392.5, S = 118.12 with D = 0.1, d = 7850 - the
          paper's Section 5.3 values.
        * num_classes == 2: silofl's binary head has ONE output z = w . a~ (logits [0, z], `protocols.models`), so
          d = n + 1, grad = (sigmoid(z) - y) a~: G = sqrt(n + 1), and the Hessian sigma(z)(1 - sigma(z)) a~ a~^T
          gives L = (n + 1)/4.

        The bounds hold on all of R^d, so in particular on K. They need features in [0, 1] (not z-scored).
        """
        n = checks.positive_int("num_features", num_features)
        classes = checks.positive_int("num_classes", num_classes)
        if classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        width = n + 1  # the features plus the bias
        if classes == 2:
            return cls(G=math.sqrt(width), L=width / 4.0, D=checks.positive("D", D), dim=width)
        return cls(G=math.sqrt(2.0 * width), L=width / 2.0, D=checks.positive("D", D), dim=classes * width)
