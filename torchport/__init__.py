"""torchport: PyTorch export as a service. The CLI lives in `torchport.cli`."""

from schemas.version import __version__

__all__ = ["__version__"]
