"""The worker side of torchport: runs uploaded code in the sandbox (`worker.sandbox`)."""
