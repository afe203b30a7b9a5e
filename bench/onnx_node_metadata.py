"""What the node metadata torch's ONNX exporter writes costs a generation-ready LLM's
`model.onnx`: its bytes with the nodes' `metadata_props` kept and removed
(`engine.targets.onnx.metadata.strip_node_metadata`, which `engine.targets.onnx.convert`
calls before saving).

    python bench/onnx_node_metadata.py

The model is the tests' tiny Llama (tests/engine/test_generation.py: 2 layers, hidden
size 32, vocabulary 96), traced with its cache as inputs and outputs
(`engine.generation.onnx_past.past_program`) and converted twice.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from engine.generation import onnx_past
    from engine.targets import onnx as target
    from tests.engine.test_generation_check import ready

    _, generation = ready()
    made = onnx_past.past_program(generation)
    sizes = {}
    with tempfile.TemporaryDirectory() as directory:
        for label, strip in (("kept", lambda model: 0), ("removed", target.strip_node_metadata)):
            path = Path(directory) / f"{label}.onnx"
            with mock.patch.object(target, "strip_node_metadata", strip):
                target.convert(
                    made.program,
                    (),
                    made.kwargs,
                    path,
                    input_names=made.input_names,
                    output_names=made.output_names,
                    dim_names=made.dim_names,
                )
            sizes[label] = path.stat().st_size
    kept, removed = sizes["kept"], sizes["removed"]
    print(f"model.onnx with node metadata:    {kept:>9,} bytes")
    print(f"model.onnx without node metadata: {removed:>9,} bytes")
    print(f"node metadata: {kept - removed:,} bytes ({(kept - removed) / kept:.0%})")


if __name__ == "__main__":
    main()
