"""Generation-ready LLMs: a `text-generation` checkpoint exported with a KV cache.

`ready` wraps a decoder-only transformers model in transformers' own export recipe
(`TorchExportableModuleWithStaticCache`, as optimum-executorch does): the static cache
is a set of mutable buffers, and one program serves prefill and decode through
`cache_position`. `greedy` decodes greedily with eager transformers (its own forward,
dynamic cache), with a cached program or artifact, and compares the tokens.
`seq2seq` makes an encoder-decoder model generation-ready as two programs: an encoder,
and a decoder with a static cache that takes `encoder_hidden_states` (the job's program).
`onnx_past` is the ONNX form: explicit `past_key_values.{i}.key|value` inputs and
`present.{i}.key|value` outputs, as optimum names them. `checks` runs the checks: the
example prompt, a second prompt and the example again, on one loaded program or artifact.
"""

from engine.generation.checks import (
    checked,
    constant_warnings,
    expected_tokens,
    mismatch_details,
    mismatch_error,
    mismatch_text,
    onnx_check,
    program_report,
    runner_check,
)
from engine.generation.greedy import cached_tokens, check, eager_tokens
from engine.generation.ready import Encoder, Generation, Prompt, make_ready
from engine.generation.seq2seq import make_seq2seq_ready

__all__ = [
    "Encoder",
    "Generation",
    "Prompt",
    "cached_tokens",
    "check",
    "checked",
    "constant_warnings",
    "eager_tokens",
    "expected_tokens",
    "make_ready",
    "make_seq2seq_ready",
    "mismatch_details",
    "mismatch_error",
    "mismatch_text",
    "onnx_check",
    "program_report",
    "runner_check",
]
