"""Option `quantize` (engine.quantization): quantized targets, their accuracy against the
float eager model (`report.quantization`), the budget, and the schemes a target refuses.

The accuracy measure is tested on plain runners (fast); PT2E programs, the whole pipeline
on a small CNN (`tests/models/quant_cnn.py`) and a tiny BERT (`tests/models/quant_bert.py`),
whose imports and conversions take 20 s to a few minutes on 2 shared cores: `slow`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.quantization import TARGET_SCHEMES, accuracy, takes
from schemas.options import QuantizeOptions
from tests.engine.model_files import MODELS, export_file


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def _measure(runner: Any, options: QuantizeOptions) -> Any:
    model = Classifier().eval()
    args = (torch.randn(4, 16),)
    program = torch.export.export(model, args)
    return accuracy.measure(runner, program, model, args, {}, options, samples=0)


def test_an_artifact_equal_to_float_has_cosine_one_and_full_top1_agreement() -> None:
    model = Classifier().eval()
    check, entry = _measure(lambda args, kwargs: model(*args), QuantizeOptions())
    assert check.passed is True
    assert entry.measured and entry.passed is True
    assert entry.cosine == pytest.approx(1.0)
    assert entry.max_abs_error == 0.0
    assert entry.top1_agreement == 1.0  # a 2-D output is classification-shaped
    assert [o.path for o in entry.outputs] == [""]
    assert entry.samples == 1


def test_an_artifact_outside_the_cosine_budget_fails_its_verification() -> None:
    model = Classifier().eval()

    def noisy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        out = model(*args)
        return out + torch.randn(out.shape, generator=torch.Generator().manual_seed(1))

    check, entry = _measure(noisy, QuantizeOptions(min_cosine=0.99))
    assert check.passed is False
    assert check.samples[0].outputs[0].passed is False
    assert entry.passed is False
    assert entry.cosine is not None and entry.cosine < 0.99
    assert entry.outputs[0].mean_abs is not None and entry.outputs[0].mean_abs > 0
    # The same artifact passes a budget in abs error that it is within.
    assert entry.max_abs_error is not None
    _, loose = _measure(noisy, QuantizeOptions(max_abs=entry.max_abs_error + 1))
    assert loose.passed is True


class Recording(Classifier):
    """Records the storage of the weight each forward computes with (in a list its
    copies share)."""

    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.head.weight.untyped_storage().data_ptr())
        return self.head(x)

    def __deepcopy__(self, memo: dict[int, Any]) -> Recording:
        memo[id(self.seen)] = self.seen  # copies record into the same list
        clone = Recording.__new__(Recording)
        memo[id(self)] = clone
        for key, value in vars(self).items():
            setattr(clone, key, copy.deepcopy(value, memo))
        return clone


def test_the_float_model_runs_on_the_uploads_own_weights_not_a_copy_of_them() -> None:
    """A full copy per sample held a 3.21B model's weights twice (6.4 GB)."""
    seen: list[int] = []
    model = Recording(seen).eval()
    args = (torch.randn(4, 16),)
    program = torch.export.export(Classifier().eval(), args)
    _, entry = accuracy.measure(
        lambda a, k: model.head(*a), program, model, args, {}, QuantizeOptions(), samples=0
    )
    assert entry.passed is True
    assert seen == [model.head.weight.untyped_storage().data_ptr()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_reduced_precision_models_reference_is_float32_of_its_own_weights(
    dtype: torch.dtype,
) -> None:
    """A quantized copy of a bfloat16 model computes (and answers) in float32: it is
    measured against the float32 computation of the same weights, dtype aside."""
    model = Classifier().to(dtype).eval()
    args = (torch.randn(4, 16).to(dtype),)
    program = torch.export.export(model, args)
    wide = torch.nn.Linear(16, 10)
    wide.load_state_dict({k: v.float() for k, v in model.head.state_dict().items()})

    def in_float32(a: tuple[Any, ...], k: dict[str, Any]) -> torch.Tensor:
        return wide(a[0].float())

    check, entry = accuracy.measure(
        in_float32, program, model, args, {}, QuantizeOptions(), samples=0
    )
    assert check.passed is True, check.samples[0]
    assert entry.cosine == pytest.approx(1.0) and entry.max_abs_error is not None
    assert entry.max_abs_error < 1e-5  # float32 against float32, not against bfloat16
    eager_error = float((model(*args).float() - in_float32(args, {})).abs().max())
    assert eager_error > 1e-4  # eager in its own dtype is that far off

    def in_own_dtype(a: tuple[Any, ...], k: dict[str, Any]) -> torch.Tensor:
        return model(*a)

    check, entry = accuracy.measure(
        in_own_dtype, program, model, args, {}, QuantizeOptions(), samples=0
    )
    assert entry.max_abs_error == pytest.approx(eager_error)  # widened, then compared
    assert entry.cosine is not None and entry.cosine > 0.99


def test_a_static_program_is_sampled_with_other_values_of_the_examples_shapes() -> None:
    """Without dynamic dimensions quantization's calibration and accuracy vary the values:
    floats drawn afresh, integers inside the example's own range, non-tensors as given."""
    from engine.shapes.sampling import draw_values

    args = (torch.randn(2, 3), torch.tensor([[4, 7], [5, 6]]), 3)
    drawn = draw_values(args, {"mask": torch.ones(2, 2, dtype=torch.bool)}, 3, 0)
    assert [label for label, _, _ in drawn] == ["values-1", "values-2", "values-3"]
    firsts = []
    for _, symbols, sample in drawn:
        assert symbols == {} and not isinstance(sample, str)
        (x, ids, constant), kwargs = sample
        assert x.shape == (2, 3) and not torch.equal(x, args[0])
        assert ids.dtype == torch.int64 and int(ids.min()) >= 4 and int(ids.max()) <= 7
        assert constant == 3 and kwargs["mask"].dtype == torch.bool
        firsts.append(float(x[0, 0]))
    assert len(set(firsts)) == 3


def test_the_schemes_each_target_takes() -> None:
    assert takes("executorch", "8da4w") and takes("onnx", "int8_dynamic")
    assert not takes("onnx", "int8_weight_only") and not takes("aoti", "int8")
    assert takes("aoti", "int8_dynamic") and takes("aoti", "8da4w")
    assert all(takes(name, "none") for name in TARGET_SCHEMES)


@pytest.mark.slow  # over 20 s on 2 shared cores (a pipeline run; executorch imports)
def test_a_target_that_cannot_take_the_scheme_fails_with_the_schemes_it_takes(
    tmp_path: Path,
) -> None:
    result = export_file(
        tmp_path,
        "quant_cnn.py",
        {"targets": ["aoti"], "quantize": {"scheme": "int8"}, "profile": {"enabled": False}},
    )
    report = result.report
    assert report.status == "succeeded"  # program.pt2 is kept
    error = report.targets["aoti"].error
    assert error is not None and error.code == "target_failed"
    assert error.details["reason"] == "scheme_unsupported"
    assert error.details["schemes"] == ["none", *TARGET_SCHEMES["aoti"]]
    assert [w.code for w in report.warnings] == ["target_failed"]
    assert report.quantization is not None
    assert report.quantization.targets["aoti"].measured is False


@pytest.mark.slow
def test_int8_cnn_is_three_times_smaller_on_executorch_within_the_budget(tmp_path: Path) -> None:
    pytest.importorskip("executorch")
    pytest.importorskip("onnxruntime")
    result = export_file(
        tmp_path,
        "quant_cnn.py",
        {
            "targets": ["onnx", "executorch"],
            "quantize": {"scheme": "int8"},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )
    report = result.report
    assert report.status == "succeeded", report.error
    quantization = report.quantization
    assert quantization is not None and quantization.scheme == "int8"
    assert quantization.calibration_samples == 4  # the example and 3 verification samples
    namespace: dict[str, Any] = {}
    exec((MODELS / "quant_cnn.py").read_text(), namespace)
    float_bytes = sum(p.numel() * 4 for p in namespace["model"].parameters())
    pte = report.targets["executorch"]
    assert pte.status == "succeeded" and pte.size is not None
    assert pte.size * 3 <= float_bytes
    onnx = report.targets["onnx"]
    assert onnx.status == "succeeded" and onnx.size is not None
    assert onnx.size * 3 <= float_bytes
    for name in ("executorch", "onnx"):
        entry = quantization.targets[name]
        assert entry.measured and entry.passed is True, name
        assert entry.cosine is not None and entry.cosine >= 0.99, name
        assert entry.samples == 4
        verification = report.targets[name].verification
        assert verification is not None and verification.verdict == "verified"
        assert entry.method is not None and "missed the budget" not in entry.method  # full int8
    assert not [w for w in report.warnings if w.code == "quantization_inaccurate"]


@pytest.mark.slow
def test_outside_the_budget_with_targets_required_is_the_jobs_error(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    result = export_file(
        tmp_path,
        "quant_cnn.py",
        {
            "targets": ["onnx"],
            "targets_required": True,
            "quantize": {"scheme": "int8_dynamic", "min_cosine": 1.0},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False, "samples": 0},
        },
    )
    report = result.report
    assert report.status == "failed"
    assert report.error is not None and report.error.code == "quantization_inaccurate"
    assert report.error.details["target"] == "onnx"
    assert report.quantization is not None
    assert report.quantization.targets["onnx"].passed is False


@pytest.mark.slow  # over 20 s on 2 shared cores (a pipeline run; executorch imports)
@pytest.mark.parametrize("scheme", ["int8", "int8_dynamic"])
def test_pt2e_programs_stay_close_to_float(scheme: str) -> None:
    # int8_dynamic's weight observers must see a run too, else its weights are
    # quantized with default qparams (scale 1) and the outputs are far off.
    pytest.importorskip("executorch")
    from engine.quantization import pt2e

    model = Classifier().eval()
    args = (torch.randn(4, 16),)
    traced = torch.export.export(model, args)
    program = pt2e.quantize(
        traced, args, {}, dynamic=scheme == "int8_dynamic", calibration=[(args, {})]
    )
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert any("quantize_per_channel" in op for op in ops)
    with torch.no_grad():
        expected, actual = model(*args), program.module()(*args)
    cosine = torch.nn.functional.cosine_similarity(expected.flatten(), actual.flatten(), dim=0)
    assert float(cosine) >= 0.99


@pytest.mark.slow
def test_int8_bert_encoder_is_twice_smaller_on_executorch_within_the_budget(
    tmp_path: Path,
) -> None:
    pytest.importorskip("executorch")
    pytest.importorskip("transformers")
    result = export_file(
        tmp_path,
        "quant_bert.py",
        {
            "targets": ["executorch"],
            "quantize": {"scheme": "int8"},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )
    report = result.report
    assert report.status == "succeeded", report.error
    namespace: dict[str, Any] = {}
    exec((MODELS / "quant_bert.py").read_text(), namespace)
    float_bytes = sum(p.numel() * 4 for p in namespace["model"].parameters())
    pte = report.targets["executorch"]
    assert pte.status == "succeeded" and pte.size is not None
    assert pte.size * 2 <= float_bytes  # the embeddings stay float
    assert report.quantization is not None
    entry = report.quantization.targets["executorch"]
    assert entry.passed is True and entry.samples == 4
    assert entry.cosine is not None and entry.cosine >= 0.99
    assert [o.path for o in entry.outputs] == ["['last_hidden_state']"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two conversions of a generation-ready LLM on 2 shared cores
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_8da4w_on_a_generation_ready_llama_compares_greedy_tokens(
    tmp_path: Path, dtype: str
) -> None:
    """A bfloat16 checkpoint too: XNNPACK's kernels for the scheme take float32, so the
    quantized copy computes in float32 (its linears widened one at a time)."""
    pytest.importorskip("executorch")
    import transformers

    from tests.engine.test_checkpoints import export, zip_directory
    from tests.engine.test_generation import TEXT_GENERATION, llama

    directory = llama(tmp_path)
    if dtype == "bfloat16":
        model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
        model.to(torch.bfloat16).save_pretrained(directory)
    archive = zip_directory(directory, tmp_path / "model.zip")
    options = {
        **TEXT_GENERATION,
        "verify": {"roundtrip": False, "samples": 0},
        "decomposition": {"mode": "none"},
        "generation": {"max_new_tokens": 6},
        "targets": ["executorch"],
        "quantize": {"scheme": "8da4w"},
        "profile": {"enabled": False},
    }
    report = export(tmp_path, archive, options).report
    assert report.status == "succeeded", report.error
    assert report.model is not None and set(report.model.parameters) == {dtype}
    assert report.generation is not None and report.generation.check is not None
    pte = report.targets["executorch"]
    assert pte.status == "succeeded", pte.error
    assert pte.details["attention"] == "llama::custom_sdpa"  # widened: float32 attention
    assert report.quantization is not None and report.quantization.group_size == 32
    entry = report.quantization.targets["executorch"]
    assert entry.measured is True and entry.generation is not None
    # the example's logits measured (a bfloat16 model against float32 of its weights)
    assert entry.cosine is not None and entry.max_abs_error is not None
    assert [o.path for o in entry.outputs] == [""] and entry.samples == 1
    assert report.generation.check.max_new_tokens == 6
    assert_tokens_matched_from_the_first(entry, report.generation.check)


def assert_tokens_matched_from_the_first(entry: Any, check: Any) -> None:
    """A quantized artifact's greedy tokens (`entry.generation`) are float eager's as
    `check` has them, and `matched` counts those equal from the first."""
    tokens = check.max_new_tokens
    assert entry.generation.max_new_tokens == tokens
    assert entry.generation.expected == check.expected
    assert len(entry.generation.generated) == tokens
    leading = 0
    for got, want in zip(entry.generation.generated, entry.generation.expected, strict=True):
        if got != want:
            break
        leading += 1
    assert entry.generation.matched == leading


def test_int8_dynamic_onnx_leaves_matmuls_by_stacked_weights_float(tmp_path: Path) -> None:
    """ONNX Runtime's DynamicQuantizeMatMul fails at run time on a per-channel 3-D weight
    ("b zero point is not valid"): such MatMuls stay float, the 2-D linear is quantized."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    result = export_file(
        tmp_path,
        "quant_batched_weights.py",
        {
            "targets": ["onnx"],
            "quantize": {"scheme": "int8_dynamic"},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )
    report = result.report
    assert report.status == "succeeded", report.error
    target = report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert report.quantization is not None
    assert report.quantization.targets["onnx"].passed is True
    ops = [node.op_type for node in onnx.load(str(result.artifacts["model.onnx"])).graph.node]
    assert "MatMul" in ops  # the stacked weight's, float
    assert "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops  # the linear's


@pytest.mark.slow  # an AOTInductor compile (g++) on 2 shared cores
def test_aoti_takes_torchaos_int8_dynamic_and_verifies_it(tmp_path: Path) -> None:
    """AOTInductor's `int8_dynamic` is torchao's 8-bit dynamic activations with int8
    weights on the linears; the package runs with torch alone and is judged by the
    budget against float eager."""
    pytest.importorskip("torchao")
    result = export_file(
        tmp_path,
        "quant_mlp.py",
        {
            "targets": ["aoti"],
            "targets_required": True,
            "quantize": {"scheme": "int8_dynamic"},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )
    report = result.report
    assert report.status == "succeeded", report.error
    target = report.targets["aoti"]
    assert target.status == "succeeded", target.error
    assert target.verification is not None and target.verification.verdict == "verified"
    assert report.quantization is not None
    entry = report.quantization.targets["aoti"]
    assert entry.method is not None and "Int8DynamicActivationIntxWeightConfig" in entry.method
    assert entry.passed is True and entry.samples == 4
    assert entry.cosine is not None and entry.cosine >= 0.99
    assert entry.max_abs_error is not None and entry.max_abs_error > 0  # quantized, not float


@pytest.mark.slow  # two conversions of a transformers model
def test_int8_that_misses_the_budget_falls_back_to_linears_within_it(tmp_path: Path) -> None:
    """Static int8 of a ViT's residual adds costs most of its accuracy: each target tries
    the full int8 first and, outside (half) the budget on the calibration samples,
    quantizes only the linears and convolutions, then with activations quantized at run
    time, and says so in `method`."""
    pytest.importorskip("executorch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    result = export_file(
        tmp_path,
        "quant_vit.py",
        {
            "targets": ["onnx", "executorch"],
            "quantize": {"scheme": "int8"},
            "profile": {"enabled": False},
            "verify": {"roundtrip": False},
        },
    )
    report = result.report
    assert report.status == "succeeded", report.error
    assert report.quantization is not None
    from engine.quantization import onnx_runtime, pt2e

    fallbacks = {
        "executorch": (pt2e.LEFT_FLOAT, pt2e.DYNAMIC),
        "onnx": (onnx_runtime.ONLY_LINEAR, onnx_runtime.DYNAMIC),
    }
    for name, notes in fallbacks.items():
        entry = report.quantization.targets[name]
        assert entry.passed is True, name
        assert entry.cosine is not None and entry.cosine >= 0.99, name
        assert entry.method is not None and "missed the budget" in entry.method, name
        assert any(note in entry.method for note in notes), name
        assert entry.samples == 4, name  # static shapes: the example and 3 of other values
    assert report.quantization.calibration_samples == 4
    assert not [w for w in report.warnings if w.code == "quantization_inaccurate"]


def test_torchaos_schemes_make_no_float_copy_and_leave_the_model_as_it_was() -> None:
    """The quantized copy shares the float model's tensors; only the quantized linears get
    weights of their own (a real-size LLM never holds a second float copy)."""
    from engine.quantization.linears import quantize

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(64, 64), torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)
    ).eval()
    before = {name: (p.data_ptr(), p._version, p.clone()) for name, p in model.named_parameters()}
    ids = torch.randint(0, 64, (2, 5))
    program = quantize(model, (ids,), {}, scheme="8da4w", group_size=32)
    after = dict(model.named_parameters())
    for name, (pointer, version, value) in before.items():
        assert after[name].data_ptr() == pointer and after[name]._version == version
        assert torch.equal(after[name], value)
    shared = {p.data_ptr() for p in program.state_dict.values() if isinstance(p, torch.Tensor)}
    assert model[0].weight.data_ptr() in shared  # the embedding: the model's own tensor
    assert model[1].weight.data_ptr() not in shared  # the linear: quantized, its own
