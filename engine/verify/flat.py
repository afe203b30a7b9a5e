"""Outputs as flat leaves with their paths (`out[0]`, `.logits`), for the comparisons of
verification and of the round trip. torch only: the round trip's loader imports it."""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree

__all__ = ["flatten_with_paths"]


def flatten_with_paths(tree: Any) -> tuple[list[tuple[str, Any]], pytree.TreeSpec]:
    """Leaves with their `keystr` paths, and the spec.

    Unlike `tree_flatten_with_path`, a node registered without key support (as
    Hugging Face's ModelOutput is) does not raise: its children get `[i]` paths.
    """
    leaves: list[tuple[str, Any]] = []
    _walk(tree, "", leaves)
    return leaves, pytree.tree_structure(tree)


def _walk(tree: Any, prefix: str, leaves: list[tuple[str, Any]]) -> None:
    node_type = pytree._get_node_type(tree)
    node = pytree.SUPPORTED_NODES.get(node_type)
    if node is None:
        leaves.append((prefix, tree))
        return
    if node.flatten_with_keys_fn is not None:
        keyed, _ = node.flatten_with_keys_fn(tree)
        for key, child in keyed:
            _walk(child, prefix + pytree.keystr((key,)), leaves)
        return
    children, _ = node.flatten_fn(tree)
    for index, child in enumerate(children):
        _walk(child, f"{prefix}[{index}]", leaves)
