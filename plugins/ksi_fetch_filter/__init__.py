"""bergstream.plugins.ksi_fetch_filter (see ARCHITECTURE.md)."""
