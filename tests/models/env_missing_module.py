"""Imports a package no worker has: model_import_failed, details.missing_module."""

import torch
import torchport_no_such_package  # LINE: import

model = torch.nn.Linear(2, 2)
example_args = (torch.randn(1, 2),)
