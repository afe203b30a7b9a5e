"""A tiny MixtralForCausalLM (random weights, 4 experts, top-2, no cache): a mixture of
experts whose experts transformers 5 dispatches through `transformers.integrations.moe`."""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

torch.manual_seed(0)
config = MixtralConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    use_cache=False,
)
model = MixtralForCausalLM(config).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 64, (1, 8)),
    "attention_mask": torch.ones(1, 8, dtype=torch.long),
}
