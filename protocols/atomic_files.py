"""Crash-safe, owner-only file writes for the state a node must not lose or leak.

A silo's job files and run specs (`client.privacy_state`) and its lifetime ledger (`client.lifetime_ledger`) record
what it has spent of its privacy budget: a file torn by a crash would make it forget a charge, and the files hold its
ledger and, for DP-mu2-FL, its un-noised momentum. :func:`atomic_write` therefore never leaves a mix of old and new
bytes, and never lets another user of the machine read them.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write-to-temporary, flush to disk, rename: a crash leaves the old file or the new one, never a mix.

    Owner-only permissions (0600 files, 0700 new folders): the state holds a silo's ledger and, for DP-mu2-FL, its
    un-noised momentum, which must not be readable by other users of the machine.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
