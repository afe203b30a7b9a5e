"""Imports a package no worker has."""

import torch

import torchport_no_such_package_for_tests  # LINE: missing

model = torch.nn.Identity()
example_args = (torch.zeros(1),)
