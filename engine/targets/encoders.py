"""An encoder-decoder model's encoder in each target, beside its decoder.

The job's program is the decoder (`program.pt2`); the encoder program (`encoder.pt2`,
`engine.pipeline.encoder_program`) becomes, per target:

- `onnx`: `encoder.onnx` (input named as the encoder's, output `last_hidden_state`, its
  dynamic dim `encoder_sequence_length`), run by ONNX Runtime;
- `aoti`: `encoder.aoti.pt2`, its own AOTInductor package;
- `executorch`: the `encoder` method of `model.pte`, whose decoder method is then
  `text_decoder` (as ExecuTorch's ASR runner and optimum-executorch name them).

Each target's module converts it (`convert_encoder`; the file's name is its registry
row's `encoder`). Each is verified against the eager encoder on the encoder program's
samples (`TargetResult.encoder`), and the target's generation check runs this encoder and
the target's decoder.
"""

from __future__ import annotations

from typing import Any

from engine.generation import Encoder
from engine.verify import verification
from schemas import VerificationReport, VerifyOptions

__all__ = ["DECODER_METHOD", "ENCODER_METHOD", "executorch_settings", "verify"]

ENCODER_METHOD, DECODER_METHOD = "encoder", "text_decoder"


def executorch_settings(encoder: Encoder) -> dict[str, Any]:
    """What `engine.targets.executorch.convert` and `load` take for a model with an
    encoder: the decoder as `text_decoder`, the encoder as a second method."""
    assert encoder.traced is not None, "the encoder program is made first"
    return {"method": DECODER_METHOD, "extra_methods": {ENCODER_METHOD: encoder.traced}}


def verify(encoder: Encoder, runner: Any, opts: VerifyOptions) -> VerificationReport:
    """The target's encoder against the eager encoder, on the encoder program's samples."""
    from engine.targets.interface import structured_runner

    program = encoder.program
    assert program is not None, "the encoder program is made first"
    return verification.verify(
        program,
        encoder.module,
        (),
        dict(encoder.kwargs),
        opts,
        runner=structured_runner(runner, program),
        names=encoder.names,
    )
