"""silofl's SuperNode runtime, one job a module; its command line is :mod:`silofl.client.supernode_runtime`
(``python -m silofl.client.supernode_runtime supernode|clientapp|fingerprints ...``), whose docstring says why it
exists and what it does.

* :mod:`.flower_check`: the Flower versions and the fingerprints of Flower's private functions this runtime was
  checked against, and the check that refuses any other Flower;
* :mod:`.flower_log`: messages into Flower's log (the SuperNode's output);
* :mod:`.backoff`: the backing-off poll intervals (stdlib only: the ServerApp's polling Grid uses them too);
* :mod:`.flower_patches`: the patches of Flower's SuperNode loop: short polls, object pulls retried within
  milliseconds, messages of stopped runs dropped;
* :mod:`.link_watch`: what the SuperNode says about its link to the SuperLink, and short gRPC reconnection pauses;
* :mod:`.worker`: the ClientApp worker process (long-lived, or a fresh process per message);
* :mod:`.node`: the SuperNode itself: Flower's `flower-supernode` with the patches, supervising its worker;
* :mod:`.exit_status`: how a runtime process ends (its exit status, no interpreter finalization);
* :mod:`.stack_dumps`: SIGUSR1 prints every thread's stack.

This package imports nothing at import time, and :mod:`.exit_status`, :mod:`.stack_dumps` and :mod:`.backoff` only
the standard library.
"""
