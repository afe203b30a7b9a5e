"""How far a decomposed bfloat16 program is from a float32 reference of the same weights,
next to eager PyTorch's own bfloat16 error (engine.verify.precision.PRECISION_RATIO).

    python bench/precision_ratio.py [--hidden 512] [--layers 4] [--dtype bfloat16]

For each architecture (random weights at transformers' own initialization), the model in
`--dtype` runs eagerly and as `torch.export` + `run_decompositions` on a 32-token prompt;
both are compared with `engine.verify.precision.float32_reference`. Prints the max abs
errors of the logits and their ratio (program / eager); the ratio the engine allows must
stay above every row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.verify.precision import float32_reference

ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 64}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
}


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def measure(name: str, hidden: int, layers: int, dtype: torch.dtype) -> tuple[float, float]:
    import transformers

    config_class, model_class, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_class)(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        max_position_embeddings=2048,
        **extra,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).to(dtype).eval()
    wrapped = Logits(model)
    ids = torch.randint(0, 32000, (1, 32))
    with torch.no_grad():
        eager = wrapped(ids)
        program = torch.export.export(wrapped, (ids,)).run_decompositions().module()(ids)
    reference = float32_reference(wrapped, (ids,), {}).double()
    eager_error = float((eager.double() - reference).abs().max())
    program_error = float((program.double() - reference).abs().max())
    return eager_error, program_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(
        f"| architecture | eager error | program error | ratio |  ({args.dtype}, "
        f"hidden {args.hidden}, {args.layers} layers)"
    )
    print("|---|---|---|---|")
    for name in ARCHITECTURES:
        eager_error, program_error = measure(name, args.hidden, args.layers, dtype)
        ratio = program_error / eager_error if eager_error else float("inf")
        print(f"| {name} | {eager_error:.4f} | {program_error:.4f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
