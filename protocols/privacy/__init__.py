"""Record-level differential privacy for silos: accounting, noise calibration, the Gaussian mechanism, the ledger.

Pure math on ``dp-accounting``, numpy and torch; no Flower imports, so it is testable without a server.
"""

from protocols.privacy.accountant import (
    ACCOUNTANTS,
    Calibration,
    calibrate_noise,
    combined_noise_multiplier,
    dp_event,
    epsilon_spent,
    pld_value_discretization,
)
from protocols.privacy.gaussian import GaussianMechanism
from protocols.privacy.ledger import BudgetExceededError, LedgerEntry, PrivacyLedger

__all__ = [
    "ACCOUNTANTS",
    "BudgetExceededError",
    "Calibration",
    "GaussianMechanism",
    "LedgerEntry",
    "PrivacyLedger",
    "calibrate_noise",
    "combined_noise_multiplier",
    "dp_event",
    "epsilon_spent",
    "pld_value_discretization",
]
