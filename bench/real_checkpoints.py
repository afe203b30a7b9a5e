"""Real-size checkpoints with random weights, written fast: the model is built on the meta
device (no memory, no init), then each tensor is drawn in the target dtype and written
straight into safetensors shards of at most 2 GB with their index, as `save_pretrained`
lays them out (tied weights saved once).

    python bench/real_checkpoints.py llama-245m DIR # 245M, float32, 0.98 GB
    python bench/real_checkpoints.py llama-1b DIR   # 1.24B, bfloat16, 2.47 GB
    python bench/real_checkpoints.py llama-3b DIR   # 3.2B, bfloat16, 6.4 GB

Normal draws scaled by `initializer_range` (norms at 1) give the logits' spread of a
trained model's order, so greedy decoding has margins to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}
LLAMA_3B = {
    **LLAMA_1B,
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
}
LLAMA_245M = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 14,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-245m": ("LlamaConfig", "LlamaForCausalLM", LLAMA_245M),
    "llama-1b": ("LlamaConfig", "LlamaForCausalLM", LLAMA_1B),
    "llama-3b": ("LlamaConfig", "LlamaForCausalLM", LLAMA_3B),
}
SHARD_BYTES = 2 * 10**9


def write(name: str, directory: Path) -> int:
    """Write model `name`'s checkpoint under `directory` in its `torch_dtype`; the
    parameter count."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config_class, model_class, fields = MODELS[name]
    dtype = fields["torch_dtype"]
    config = getattr(transformers, config_class)(**fields)
    config.architectures = [model_class]  # as from_pretrained's save writes it
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    generator = torch.Generator().manual_seed(0)
    std = config.initializer_range
    seen: set[tuple[int, ...]] = set()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    count = 0
    for key, param in model.state_dict(keep_vars=True).items():
        if param.device.type == "meta" and id(param) in seen:
            continue
        seen.add(id(param))
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        shape = tuple(param.shape)
        if key.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=getattr(torch, dtype))
        else:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            tensor.normal_(0.0, std, generator=generator)
        nbytes = tensor.numel() * tensor.element_size()
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
        count += tensor.numel()
    total = len(shards)
    index: dict[str, Any] = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{total:05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        for key, tensor in shard.items():
            index["weight_map"][key] = file
            index["metadata"]["total_size"] += tensor.numel() * tensor.element_size()
        shard.clear()
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return count


if __name__ == "__main__":
    print(f"{write(sys.argv[1], Path(sys.argv[2])) / 1e9:.2f}B parameters")
