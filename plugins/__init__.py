"""Plugins shipped with bergstream. Each registers through the `bergstream` entry-point group."""
