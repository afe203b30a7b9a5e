"""A tiny DeepseekV3ForCausalLM (random weights, no cache): multi-head latent attention,
one dense layer then a mixture of 4 routed experts (top-2 of 2 groups) and a shared one."""

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

torch.manual_seed(0)
config = DeepseekV3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    max_position_embeddings=64,
    use_cache=False,
)
model = DeepseekV3ForCausalLM(config).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 64, (1, 8)),
    "attention_mask": torch.ones(1, 8, dtype=torch.long),
}
