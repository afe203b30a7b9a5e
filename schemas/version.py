"""The installed torchport's version: a leaf module every layer may import (the CLI
package `torchport` re-exports it), so no lower layer needs the CLI for it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("torchport")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
