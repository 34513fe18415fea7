"""bergstream.plugins.cache_backends (see ARCHITECTURE.md)."""
