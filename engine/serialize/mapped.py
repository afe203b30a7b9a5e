"""Loading a saved program with its weights mapped from the file, not read into memory.

`torch.export.load` reads every weight record of a `.pt2` into memory
(`torch.export.pt2_archive._package._build_file_map`): a 2.5 GB program costs 2.5 GB of
anonymous memory in the loading process, on top of the file's pages in the page cache.
Within `mapped_weights(path)` the records are instead views of one private, copy-on-write
mapping of the file (the records are stored uncompressed, aligned to 64 bytes): the
pages are the page cache's, read as the program runs, and nothing is copied. Everything
else of the load is torch's own. Files under `MAPPED_FROM_BYTES` load as torch loads them.

`run_releasing` runs such a program node by node and gives each parameter's pages back
(`MADV_DONTNEED`) once the last node reading it (or a view of it) has run: the loader's
memory then holds about one layer's weights at a time, not the whole program, beside the
job that exported it (`bench/hf_checkpoints.py real-size`). A page read again later is
read again from the page cache, with the same bytes.

Torch only: the round trip's fresh process imports this.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.export.pt2_archive import _package
from torch.fx import _pytree as fx_pytree

from engine.load.pages import Mapping

__all__ = ["MAPPED_FROM_BYTES", "Mapping", "mapped_weights", "run_releasing"]

MAPPED_FROM_BYTES = 64 << 20
"""Programs at least this big have their weights mapped."""


_VIEWS = frozenset(
    {
        "alias",
        "as_strided",
        "detach",
        "expand",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "squeeze",
        "t",
        "transpose",
        "unflatten",
        "unsqueeze",
        "view",
        "_unsafe_view",
    }
)
"""Ops whose result may share its first argument's storage."""


@contextlib.contextmanager
def mapped_weights(path: str | os.PathLike[str]) -> Iterator[Mapping | None]:
    """Within it, `torch.export.load(path)` maps the weights of the file at `path`; yields
    the mapping (None for a file under `MAPPED_FROM_BYTES`)."""
    if os.path.getsize(path) < MAPPED_FROM_BYTES:
        yield None
        return
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    held = Mapping(mapping)
    original = _package._build_file_map

    def build(archive_reader: Any, config: Any, base_dir: str) -> dict[str, torch.Tensor]:
        file_map: dict[str, torch.Tensor] = {}
        reader = archive_reader.archive_file
        for meta in config.config.values():
            if meta.use_pickle or meta.path_name in file_map or meta.tensor_meta is None:
                continue
            tensor_meta = meta.tensor_meta
            dtype = _package.deserialize_scalar_type(tensor_meta.dtype)
            device = _package.deserialize_device(tensor_meta.device)
            record = os.path.join(base_dir, meta.path_name)
            nbytes = reader.get_record_size(record)
            size = torch._utils._element_size(dtype)
            offset = reader.get_record_offset(record) if nbytes else 0
            if nbytes == 0 or device.type != "cpu" or nbytes % size or offset % size:
                return original(archive_reader, config, base_dir)  # torch's own way
            flat = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)
            held.base = flat.data_ptr() - offset
            tensor = flat.view(dtype)
            if tensor_meta.requires_grad:
                tensor.requires_grad_(True)
            file_map[meta.path_name] = tensor
        return file_map

    _package._build_file_map = build
    try:
        yield held
    finally:
        _package._build_file_map = original


def run_releasing(
    module: fx.GraphModule, mapping: Mapping, in_spec: Any, args: Any, kwargs: Any
) -> Any:
    """`module(*args, **kwargs)` (an unlifted program, `ep.module()`) run node by node,
    each of its parameters' pages in `mapping` given back after the last node that reads
    it or a view of it."""
    graph = module.graph
    position = {node: index for index, node in enumerate(graph.nodes)}

    class Releasing(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            for tensor in after.get(position[node], ()):
                mapping.release(tensor)
            return result

    interpreter = Releasing(module)
    owner: dict[fx.Node, fx.Node] = {}
    last: dict[fx.Node, int] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            value = interpreter.fetch_attr(str(node.target))
            if isinstance(value, torch.nn.Parameter) and mapping.holds(value):
                owner[node], last[node] = node, position[node]
        for source in node.all_input_nodes:
            weight = owner.get(source)
            if weight is None:
                continue
            last[weight] = max(last[weight], position[node])
            packet = getattr(node.target, "__name__", "").split(".")[0]
            if node.op == "call_function" and packet in _VIEWS and node.args[:1] == (source,):
                owner[node] = weight
    after: dict[int, list[torch.Tensor]] = defaultdict(list)
    for weight, index in last.items():
        after[index].append(interpreter.fetch_attr(str(weight.target)))
    flat = fx_pytree.tree_flatten_spec((args, kwargs), in_spec)
    output = interpreter.run(*flat, enable_io_processing=False)
    return graph.process_outputs(output)
