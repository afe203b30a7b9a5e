"""An installed library probes with a socket at import (urllib3's IPv6 check), then the
program fails verification: the outcome is verification_failed, the probe a warning."""

import urllib3  # noqa: F401  (creates a socket at import: HAS_IPV6 = _has_ipv6("::1"))
import torch

NOISY = True


class Model(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x) if NOISY else x + 1


model = Model()
example_args = (torch.zeros(4, 4),)
