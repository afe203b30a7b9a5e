"""Deployment targets (engine.targets): ONNX, AOTInductor and ExecuTorch artifacts made
from an exported program, run back in their own runtimes and verified against eager.

The converters are optional packages (the `targets` extra, and executorch installed
without its dependencies); a test that needs one is skipped, saying which, only when it
is not installed. AOTInductor needs a C++ compiler instead. AOTI compiles take ~20 s
each on 2 cores, so one small model is compiled by default and the rest are `slow`.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export import Dim

from engine import targets
from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from engine.targets import aoti, registry
from engine.targets import onnx as onnx_target
from engine.targets.registry import TARGET_ARTIFACTS
from schemas import ExportOptions, TargetResult
from tests.engine.model_files import MODELS, export_file

# --- what each test needs ----------------------------------------------------------------


def needs(name: str) -> None:
    """Skip unless target `name`'s converter and runtime are installed."""
    if name == "aoti":
        compiler = targets.missing("aoti")
        if compiler:
            pytest.skip(f"AOTInductor needs a C++ compiler: {', '.join(compiler)} not found")
        return
    for module in targets.spec(name).requires:
        pytest.importorskip(
            module,
            reason=f"target {name} needs {module}: pip install 'torchport[targets]'"
            + (" and executorch (docs/targets.md)" if name == "executorch" else ""),
        )


# --- models ------------------------------------------------------------------------------


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))


@torch.library.custom_op("torchport_test_targets::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    """An op no converter knows: a Python-only custom op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return twice(x) + 1


@dataclass
class Case:
    module: torch.nn.Module
    args: tuple[Any, ...]
    traced: torch.export.ExportedProgram
    program: torch.export.ExportedProgram


def export(module: torch.nn.Module, args: tuple[Any, ...], dynamic: Any = None) -> Case:
    module.eval()
    traced = torch.export.export(module, args, dynamic_shapes=dynamic)
    return Case(module, args, traced, traced.run_decompositions())


@pytest.fixture(scope="module")
def mlp() -> Case:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )  # fmt: skip
    return export(model, (torch.randn(2, 8),), ({0: Dim("batch", min=1, max=64)},))


@pytest.fixture(scope="module")
def conv() -> Case:
    torch.manual_seed(0)
    return export(ConvNet(), (torch.randn(2, 3, 16, 16),), ({0: Dim("batch", min=1, max=8)},))


@pytest.fixture(scope="module")
def encoder() -> Case:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return export(layer, (torch.randn(2, 10, 32),), ({1: Dim("seq", min=2, max=32)},))


def run(name: str, case: Case, out_dir: Path, **options: Any) -> TargetResult:
    return targets.run_target(
        name,
        targets.TargetJob(
            program=case.program,
            traced=case.traced,
            pristine=case.module,
            args=case.args,
            kwargs={},
            out_dir=out_dir,
            options=ExportOptions(**options),
        ),
    )


def assert_verified(result: TargetResult, out_dir: Path, name: str, *, atol: float) -> None:
    """Succeeded, the artifact is there, and every sample ran and matched eager."""
    assert result.status == "succeeded", result.error
    artifact = out_dir / TARGET_ARTIFACTS[name]
    assert result.artifact == artifact.name
    assert artifact.is_file()
    assert result.size == artifact.stat().st_size > 0
    assert result.duration_s is not None and result.duration_s > 0
    check = result.verification
    assert check is not None and check.enabled and check.passed
    ran = [sample for sample in check.samples if sample.status == "passed"]
    assert len(ran) == len(check.samples) >= 4  # example, min, max, a random one or more
    errors = [out.max_abs_error for sample in ran for out in sample.outputs]
    assert errors and all(error is not None and error <= atol for error in errors), errors
    assert result.error is None


def batch_sizes(result: TargetResult) -> set[int]:
    assert result.verification is not None
    return {int(sample.input_shapes["args[0]"][0]) for sample in result.verification.samples}


# --- ONNX --------------------------------------------------------------------------------


def test_onnx_mlp_keeps_its_dynamic_batch(mlp: Case, tmp_path: Path) -> None:
    needs("onnx")
    result = run("onnx", mlp, tmp_path)
    assert_verified(result, tmp_path, "onnx", atol=1e-5)
    assert {1, 64} <= batch_sizes(result)
    assert result.details["dynamic_dims"] == {"input": [0]}
    assert result.details["opset"] >= 18
    assert any("dynamic ranges" in note for note in result.notes)

    import onnx
    import onnxruntime

    model = onnx.load(str(tmp_path / "model.onnx"))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.HasField("dim_value")
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    x = torch.randn(37, 8)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(actual), mlp.module(x), atol=1e-5, rtol=1e-4)


def test_onnx_conv_net(conv: Case, tmp_path: Path) -> None:
    needs("onnx")
    assert_verified(run("onnx", conv, tmp_path), tmp_path, "onnx", atol=1e-5)


def test_onnx_without_verification_is_not_verified(mlp: Case, tmp_path: Path) -> None:
    needs("onnx")
    result = run("onnx", mlp, tmp_path, verify={"enabled": False})
    assert result.status == "succeeded"
    assert result.verification is not None and result.verification.enabled is False
    assert any("not verified" in note for note in result.notes)


class Gather(torch.nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x[index] * 2


def test_onnx_with_samples_eager_rejects_is_partially_verified(tmp_path: Path) -> None:
    needs("onnx")
    # Index 7 needs 8 rows: eager raises on the smaller sizes drawn, which are skipped.
    args = (torch.randn(8, 3), torch.tensor([0, 7, 3]))
    case = export(Gather(), args, ({0: Dim("rows", min=2, max=16)}, None))
    result = run("onnx", case, tmp_path)
    assert result.status == "succeeded", result.error
    check = result.verification
    assert check is not None and check.passed is True
    assert check.verdict == "partially_verified"
    labels = {s.label: s.status for s in check.samples}
    assert labels["min"] == "skipped" and labels["max"] == "passed"
    assert check.skipped == sum(status == "skipped" for status in labels.values())


def test_onnx_mlp_is_verified(mlp: Case, tmp_path: Path) -> None:
    needs("onnx")
    result = run("onnx", mlp, tmp_path)
    assert result.verification is not None
    assert (result.verification.verdict, result.verification.skipped) == ("verified", 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_reduced_precision_model_is_widened_to_float32_in_onnx(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    """ONNX Runtime's CPU provider has no bfloat16 (nor most float16) kernels: the model
    computes in float32 from its own weights, judged as a reduced-precision program."""
    needs("onnx")
    import onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 4)
    ).to(dtype)  # fmt: skip
    case = export(model, (torch.randn(2, 8, dtype=dtype),))
    result = run("onnx", case, tmp_path, targets=["onnx"])
    assert result.status == "succeeded", result.error
    assert result.details["widened_from"] == str(dtype).removeprefix("torch.")
    assert result.verification is not None and result.verification.verdict == "verified"
    written = onnx.load(tmp_path / "model.onnx")
    elem_types = {t.data_type for t in written.graph.initializer} | {
        v.type.tensor_type.elem_type for v in [*written.graph.input, *written.graph.output]
    }
    assert elem_types == {onnx.TensorProto.FLOAT}


def test_a_widened_artifact_worse_than_eager_is_not_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float32 reference judges a widened artifact as it judges a bfloat16 program:
    5% off on every output is far beyond eager's own bfloat16 error, so it fails."""
    needs("onnx")
    real_load = onnx_target.load

    def five_percent_off(path: Path, program: torch.export.ExportedProgram, **names: Any) -> Any:
        runner = real_load(path, program, **names)
        return lambda args, kwargs: [out * 1.05 for out in runner(args, kwargs)]

    monkeypatch.setattr(onnx_target, "load", five_percent_off)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    case = export(model.to(torch.bfloat16), (torch.randn(2, 8, dtype=torch.bfloat16),))
    result = run("onnx", case, tmp_path, targets=["onnx"])
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "target_failed"
    assert result.verification is not None and result.verification.passed is False
    check = result.verification.samples[0].outputs[0]
    assert check.dtype == "bfloat16" and check.passed is False
    assert check.precision is not None and check.precision.passed is False
    assert check.precision.exported_error > 2 * check.precision.eager_error


def test_an_op_onnx_cannot_translate_is_target_failed(tmp_path: Path) -> None:
    needs("onnx")
    case = export(WithCustomOp(), (torch.randn(4),))
    result = run("onnx", case, tmp_path)
    assert result.status == "failed"
    assert result.artifact is None and not (tmp_path / "model.onnx").exists()
    error = result.error
    assert error is not None
    assert error.code == "target_failed" and error.stage == "converting"
    assert error.details["target"] == "onnx"
    # The exporter's cause, not its generic preamble, and no terminal colour codes.
    assert "torchport_test_targets.twice" in error.message
    assert "No ONNX function" in error.message and "\x1b" not in error.message
    assert error.hint and "program.pt2 is unaffected" in error.hint


def test_an_artifact_that_differs_from_eager_is_target_failed(
    mlp: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs("onnx")
    real_load = onnx_target.load

    def off_by_one(path: Path, program: torch.export.ExportedProgram, **names: Any) -> Any:
        runner = real_load(path, program, **names)
        return lambda args, kwargs: [out + 1 for out in runner(args, kwargs)]

    monkeypatch.setattr(onnx_target, "load", off_by_one)
    result = run("onnx", mlp, tmp_path)
    assert result.status == "failed"
    assert result.verification is not None and result.verification.passed is False
    assert result.error is not None and result.error.code == "target_failed"
    assert "does not match eager PyTorch on sample 'example'" in result.error.message
    assert "max abs error 1.0" in result.error.message
    assert result.error.hint and "verify.atol" in result.error.hint
    assert not (tmp_path / "model.onnx").exists()


# --- missing packages and compilers (need nothing installed) ------------------------------


@pytest.mark.parametrize(
    ("name", "install"), [("onnx", "torchport[targets]"), ("executorch", "executorch==")]
)
def test_a_missing_package_is_target_failed_with_what_to_install(
    name: str, install: str, mlp: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = dataclasses.replace(registry.TARGETS[name], requires=("torchport_no_such_module",))
    monkeypatch.setitem(registry.TARGETS, name, row)
    result = run(name, mlp, tmp_path)
    assert result.status == "failed" and result.verification is None
    error = result.error
    assert error is not None and error.code == "target_failed"
    assert error.details == {"missing": ["torchport_no_such_module"], "target": name}
    assert "torchport_no_such_module" in error.message
    assert error.hint and install in error.hint and "torchport[targets]" in error.hint


def test_a_missing_compiler_fails_aoti(
    mlp: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "torchport-no-such-compiler")
    result = run("aoti", mlp, tmp_path)
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "target_failed"
    assert result.error.details["missing"] == ["torchport-no-such-compiler"]
    assert result.error.hint and "g++" in result.error.hint


# --- AOTInductor -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("isa", "machine", "cpu", "march", "simdlen"),
    [
        ("portable", "x86_64", {"avx2"}, "x86-64-v3", 256),
        ("portable", "x86_64", set(), "x86-64-v2", 0),  # a CPU without AVX2: one level down
        ("x86-64", "x86_64", {"avx2", "avx512"}, "x86-64", 0),
        ("x86-64-v4", "x86_64", {"avx2", "avx512"}, "x86-64-v4", 512),
        ("native", "x86_64", set(), None, None),
        ("portable", "aarch64", set(), None, None),
    ],
)
def test_resolve_isa(
    isa: str,
    machine: str,
    cpu: set[str],
    march: str | None,
    simdlen: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aoti, "_cpu_has", lambda feature: feature in cpu)
    chosen = aoti.resolve_isa(isa, machine=machine)
    assert (chosen.march, chosen.simdlen) == (march, simdlen)
    configs = chosen.inductor_configs()
    assert configs["cpp.vec_isa_ok"] is True
    assert configs.get("cpp.march") == march and configs.get("cpp.simdlen") == simdlen


@pytest.mark.parametrize(
    ("isa", "machine", "cpu", "needle"),
    [("x86-64-v4", "x86_64", {"avx2"}, "AVX512"), ("x86-64-v3", "aarch64", set(), "aarch64")],
)
def test_an_isa_this_worker_cannot_run_is_refused(
    isa: str, machine: str, cpu: set[str], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aoti, "_cpu_has", lambda feature: feature in cpu)
    with pytest.raises(targets.TargetError, match=needle) as raised:
        aoti.resolve_isa(isa, machine=machine)
    assert raised.value.hint and "portable" in raised.value.hint


def test_aoti_mlp_portable(mlp: Case, tmp_path: Path) -> None:
    needs("aoti")
    result = run("aoti", mlp, tmp_path)
    assert_verified(result, tmp_path, "aoti", atol=1e-5)
    assert {1, 64} <= batch_sizes(result)
    details = result.details
    assert details["isa"] == "portable"
    assert details["threads"] == "dynamic"  # kernels take the run-time thread count
    if aoti.platform.machine() in ("x86_64", "AMD64"):
        expected = "x86-64-v3" if torch.cpu._is_avx2_supported() else "x86-64-v2"
        assert details["march"] == expected
        assert details["vec_isa"] == ("avx2" if expected == "x86-64-v3" else "none")
    assert any(f"-march={details['march']}" in note for note in result.notes)


# --- ExecuTorch --------------------------------------------------------------------------


def test_executorch_mlp(mlp: Case, tmp_path: Path) -> None:
    needs("executorch")
    result = run("executorch", mlp, tmp_path)
    assert_verified(result, tmp_path, "executorch", atol=1e-5)
    assert {1, 64} <= batch_sizes(result)
    assert result.details["delegated"] >= 1  # XNNPACK took the linears
    assert result.details["executorch"]


def test_executorch_refuses_an_unbounded_dynamic_dim(tmp_path: Path) -> None:
    needs("executorch")
    case = export(torch.nn.Linear(8, 4), (torch.randn(2, 8),), ({0: Dim("batch")},))
    result = run("executorch", case, tmp_path)
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "target_failed"
    assert result.error.details["unbounded"] == ["input dim 0"]
    assert result.error.hint and "max" in result.error.hint
    assert not (tmp_path / "model.pte").exists()


def test_executorch_an_op_without_kernel_is_target_failed(tmp_path: Path) -> None:
    needs("executorch")
    case = export(WithCustomOp(), (torch.randn(4),))
    result = run("executorch", case, tmp_path)
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "target_failed"
    assert "torchport_test_targets" in result.error.message


@pytest.mark.parametrize("name", ["onnx", "executorch"])
def test_a_target_failure_names_the_op_and_the_users_line(name: str, tmp_path: Path) -> None:
    needs(name)
    fixture = MODELS / "target_unsupported_op.py"
    result = export_file(tmp_path, fixture.name, {"targets": [name], "targets_required": True})
    error = result.report.error
    assert error is not None and error.code == "target_failed"
    assert (error.details["target"], error.details["op"]) == (name, "aten._linalg_eigh.default")
    line = next(
        number
        for number, text in enumerate(fixture.read_text().splitlines(), start=1)
        if text.endswith("# LINE: eigh")
    )
    assert error.location is not None
    assert (error.location.file, error.location.line) == (fixture.name, line)
    assert error.hint is not None
    assert "`aten._linalg_eigh.default`" in error.hint and f"{fixture.name}:{line}" in error.hint
    target = result.report.targets[name].error
    assert target is not None and target.details["location"]["line"] == line


def test_converting_reports_each_targets_phases_as_its_fraction(tmp_path: Path) -> None:
    needs("onnx")
    seen: list[tuple[str, float | None]] = []
    request = ExportRequest(
        upload=Upload(model=MODELS / "trace_shared_batch.py"),
        options=ExportOptions(targets=["onnx"], verify={"samples": 0}),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    result = run_export(request, progress=lambda p: seen.append((p.stage, p.fraction)))
    assert result.report.targets["onnx"].status == "succeeded"
    fractions = [fraction for stage, fraction in seen if stage == "converting"]
    # the stage starts, the target starts, its artifact is written, loaded, the stage ends
    assert fractions == [0.0, 0.0, 0.7, 0.8, 1.0]


# --- heavier models (CI runs them) -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["onnx", "aoti", "executorch"])
def test_transformer_encoder_layer(name: str, encoder: Case, tmp_path: Path) -> None:
    needs(name)
    result = run(name, encoder, tmp_path)
    assert_verified(result, tmp_path, name, atol=1e-4)
    assert result.verification is not None
    seq = {int(sample.input_shapes["args[0]"][1]) for sample in result.verification.samples}
    assert {2, 32} <= seq


@pytest.mark.slow
@pytest.mark.parametrize("name", ["aoti", "executorch"])
def test_conv_net(name: str, conv: Case, tmp_path: Path) -> None:
    needs(name)
    assert_verified(run(name, conv, tmp_path), tmp_path, name, atol=1e-5)


def test_no_compiler_found_means_aoti_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    expected = [] if shutil.which("g++") else ["g++"]
    assert targets.missing("aoti") == expected


def test_target_options() -> None:
    from pydantic import ValidationError

    options = ExportOptions()
    assert options.targets == [] and options.targets_required is False
    assert options.aoti.isa == "portable"
    assert ExportOptions(targets=["executorch", "onnx"]).targets == ["executorch", "onnx"]
    with pytest.raises(ValidationError, match="more than once: onnx"):
        ExportOptions(targets=["onnx", "aoti", "onnx"])
    with pytest.raises(ValidationError):
        ExportOptions(targets=["tflite"])
    with pytest.raises(ValidationError):
        ExportOptions(aoti={"isa": "avx2"})
    assert ExportOptions().onnx.model_dump() == {
        "opset": None,
        "dtype": "float32",
        "external_data": "auto",
        "custom_ops": True,
    }
    for bad in (
        {"opset": 17},
        {"opset": 26},
        {"dtype": "bfloat16"},
        {"external_data": "yes"},
        {"custom_ops": "yes"},
    ):
        with pytest.raises(ValidationError):
            ExportOptions(onnx=bad)
    assert tuple(TARGET_ARTIFACTS) == targets.ORDER


@pytest.mark.skipif(shutil.which("g++") is None, reason="AOTInductor compiles C++")
def test_isa_probes_load_in_this_process_not_in_a_new_python(tmp_path: Path) -> None:
    # In the sandbox a job may exec only the compiler: inductor's AVX-512 BF16/VNNI/AMX
    # probes started `python -c` (whatever cpp.vec_isa_ok said) and failed the conversion.
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import json, sys
        spawned = []
        sys.addaudithook(lambda e, a: spawned.append(a[0]) if e == "subprocess.Popen" else None)
        from torch._inductor import cpu_vec_isa
        from engine.targets.aoti import _probes_in_process
        isa = cpu_vec_isa.VecAVX2()
        with _probes_in_process():
            loaded = isa.check_build(cpu_vec_isa.VecISA._avx_code)
        print(json.dumps([loaded, [str(p) for p in spawned if "python" in str(p)]]))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, spawned = json.loads(done.stdout)
    assert loaded is torch.cpu._is_avx2_supported()
    assert spawned == []
