"""bergstream core: the plugin contract and the runtimes every plugin builds on.

The layers and import rules are in docs/architecture.md.

Importing this package never imports a plugin, pyspark or any optional backend library.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bergstream")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
