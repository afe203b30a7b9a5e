"""Patches a function of a library the zygote warmed (transformers), then reports what it
saw on stdout: whether the library was already imported when the upload started, and
whether an earlier job's patch was still there. PATCH = False only looks."""

import json
import sys

WARM_BEFORE = "transformers.modeling_utils" in sys.modules

import torch  # noqa: E402
import transformers.modeling_utils as modeling_utils  # noqa: E402

PATCH = True

seen = {
    "warm_before": WARM_BEFORE,
    "patched_before": getattr(modeling_utils, "TORCHPORT_PATCHED_BY", None),
    "function_before": modeling_utils.get_state_dict_dtype.__name__,
}
if PATCH:

    def patched_state_dict_dtype(state_dict):
        return torch.float64

    modeling_utils.get_state_dict_dtype = patched_state_dict_dtype
    modeling_utils.TORCHPORT_PATCHED_BY = "an earlier job"
seen["function_after"] = modeling_utils.get_state_dict_dtype.__name__
print("SEEN " + json.dumps(seen), flush=True)


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


model = Model()
example_args = (torch.ones(2, 2),)
