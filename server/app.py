"""The Flower ServerApp: validates the run config and runs the federation (`flwr run .` enters here).

`silofl run` builds the same ServerApp around an already validated config (:func:`make_server_app`), so every engine
runs :func:`server.orchestrator.run_federation` with identical code. In a deployment the Grid Flower hands in is
wrapped by :func:`server.polling.polling_grid` (same messages, faster pulls of the replies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from silofl.protocols.config import RunConfig


def make_server_app(
    config: RunConfig | None = None,
    *,
    sink: Callable[[dict[str, Any]], None] | None = None,
    engine: str = "",
    progress: bool = True,
) -> ServerApp:
    """A ServerApp for `config` (or, if None, for the run config Flower passes in `context.run_config`)."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        from silofl.server.orchestrator import run_federation
        from silofl.server.polling import polling_grid
        from silofl.server.progress import RunProgress

        cfg = config if config is not None else RunConfig.parse(context.run_config)
        grid = polling_grid(grid)  # deployed: replies pulled within milliseconds, not every 3 s (server/polling.py)
        with RunProgress(cfg, enabled=progress) as bar:
            result = run_federation(grid, cfg, on_start=bar.start, on_round=bar.update, engine=engine or "flower")
        if sink is not None:
            sink(result)

    return server_app


app = make_server_app()
