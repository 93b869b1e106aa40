"""Loading bench/search_efficiency.py (a script, not a package) in tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_efficiency.py"


def search_efficiency() -> ModuleType:
    spec = importlib.util.spec_from_file_location("search_efficiency", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
