"""The backing-off polls of silofl's SuperNode runtime: how long to wait before asking again.

Why. Flower 1.39's SuperNode sleeps fixed steps (3 s after an empty pull, 0.5 s while it waits for a reply) and its
SuperExec polls every 1 s: seconds per round that no app can save. A :class:`Backoff` polls within milliseconds
while messages flow and slows down to Flower's own step when nothing happens. Standard library only: the
ServerApp's polling Grid (:mod:`silofl.server.polling`) imports it without Flower's SuperNode.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLOWER_IDLE_SLEEP", "FLOWER_REPLY_SLEEP", "IDLE_PULL", "REPLY_WAIT", "TASK_POLL", "Backoff"]

# The two sleeps of Flower's SuperNode loop that `flower_patches.PollClock` replaces (in seconds, as written in
# Flower's source).
FLOWER_IDLE_SLEEP = 3
FLOWER_REPLY_SLEEP = 0.5


@dataclass(frozen=True)
class Backoff:
    """A poll interval that grows with the time already waited: `ratio` of it, between `floor` and `cap` seconds.

    Waiting `w` seconds for something that then arrives costs at most `ratio * w + floor` extra: a few milliseconds
    while messages flow, and an idle poller wakes at most every `cap` seconds (about log(cap/floor)/ratio polls to
    get there, then one per `cap`)."""

    floor: float
    cap: float
    ratio: float = 0.1

    def __post_init__(self) -> None:
        if not (0 < self.floor <= self.cap) or not self.ratio > 0:
            raise ValueError(f"Backoff needs 0 < floor <= cap and ratio > 0, got {self}")

    def step(self, waited: float) -> float:
        """Seconds to sleep before the next poll, after `waited` seconds of waiting."""
        return min(self.cap, max(self.floor, self.ratio * waited))


#: SuperNode -> SuperLink pulls (gRPC, TLS, a signed request each): backing off to Flower's own 3 s when idle.
IDLE_PULL = Backoff(floor=0.01, cap=3.0, ratio=0.1)
#: SuperNode waiting for its ClientApp's reply (in-memory state, no I/O): Flower's step of 0.5 s as the cap.
REPLY_WAIT = Backoff(floor=0.002, cap=FLOWER_REPLY_SLEEP, ratio=0.1)
#: The ClientApp worker asking its SuperNode for a task (local HTTP): Flower's SuperExec default of 1 s as the cap.
TASK_POLL = Backoff(floor=0.005, cap=1.0, ratio=0.1)
