"""An op no deployment target converts (`aten._linalg_eigh`), made on a marked line."""

import torch


class Spectrum(torch.nn.Module):
    def forward(self, x):
        gram = x @ x.T
        values = torch.linalg.eigvalsh(gram)  # LINE: eigh
        return values * 2


model = Spectrum()
example_args = (torch.randn(4, 3),)
