"""Plugins shipped with bergstream, each registered through the ``bergstream`` entry-point group
like a third party's, and each reaching core only through ``bergstream.core.api``."""
