"""An installed library probes with a socket at import (urllib3's IPv6 check), then the
program fails verification: the outcome is verification_failed, the probe a warning."""

import sys

# The zygote may have imported urllib3 already (transformers brings it in, and the
# zygote warms transformers): import it afresh, as a job whose library is not warm would.
for name in [n for n in sys.modules if n == "urllib3" or n.startswith("urllib3.")]:
    del sys.modules[name]

import urllib3  # noqa: E402, F401  (creates a socket at import: HAS_IPV6 = _has_ipv6("::1"))
import torch  # noqa: E402

NOISY = True


class Model(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x) if NOISY else x + 1


model = Model()
example_args = (torch.zeros(4, 4),)
