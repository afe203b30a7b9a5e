"""An encoder-decoder model's encoder in each target, beside its decoder.

The job's program is the decoder (`program.pt2`); the encoder program (`encoder.pt2`,
`engine.pipeline.encoder_program`) becomes, per target:

- `onnx`: `encoder.onnx` (input named as the encoder's, output `last_hidden_state`, its
  dynamic dim `encoder_sequence_length`), run by ONNX Runtime;
- `aoti`: `encoder.aoti.pt2`, its own AOTInductor package;
- `executorch`: the `encoder` method of `model.pte`, whose decoder method is then
  `text_decoder` (as ExecuTorch's ASR runner and optimum-executorch name them).

Each is verified against the eager encoder on the encoder program's samples
(`TargetResult.encoder`), and the target's generation check runs this encoder and the
target's decoder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.generation import Encoder
from engine.verify import verification
from schemas import VerificationReport, VerifyOptions
from schemas.version import __version__

__all__ = ["DECODER_METHOD", "ENCODER_FILES", "ENCODER_METHOD", "convert", "verify"]

ENCODER_FILES = {"onnx": "encoder.onnx", "aoti": "encoder.aoti.pt2"}
"""The file of the encoder per target; ExecuTorch's is a method of `model.pte`."""
ENCODER_METHOD, DECODER_METHOD = "encoder", "text_decoder"


def executorch_settings(encoder: Encoder) -> dict[str, Any]:
    """What `engine.targets.executorch.convert` and `load` take for a model with an
    encoder: the decoder as `text_decoder`, the encoder as a second method."""
    assert encoder.traced is not None, "the encoder program is made first"
    return {"method": DECODER_METHOD, "extra_methods": {ENCODER_METHOD: encoder.traced}}


def convert(
    name: str,
    target: Any,
    encoder: Encoder,
    path: Path,
    settings: dict[str, Any],
    facts: dict[str, Any],
) -> tuple[Any, list[Path]]:
    """Convert the encoder for target `name` (its module `target`) beside the decoder's
    artifact at `path`, load it, and return its flat runner and the files written."""
    program = encoder.program
    assert program is not None, "the encoder program is made first"
    kwargs = dict(encoder.kwargs)
    if name == "executorch":  # a method of the decoder's .pte, written with it
        return target.load(path, encoder.traced, method=ENCODER_METHOD), []
    written = path.with_name(ENCODER_FILES[name])
    own: dict[str, Any] = {}
    if name == "onnx":
        metadata = {"torchport.version": __version__, "torchport.task": "encoder"}
        target.convert(
            program,
            (),
            kwargs,
            written,
            facts=own,
            input_names=[encoder.input_name],
            output_names=["last_hidden_state"],
            dim_names=encoder.names,
            metadata=metadata,
            opset=settings.get("opset"),
            dtype=settings.get("dtype", "float32"),
            external_data=settings.get("external_data", "auto"),
        )
        runner = target.load(
            written, program, input_names=own.get("inputs"), output_names=["last_hidden_state"]
        )
        files = [written, *(p for p in target.companions(written) if p.exists())]
    else:
        target.convert(program, (), kwargs, written, facts=own, isa=settings.get("isa", "portable"))
        runner = target.load(written, program, isa=settings.get("isa", "portable"))
        files = [written]
    facts["encoder"] = {key: value for key, value in own.items() if key != "inputs"}
    return runner, files


def verify(encoder: Encoder, runner: Any, opts: VerifyOptions) -> VerificationReport:
    """The target's encoder against the eager encoder, on the encoder program's samples."""
    from engine.targets import structured_runner

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
