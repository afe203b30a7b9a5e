"""What parsing a job's documents costs the worker: bounded by the item and byte limits
(`outputs.count_items`), not by what the job wrote.

A job that swapped in a schema-valid 48 MiB `graph.json` of `{},{},…` grew the worker by
1.8 GiB. The worker's peak RSS is measured around each parse (the kernel's high-water
mark, reset first: `/proc/self/clear_refs`), which counts the parser's native memory too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from schemas import GraphDocument, ReportDocument, SignatureDocument
from tests.sandbox.conftest import Arena
from worker.sandbox import SandboxSettings
from worker.sandbox.host.outputs import Untrusted, count_items, validate

MIB = 1 << 20
LIMITS = SandboxSettings()


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(field)


@contextmanager
def peak_growth() -> Iterator[list[float]]:
    """This process's peak RSS growth (MiB) over the block, into the list it yields."""
    growth: list[float] = []
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset VmHWM to the current RSS
    before = _status_mib("VmRSS")
    yield growth
    growth.append(_status_mib("VmHWM") - before)


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("graph.json", 48 * MIB),  # as found: over the byte limit now
        ("graph.json", 30 * MIB),  # under the byte limit, over the item limit
        ("signature.json", 30 * MIB),
        ("report.json", 7 * MIB),
    ],
    ids=["graph-48MiB", "graph-30MiB", "signature-30MiB", "report-7MiB"],
)
def test_a_forged_huge_document_does_not_grow_the_worker(
    arena: Arena, name: str, size: int
) -> None:
    model = arena.model("documents")
    model.write_text(
        model.read_text().replace('FORGE = ("graph.json", 48 << 20)', f"FORGE = {(name, size)!r}")
    )
    with peak_growth() as growth:
        result, _, _ = arena.run(model)
    assert result.error is not None
    assert result.error.code == "internal_error"
    assert result.error.details["file"] == name
    assert {"max_bytes", "max_items"} & set(result.error.details)
    # Measured: 1 MiB over the byte limit, 30 / 7 MiB (the bytes read) under it. Before
    # documents were counted: 1,845 MiB (48 MiB graph), 1,153 and 1,073 MiB (30 MiB
    # graph and signature), 259 MiB (report; and the job succeeded).
    assert growth[0] < 64, growth


def _document(head: bytes, item: bytes, tail: bytes, items: int, size: int) -> bytes:
    """`head` + as many `item`s as fit in `items` + `tail`, the first string of `head`
    ("PAD") grown so that the document is `size` bytes."""
    count = (items - count_items(head + tail)) // (count_items(item) + 1)
    body = head + b",".join([item] * count) + tail
    return body.replace(b'"PAD"', b'"' + b"x" * (size - len(body) + 3) + b'"', 1)


GRAPH_NODES = (
    b'{"graph":{"nodes":[{"name":"PAD","op":"b","target":"c"},',
    b'{"name":"a","op":"b","target":"c"}',
    b'],"inputs":[],"outputs":[]},"op_histogram":{},"range_constraints":[]}',
)
SIGNATURE_INPUTS = (
    b'{"inputs":[{"kind":"a","name":"PAD"},',
    b'{"kind":"a","name":"b"}',
    b'],"outputs":[],"range_constraints":[]}',
)
REPORT_SAMPLES = (
    b'{"status":"failed","environment":{"torchport":"PAD","python":"3","platform":"p"},'
    b'"verification":{"enabled":true,"samples":[',
    b'{"label":"a","status":"passed"}',
    b"]}}",
)


@pytest.mark.parametrize(
    ("document", "parts", "items", "size"),
    [
        # The costliest shapes found per item: a model instance per few items.
        (GraphDocument, GRAPH_NODES, LIMITS.max_json_items, LIMITS.max_json_bytes),
        (SignatureDocument, SIGNATURE_INPUTS, LIMITS.max_json_items, LIMITS.max_json_bytes),
        (ReportDocument, REPORT_SAMPLES, LIMITS.max_report_items, LIMITS.max_report_bytes),
    ],
    ids=["graph-nodes", "signature-inputs", "report-samples"],
)
def test_a_document_at_the_limits_is_parsed_within_a_bound_and_one_item_more_is_not(
    document: type[GraphDocument | SignatureDocument | ReportDocument],
    parts: tuple[bytes, bytes, bytes],
    items: int,
    size: int,
) -> None:
    data = _document(*parts, items=items, size=size)
    assert len(data) == size and items - 8 <= count_items(data) <= items
    with peak_growth() as growth:
        validate(document, "doc.json", data, items)
    # Measured at the default limits: graph 133 to 169 MiB, signature 77 to 146 MiB,
    # report 18 MiB (less when the heap holds memory freed earlier).
    assert growth[0] < 200, growth
    with peak_growth() as growth, pytest.raises(Untrusted) as caught:
        validate(document, "doc.json", data, count_items(data) - 1)
    assert caught.value.details["max_items"] == count_items(data) - 1
    assert growth[0] < 8, growth


def test_nesting_beyond_the_parsers_bound_is_refused_not_a_crash() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    data = (
        b'{"graph":{"nodes":[{"name":"a","op":"b","target":"c","args":['
        + deep
        + b']}],"inputs":[],"outputs":[]},"op_histogram":{},"range_constraints":[]}'
    )
    with pytest.raises(Untrusted):
        validate(GraphDocument, "graph.json", data, 10**6)
