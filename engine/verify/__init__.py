"""The VERIFY stage: the exported program against eager PyTorch (`verification`)."""
