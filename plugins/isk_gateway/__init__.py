"""bergstream.plugins.isk_gateway (see ARCHITECTURE.md)."""
