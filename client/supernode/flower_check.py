"""Which Flower silofl's SuperNode runtime was checked against, and the check that refuses any other.

Why. The runtime (this package) patches and mirrors Flower's private functions (:data:`FINGERPRINTED`): on another
Flower they may have changed in ways no test of ours would notice at run time. :func:`check_flower` refuses to run
on a Flower whose version is not in :data:`CHECKED_FLOWER_VERSIONS` or whose sources of those functions differ from
the ones checked (sha256 of their source), naming the fix (`silofl silo start --runtime flower` runs Flower's stock
SuperNode). `tests/client/test_supernode_runtime.py` fails the same way when Flower changes under the runtime;
`python -m silofl.client.supernode_runtime fingerprints` prints the installed Flower's fingerprints.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Any

__all__ = ["CHECKED_FLOWER_VERSIONS", "FINGERPRINTED", "FlowerChangedError", "check_flower", "fingerprints"]

#: Flower versions whose internals the runtime was checked against (their sources' fingerprints below).
CHECKED_FLOWER_VERSIONS: tuple[str, ...] = ("1.39.0",)

#: sha256 of the source of every Flower function whose behaviour the runtime relies on or mirrors, as of the
#: versions above. `python -m silofl.client.supernode_runtime fingerprints` prints the installed Flower's.
FINGERPRINTED: dict[str, str] = {
    # the SuperNode's main loop: `time.sleep(3)` after an empty pull, `_pull_and_store_message` returning None when
    # nothing came, `_push_messages` after a message; runtime_api_address and isolation passed by keyword
    "flwr.supernode.start_client_internal:start_client_internal": (
        "bb3df95a5f63b9849fef3ba5fac74c1d01677207e268c37d6895fb6d14399eff"
    ),
    "flwr.supernode.start_client_internal:_pull_and_store_message": (
        "eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be"
    ),
    # `time.sleep(0.5)` while waiting for the ClientApp's reply and for its objects
    "flwr.supernode.start_client_internal:_push_messages": (
        "5f09f2f7a86ced070a9cb343920c8e3ba0c20fda956e7b6d2088965b428f42d2"
    ),
    # calls `start_client_internal` (imported by name into its module) after starting the Runtime API
    "flwr.supernode.cli.flower_supernode:flower_supernode": (
        "e6c32050e07cf3aa3df198b97346adeac80b501b87d051c31470ff69da321286"
    ),
    # one task of a ClientApp process: what `worker.ClientAppWorker.run_task` does, step by step
    "flwr.supernode.runtime.run_clientapp:run_clientapp": (
        "0df7b3272ecdc6e6b52fa24a72d6e394c42a412ebed0cfbad31990e7abebf59b"
    ),
    "flwr.supernode.runtime.run_clientapp:pull_task_input": (
        "5607a23e1673ee876930c1b35685b8dfdfd8b3776a436560b0467042e15fc695"
    ),
    "flwr.supernode.runtime.run_clientapp:push_message": (
        "07cb512c93e065a93a4cba3facc7d37dd99758c56835065a63fdfbfc604dcd8a"
    ),
    "flwr.supernode.runtime.run_clientapp:push_task_output": (
        "9206407456e79e17338d367de7c21e2d840d939de378c03ac61da6cc2b57a3c6"
    ),
    # object pulls retried after 1 s, 2 s, 4 s ... (keyword defaults that `shorten_object_pulls` lowers); their
    # callers use the defaults: the SuperNode's pull from the SuperLink, the ClientApp's from the SuperNode, and the
    # ServerApp's Grid's from the SuperLink
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": (
        "31bb2de46b450e6acfadb7a8bb15e3f2074bb112199826a40a5eaa648bad5b2b"
    ),
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": (
        "139811483a15e4a6c1f8523614c12f28dd3049194e5713816be0931387adb1cf"
    ),
    "flwr.superlink.grid.http_grid:HttpGrid.pull_messages": (
        "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83"
    ),
    # the task heartbeat the worker sends as `_heartbeat_fn` (Flower's, minus the SIGINT on a refused one)
    "flwr.supercore.heartbeat:make_task_heartbeat_fn_http": (
        "a50247986fc79b04c5f3a555d3d6eaf6b72fd72d43d0753103f9b68c43ed0326"
    ),
    # the SuperExec's loop (AcquireTask, launch) that the worker's loop replaces
    "flwr.supercore.superexec.run_superexec:run_superexec": (
        "0cc169d016ac4b3bfe8ddebe9a2ac9a70849828b5e8aaa74e6bda68e1f357fb9"
    ),
    "flwr.supercore.servicer.runtime.runtime_handlers:acquire_task": (
        "e3701406b5547001d679f65d5aeb1ebdaf1e53a680fca9e39455d55ea3b0e003"
    ),
    # the Fleet connection's RetryInvoker that `LinkWatch` hooks: made by `_make_fleet_connection_retry_invoker`
    # (looked up by name in `_init_connection`) from `make_simple_grpc_retry_invoker`, which retries UNAVAILABLE at
    # most MAX_RETRY_DELAY (20 s) apart and stops the SuperNode (SIGINT) on UNAUTHENTICATED
    "flwr.supernode.start_client_internal:_init_connection": (
        "1393636f81d05d40b32e380bee2039a9ddd1bb5b94052e6c9350f6a3b09e0c8c"
    ),
    "flwr.supernode.start_client_internal:_make_fleet_connection_retry_invoker": (
        "2723add5e3c66c5ead5f81adb8690f2ba430c138da662ed11daa8cb3a9c3a280"
    ),
    # opens the Fleet channel with `grpc.secure_channel` / `grpc.insecure_channel(..., options=...)`, looked up on the
    # module's `grpc` (which `install_fast_reconnect` replaces), called by name from the grpc_rere connection
    "flwr.supercore.grpc:create_channel": "6d71819bdc98bae2041f4670b4403968bbd2b598b54a344054f76accf47094fc",
    "flwr.supercore.retry.grpc_retry:make_simple_grpc_retry_invoker": (
        "261143c8938e2b35478aae49b6f20311af6cd608d384fbb4ded6e4184ae3836d"
    ),
}


class FlowerChangedError(RuntimeError):
    """The installed Flower is not one the runtime was checked against; the message names the fix."""


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def fingerprints() -> dict[str, str]:
    """sha256 of the installed Flower's source of every function in :data:`FINGERPRINTED`."""
    return {ref: hashlib.sha256(inspect.getsource(_resolve(ref)).encode()).hexdigest() for ref in FINGERPRINTED}


def check_flower() -> None:
    """FlowerChangedError unless the installed Flower is one the runtime was checked against (version and the
    sources of the functions it relies on)."""
    from flwr.supercore.version import package_version

    fix = (
        "silofl's fast SuperNode runtime (client/supernode_runtime.py) was checked against flwr "
        f"{', '.join(CHECKED_FLOWER_VERSIONS)}; install that (`pip install flwr=={CHECKED_FLOWER_VERSIONS[-1]}`) or "
        "start Flower's stock SuperNode with `silofl silo start --runtime flower` (slower rounds)"
    )
    if package_version not in CHECKED_FLOWER_VERSIONS:
        raise FlowerChangedError(f"flwr {package_version} is installed; {fix}")
    try:
        found = fingerprints()
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        raise FlowerChangedError(
            f"flwr {package_version}: a function this module relies on is gone ({exc}); {fix}"
        ) from None
    changed = sorted(ref for ref, digest in found.items() if digest != FINGERPRINTED[ref])
    if changed:
        raise FlowerChangedError(f"flwr {package_version}: the source of {', '.join(changed)} differs; {fix}")
