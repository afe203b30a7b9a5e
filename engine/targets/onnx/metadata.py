"""What torch's ONNX exporter records on every node, removed before `model.onnx` is saved.

`torch.onnx.export(dynamo=True)` writes `metadata_props` on each node: the FX node, its
stack trace, module class hierarchy, name scopes and namespace (and onnxscript's rewrite
rule names). They are three quarters of a small LLM's file, and the stack traces name
the worker's source paths; ONNX Runtime reads none of them. The model's own
`metadata_props` (`torchport.*`) and the graph's are kept.
"""

from __future__ import annotations

from typing import Any

__all__ = ["strip_node_metadata"]


def strip_node_metadata(model: Any) -> int:
    """Clear `metadata_props` on every node of `model` (an `onnx_ir.Model`): the main
    graph, its subgraphs (If, Loop, Scan bodies) and its functions. Returns how many
    entries were removed."""
    import onnx_ir as ir

    graphs: list[Any] = [model.graph, *model.functions.values()]
    removed = 0
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            removed += len(node.metadata_props)
            node.metadata_props.clear()
    return removed
