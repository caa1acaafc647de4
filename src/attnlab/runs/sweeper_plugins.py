"""Register attnlab's Hydra sweepers and launchers (:mod:`hydra_plugins.attnlab`) with Hydra, for an install whose import hook
hides them from Hydra's scan of ``hydra_plugins`` (``pip install -e``)."""

from __future__ import annotations


def register() -> None:
    from hydra.core.plugins import Plugins

    # Hydra's scan first: it executes again every plugin module already imported (Hydra's basic sweeper among them),
    # which would leave a class imported before it with a base class that is no longer Hydra's
    plugins = Plugins.instance()
    from hydra_plugins.attnlab import LAUNCHERS, ContinuableSweeper, OptunaSweeper

    for plugin in (ContinuableSweeper, OptunaSweeper, *LAUNCHERS):
        plugins.register(plugin)
