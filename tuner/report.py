"""What the command writes on the terminal: plain-text tables, and its logging set-up."""

from __future__ import annotations

import logging
from typing import Sequence


def configure_logging(verbose: int) -> None:
    """The command's log level (``-v`` counted) for its own loggers and for Optuna's, which sets
    its level when first imported: so called once Optuna is (``tuner.run.tune.live_main``
    imports it while the GPU process starts)."""
    import optuna

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    optuna.logging.set_verbosity(logging.DEBUG if verbose >= 2 else logging.WARNING)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def config_text(config: dict[str, int] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{name}={value}" for name, value in config.items())
