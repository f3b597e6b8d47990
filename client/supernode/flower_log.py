"""Messages of silofl's SuperNode runtime into Flower's log: the SuperNode's output, next to Flower's own lines."""

from __future__ import annotations

from typing import Any

__all__ = ["log"]


def log(level: int, text: str, *args: Any, exc_info: BaseException | None = None) -> None:
    """Into Flower's log (the SuperNode's output), as Flower's own messages (Flower is imported on the first call)."""
    from flwr.supercore import log as flower_log

    flower_log(level, text, *args, exc_info=exc_info)
