"""A user model module that a deployed silo must never import unless its operator allows it: importing it leaves a
mark (`tests/protocols/test_custom_model.py` checks that a refused message did not import it)."""

from __future__ import annotations

import os

from tests.custom_models import tiny

os.environ["SILOFL_TEST_UNTRUSTED_IMPORTED"] = "1"

__all__ = ["tiny"]
