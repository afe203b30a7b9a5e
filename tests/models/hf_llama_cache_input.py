"""One decoding step of a tiny LlamaForCausalLM: a `DynamicCache` of 8 positions in,
the cache grown to 9 out."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    use_cache=True,
)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    prefix = model(input_ids=torch.randint(0, 64, (2, 8)), use_cache=True)
example_kwargs = {
    "input_ids": torch.randint(0, 64, (2, 1)),
    "attention_mask": torch.ones(2, 9, dtype=torch.long),
    "past_key_values": prefix.past_key_values,
}
