"""The user's names in the artifacts (issue 20): dim names in signature.json and the
verification samples, ONNX input/output/dim names, ONNX metadata, and the ONNX options
(`onnx.opset`, `onnx.dtype`, `onnx.external_data`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from engine import targets
from engine.serialize import documents
from engine.shapes.dim_names import dim_names
from engine.targets.onnx import names as onnx_names
from schemas import ExportOptions, TargetResult
from schemas.version import __version__
from tests.engine.test_targets import needs


class Tagger(torch.nn.Module):
    """A dict output with a nested tuple, a list input and a keyword input."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 32)  # 512 bytes: over ONNX's inline size

    def forward(
        self, x: torch.Tensor, cache: list[torch.Tensor], *, mask: torch.Tensor
    ) -> dict[str, Any]:
        y = self.proj(x)
        return {"logits": y * mask.unsqueeze(-1), "hidden": (y, cache[0] + 1)}


BATCH, SEQ = Dim("batch", min=1, max=16), Dim("seq", min=2, max=32)
ARGS = (torch.randn(2, 5, 4), [torch.randn(2, 32)])
KWARGS = {"mask": torch.ones(2, 5)}
SPEC = {"x": {0: BATCH, 1: SEQ}, "cache": [{0: BATCH}], "mask": {0: BATCH, 1: SEQ}}


@pytest.fixture(scope="module")
def tagger() -> tuple[torch.nn.Module, torch.export.ExportedProgram, dict[str, str]]:
    torch.manual_seed(0)
    module = Tagger().eval()
    ep = torch.export.export(module, ARGS, KWARGS, dynamic_shapes=SPEC).run_decompositions()
    return module, ep, dim_names(ep, SPEC, module, ARGS, KWARGS)


def run_onnx(
    case: tuple[torch.nn.Module, torch.export.ExportedProgram, dict[str, str]],
    out_dir: Path,
    threshold: int | None = None,
    **onnx: Any,
) -> TargetResult:
    module, ep, names = case
    return targets.run_target(
        "onnx",
        targets.TargetJob(
            program=ep,
            traced=ep,
            pristine=module,
            args=ARGS,
            kwargs=KWARGS,
            out_dir=out_dir,
            options=ExportOptions(targets=["onnx"], onnx=onnx),
            names=names,
            overrides={} if threshold is None else {"external_threshold": threshold},
        ),
    )


# --- torch's symbols under the user's names ----------------------------------------------


def test_declared_dims_name_the_programs_symbols(tagger: Any) -> None:
    _, ep, names = tagger
    assert sorted(names.values()) == ["batch", "seq"]
    assert set(names) == {str(symbol) for symbol in ep.range_constraints}
    signature = documents.signature_document(
        ep, args=ARGS, kwargs=KWARGS, dynamic_shapes_json=None, names=names
    )
    user = {i.pytree_path: i.shape for i in signature.inputs if i.kind == "user_input"}
    assert user == {
        "args[0]": ["batch", "seq", 4],
        "args[1][0]": ["batch", 32],
        "kwargs['mask']": ["batch", "seq"],
    }
    outputs = [o.shape for o in signature.outputs]
    assert outputs == [["batch", "seq", 32], ["batch", "seq", 32], ["batch", 32]]
    ranges = {(r.symbol, r.min, r.max) for r in signature.range_constraints}
    assert ranges == {("batch", 1, 16), ("seq", 2, 32)}
    graph = documents.graph_document(ep, documents.SourceMap(Path(".")), names)
    assert {r.symbol for r in graph.range_constraints} == {"batch", "seq"}
    placeholder = next(node for node in graph.graph.nodes if node.name == "x")
    assert placeholder.shape == ["batch", "seq", 4]


def test_a_derived_dim_names_its_root_and_auto_keeps_torchs_symbol() -> None:
    class Pair(torch.nn.Module):
        def forward(
            self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return x[1:] + y, z * 2

    half = Dim("half", min=2, max=16)
    spec = {"x": {0: half + 1}, "y": {0: half}, "z": {0: Dim.AUTO}}
    args = (torch.randn(5, 2), torch.randn(4, 2), torch.randn(3))
    module = Pair()
    ep = torch.export.export(module, args, dynamic_shapes=spec)
    names = dim_names(ep, spec, module, args, {})
    assert list(names.values()) == ["half"]
    shapes = [
        documents.shape_of(n.meta["val"], names) for n in ep.graph.nodes if n.op == "placeholder"
    ]
    assert shapes[0] == ["half + 1", 2] and shapes[1] == ["half", 2]
    assert shapes[2][0] not in {"half", "half + 1"} and str(shapes[2][0]).startswith("s")


def test_verification_samples_are_keyed_by_the_users_dim_names(tagger: Any) -> None:
    from engine.verify import verification

    module, ep, names = tagger
    opts = ExportOptions().verify
    report = verification.verify(ep, module, ARGS, KWARGS, opts, names=names)
    assert report.passed is True
    drawn = [sample.symbols for sample in report.samples if sample.label != "example"]
    assert drawn and all(set(symbols) == {"batch", "seq"} for symbols in drawn)
    assert drawn[0] == {"batch": 1, "seq": 2} and drawn[1] == {"batch": 16, "seq": 32}


# --- ONNX names --------------------------------------------------------------------------


def test_onnx_inputs_outputs_and_dims_carry_the_users_names(tagger: Any, tmp_path: Path) -> None:
    needs("onnx")
    import onnx
    import onnxruntime

    result = run_onnx(tagger, tmp_path)
    assert result.status == "succeeded", result.error
    assert result.verification is not None and result.verification.passed is True
    details = result.details
    assert details["inputs"] == ["x", "cache.0", "mask"]
    assert details["outputs"] == ["logits", "hidden.0", "hidden.1"]
    assert details["input_shapes"] == {
        "x": ["batch", "seq", 4],
        "cache.0": ["batch", 32],
        "mask": ["batch", "seq"],
    }
    assert details["output_shapes"]["hidden.1"] == ["batch", 32]
    samples = [s.symbols for s in result.verification.samples if s.label != "example"]
    assert samples and all(set(symbols) == {"batch", "seq"} for symbols in samples)

    model = onnx.load(str(tmp_path / "model.onnx"))
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    assert metadata["torchport.version"] == __version__
    assert "torchport.task" not in metadata  # not a Hugging Face model: no task known
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["x", "cache.0", "mask"]
    assert session.get_inputs()[0].shape == ["batch", "seq", 4]
    x, cache, mask = torch.randn(7, 9, 4), torch.randn(7, 32), torch.rand(7, 9)
    logits, hidden_1 = session.run(
        ["logits", "hidden.1"], {"mask": mask.numpy(), "x": x.numpy(), "cache.0": cache.numpy()}
    )
    with torch.no_grad():
        expected = tagger[0](x, [cache], mask=mask)
    torch.testing.assert_close(torch.from_numpy(logits), expected["logits"])
    torch.testing.assert_close(torch.from_numpy(hidden_1), expected["hidden"][1])


def test_outputs_named_like_inputs_passed_through_or_repeated(tmp_path: Path) -> None:
    needs("onnx")

    class Echo(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            z = x + 1
            return {"x": x, "z": z, "z2": z, "y": y * 2}

    module, args = Echo(), (torch.randn(2), torch.randn(2))
    ep = torch.export.export(module, args).run_decompositions()
    result = targets.run_target(
        "onnx",
        targets.TargetJob(
            program=ep,
            traced=ep,
            pristine=module,
            args=args,
            kwargs={},
            out_dir=tmp_path,
            options=ExportOptions(targets=["onnx"]),
        ),
    )
    assert result.status == "succeeded", result.error
    assert result.details["inputs"] == ["x", "y"]
    assert result.details["outputs"] == ["x.output", "z", "z2", "y.output"]
    assert result.verification is not None and result.verification.passed is True


def out_spec(value: Any) -> pytree.TreeSpec:
    return pytree.tree_flatten(value)[1]


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (torch.zeros(1), ["output"]),
        ((torch.zeros(1), torch.zeros(1)), ["output_0", "output_1"]),
        (
            (torch.zeros(1), (torch.zeros(1), torch.zeros(1))),
            ["output_0", "output_1.0", "output_1.1"],
        ),
        ({"a": (torch.zeros(1), torch.zeros(1))}, ["a.0", "a.1"]),
        (
            {"logits": 0, "past_key_values": {"layers": [{"keys": 0, "values": 0}]}},
            ["logits", "present.0.key", "present.0.value"],
        ),
    ],
    ids=["tensor", "tuple", "nested tuple", "dict of tuple", "cache"],
)
def test_output_names(outputs: Any, expected: list[str]) -> None:
    assert onnx_names.output_names(out_spec(outputs)) == expected


def test_input_names_follow_forward_and_optimums_cache_names() -> None:
    def forward(input_ids: Any, past_key_values: Any = None, *extra: Any, **rest: Any) -> None:
        return None

    cache = {"layers": [{"keys": torch.zeros(1), "values": torch.zeros(1)}]}
    names = onnx_names.input_names(
        forward, (torch.zeros(1), cache, torch.zeros(1)), {"attention_mask": torch.zeros(1)}
    )
    assert names == [
        "input_ids",
        "past_key_values.0.key",
        "past_key_values.0.value",
        "args.2",
        "attention_mask",
    ]
    # Non-tensor leaves are constants of the model: no input, no name.
    assert onnx_names.input_names(forward, (torch.zeros(1), 3), {}) == ["input_ids"]


def test_task_of_a_hugging_face_class() -> None:
    class LlamaForCausalLM(torch.nn.Module):
        config = object()

    class BertModel(torch.nn.Module):
        config = object()

    assert onnx_names.task(LlamaForCausalLM()) == "text-generation"
    assert onnx_names.task(BertModel()) == "feature-extraction"
    assert onnx_names.task(torch.nn.Linear(1, 1)) is None


# --- ONNX options ------------------------------------------------------------------------


def test_external_data_above_the_threshold_writes_two_files(tagger: Any, tmp_path: Path) -> None:
    needs("onnx")
    import onnxruntime

    result = run_onnx(tagger, tmp_path, threshold=16)
    assert result.status == "succeeded", result.error
    assert result.artifacts == ["model.onnx", "model.onnx.data"]
    assert result.details["external_data"] is True
    data = tmp_path / "model.onnx.data"
    # Tensors under ONNX's inline size (256 bytes) stay in model.onnx; the weight goes out.
    assert 512 <= data.stat().st_size <= result.details["initializer_bytes"]
    assert result.verification is not None and result.verification.passed is True
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [o.name for o in session.get_outputs()] == ["logits", "hidden.0", "hidden.1"]
    data.unlink()
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    with pytest.raises(Fail):  # the weights are in the data file, not in model.onnx
        onnxruntime.InferenceSession(
            str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
        )


@pytest.mark.parametrize(("setting", "files"), [(False, ["model.onnx"]), ("auto", ["model.onnx"])])
def test_external_data_off_or_below_the_threshold_is_one_file(
    tagger: Any, tmp_path: Path, setting: Any, files: list[str]
) -> None:
    needs("onnx")
    result = run_onnx(tagger, tmp_path, threshold=None, external_data=setting)
    assert result.status == "succeeded", result.error
    assert result.artifacts == files and not (tmp_path / "model.onnx.data").exists()
    assert result.details["external_data"] is False


def test_external_data_true_is_external_whatever_the_size(tagger: Any, tmp_path: Path) -> None:
    needs("onnx")
    result = run_onnx(tagger, tmp_path, external_data=True)
    assert result.artifacts == ["model.onnx", "model.onnx.data"]


def test_a_failed_target_leaves_no_data_file(
    tagger: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs("onnx")
    from engine.targets import onnx as onnx_target

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the session cannot start")

    monkeypatch.setattr(onnx_target, "load", broken)
    result = run_onnx(tagger, tmp_path, external_data=True)
    assert result.status == "failed" and result.artifacts == []
    assert list(tmp_path.iterdir()) == []


def test_weights_over_the_largest_file_fail_before_writing(
    tagger: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs("onnx")
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 100))
    result = run_onnx(tagger, tmp_path, external_data=True)
    assert result.status == "failed" and result.error is not None
    assert result.error.details["reason"] == "file_size_limit"
    assert result.error.details["max_bytes"] == 100
    assert result.error.details["initializer_bytes"] > 100
    assert list(tmp_path.iterdir()) == []


def test_opset_option(tagger: Any, tmp_path: Path) -> None:
    needs("onnx")
    result = run_onnx(tagger, tmp_path, opset=18)
    assert result.status == "succeeded", result.error
    assert result.details["opset"] == 18


def test_float16_weights_verified_with_the_float16_tolerance(tagger: Any, tmp_path: Path) -> None:
    needs("onnx")
    import onnx

    from engine.targets import onnx as onnx_target

    result = run_onnx(tagger, tmp_path, dtype="float16")
    assert result.status == "succeeded", result.error
    model = onnx.load(str(tmp_path / "model.onnx"))
    dtypes = {init.data_type for init in model.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in dtypes and onnx.TensorProto.FLOAT not in dtypes
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    check = result.verification
    assert check is not None and check.passed is True
    tolerances = {(o.atol, o.rtol) for s in check.samples for o in s.outputs}
    assert tolerances == {onnx_target.FLOAT16_TOLERANCE}
    errors = [o.max_abs_error for s in check.samples for o in s.outputs]
    assert max(e for e in errors if e is not None) > 0  # float16 arithmetic, not float32
