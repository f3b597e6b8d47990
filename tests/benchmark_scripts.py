"""Helpers for the tests of benchmarks/ scripts: they are scripts, not a package, so a test loads one by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(file_name: str, module_name: str) -> ModuleType:
    """benchmarks/`file_name` executed as module `module_name`, registered in sys.modules first: dataclasses (and
    pickling) look a class's module up there by name."""
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / file_name)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {BENCHMARKS / file_name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
