"""Test kits shipped with bergstream for plugin authors (backend conformance suites)."""
