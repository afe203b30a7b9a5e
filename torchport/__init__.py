"""torchport: PyTorch export as a service. The CLI lives in `torchport.cli`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("torchport")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
