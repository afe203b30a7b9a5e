"""ONNX Runtime GenAI for a generation-ready LLM's `model.onnx`: the `genai_config.json`
its `Model` loads the folder by, and a generation run through its own `Generator`.

The model is torchport's past/present form (`engine.generation.onnx_past`): with
attention in standard ops the cache grows by the new tokens at each call
(`past_present_share_buffer` false); with ONNX Runtime's GroupQueryAttention
(`engine.targets.onnx.attention`) past and present share one buffer of the context's
length, written in place (true), as the builder's models do. The graph holds everything
the architecture computes, so the config names the model type
`decoder`, ONNX Runtime GenAI's generic decoder-only LLM, rather than an architecture
whose special handling (rotary caches, sliding windows) its own builder writes into the
graph. The config's shape fields are the program's (layers, KV heads, head size), its
token ids the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.generation.onnx_past import PastProgram
    from engine.generation.ready import Generation
    from schemas.generation import GenerationCheck

__all__ = ["FILE", "config", "generate", "installed", "runtime_generation", "write"]

FILE = "genai_config.json"
"""The file ONNX Runtime GenAI's `Model(folder)` reads."""


def installed() -> bool:
    """Whether onnxruntime-genai imports here."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def config(
    generation: Generation, with_past: PastProgram, filename: str, share_buffer: bool = False
) -> dict[str, Any]:
    """The `genai_config.json` of `filename`, the ONNX model of `with_past` (a decoder-only
    LLM; an encoder-decoder one has none). `share_buffer`: its attention is ONNX
    Runtime's GroupQueryAttention, which writes the new keys and values into the past
    buffer in place, so ONNX Runtime GenAI gives past and present one buffer of the
    context's length instead of growing the cache by a copy at every step."""
    text = _text_config(generation.model)
    heads, head_size = with_past.past_shape
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if with_past.positions:
        inputs["position_ids"] = "position_ids"
    inputs |= {
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    eos = generation.token("eos_token_id")
    pad = generation.token("pad_token_id")
    context = int(getattr(text, "max_position_embeddings", 0) or generation.max_cache_len)
    return {
        "model": {
            "type": "decoder",
            "bos_token_id": generation.token("bos_token_id") or 0,
            "eos_token_id": eos if eos is not None else 0,  # ONNX Runtime GenAI needs one
            "pad_token_id": pad if pad is not None else (eos if isinstance(eos, int) else 0),
            "vocab_size": int(getattr(text, "vocab_size", 0) or 0),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": head_size,
                "hidden_size": int(getattr(text, "hidden_size", 0) or heads * head_size),
                "num_attention_heads": int(getattr(text, "num_attention_heads", 0) or heads),
                "num_key_value_heads": heads,
                "num_hidden_layers": with_past.layers,
                "inputs": inputs,
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "max_length": context,
            "min_length": 0,
            "past_present_share_buffer": share_buffer,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def write(path: Path, genai: dict[str, Any]) -> Path:
    """`genai` as `genai_config.json` beside the model at `path`."""
    written = path.with_name(FILE)
    written.write_text(json.dumps(genai, indent=2) + "\n")
    return written


def generate(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens after `prompt` from `model` (an `onnxruntime_genai.Model`), by a new
    `Generator` of its (its cache, positions and mask), each the argmax of the logits it
    returns: an end-of-sequence token does not end the run, as it does not eager's."""
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    tokens: list[int] = []
    while True:
        logits = np.asarray(generator.get_logits())
        tokens.append(int(logits.reshape(-1, logits.shape[-1])[-1].argmax()))
        if len(tokens) == max_new_tokens:
            return tokens
        generator.append_tokens([tokens[-1:]])


def runtime_generation(
    path: Path, generation: Generation, settings: dict[str, Any], notes: list[str]
) -> GenerationCheck | None:
    """The generation check run by ONNX Runtime GenAI on the folder of `path` (its
    `genai_config.json`, loaded once for all the check's runs), when the model has one and
    onnxruntime-genai is installed; a runtime that cannot run it is a note (`model.onnx`
    itself was verified)."""
    if settings.get("genai") is None or not installed():
        return None
    import onnxruntime_genai as og

    from engine.generation.checks import checked

    try:
        model = og.Model(str(path.parent))
        return checked(
            generation,
            lambda prompt, expected: generate(
                model, [int(token) for token in prompt.ids[0]], len(expected)
            ),
        )
    except Exception as exc:  # the runtime's own refusal, e.g. of the config
        notes.append(f"ONNX Runtime GenAI could not generate with it: {exc}"[:1000])
        return None


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    return config.get_text_config() if config is not None else None
