"""The foundation: platform, formats, contracts, registry, selection, plugins, dispatch."""
