"""bergstream.plugins.index_backends (see ARCHITECTURE.md)."""
