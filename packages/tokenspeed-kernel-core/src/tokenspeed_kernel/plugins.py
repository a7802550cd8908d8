"""Plugin discovery (:mod:`tokenspeed_kernel.core.plugins`), under the name the upstream README uses.

``python -m tokenspeed_kernel.plugins [--json] [--strict]`` is ``tokenspeed-kernel plugins``.
"""

from __future__ import annotations

from .core.plugins import PLUGIN_GROUP, PLUGINS_ENV, PluginReport, load_plugins, plugin_reports

__all__ = ["PLUGIN_GROUP", "PLUGINS_ENV", "PluginReport", "load_plugins", "plugin_reports"]

if __name__ == "__main__":
    import sys

    from .cli import main

    sys.exit(main(["plugins", *sys.argv[1:]]))
