"""Record-level differential privacy for silos: accounting, noise calibration, the Gaussian mechanism, the ledger.

Two neighbouring relations (:data:`RELATIONS`): ``add_remove`` (one record present or absent) and ``replace_one`` (one
record's sensitive attribute changed, for DP w.r.t. sensitive attributes as in DP-FERMI / SteFFLe). Pure math on
``dp-accounting``, numpy and torch; no Flower imports, so it is testable without a server.
"""

from silofl.protocols.privacy.accountant import (
    ACCOUNTANTS,
    RELATIONS,
    Calibration,
    PriorRelease,
    calibrate_noise,
    combined_noise_multiplier,
    dp_event,
    epsilon_spent,
    pld_value_discretization,
)
from silofl.protocols.privacy.closed_form import steffle_closed_form
from silofl.protocols.privacy.gaussian import GaussianMechanism, histogram_sensitivity
from silofl.protocols.privacy.ledger import BudgetExceededError, LedgerEntry, PrivacyLedger

__all__ = [
    "ACCOUNTANTS",
    "RELATIONS",
    "BudgetExceededError",
    "Calibration",
    "GaussianMechanism",
    "LedgerEntry",
    "PriorRelease",
    "PrivacyLedger",
    "calibrate_noise",
    "combined_noise_multiplier",
    "dp_event",
    "epsilon_spent",
    "histogram_sensitivity",
    "pld_value_discretization",
    "steffle_closed_form",
]
