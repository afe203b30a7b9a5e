# Hostile: forge one of the job's result documents into a schema-valid but huge one,
# made of empty objects (`{},{},…`, 3 bytes each), which the worker parses as
# untrusted data. 48 MiB of them made a worker grow by 2.4 GiB.
# `FORGE` (the document and its size in bytes) is set by the test.
import torch

from schemas import GraphDocument, ReportDocument, ReportWarning, SignatureDocument

FORGE = ("graph.json", 48 << 20)
NAME, SIZE = FORGE
EMPTY = [{}] * (SIZE // 3)  # one object, many references: the job itself stays small


def forge_graph(document):
    document.graph.nodes[0].args = EMPTY


def forge_signature(document):
    document.inputs[0].value = EMPTY


def forge_report(document):
    document.warnings.append(ReportWarning(code="forged", message="", details={"x": EMPTY}))


CLASS, GROW = {
    "graph.json": (GraphDocument, forge_graph),
    "signature.json": (SignatureDocument, forge_signature),
    "report.json": (ReportDocument, forge_report),
}[NAME]
ORIGINAL = CLASS.model_dump_json


def dump(self, **kwargs):
    GROW(self)
    return ORIGINAL(self)  # compact: 3 bytes per empty object


CLASS.model_dump_json = dump


model = torch.nn.Linear(4, 3)
example_args = (torch.randn(2, 4),)
