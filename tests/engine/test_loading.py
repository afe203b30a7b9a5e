"""The LOAD stage: source placement, import, model resolution, inputs, weights, eager run."""

from __future__ import annotations

import inspect
import json
import stat
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from torch.export import Dim

import engine.load.loading
from engine.errors import (
    EagerRunFailed,
    ExportError,
    InvalidInputs,
    InvalidRequest,
    ModelImportFailed,
    ModelNotFound,
    WeightsMismatch,
)
from engine.load.loading import load, unpack_zip
from engine.load.model import LoadedModel, Upload
from schemas import ExportOptions
from schemas.outcomes import outcome

MODELS = Path(__file__).parents[1] / "models"
EXPORTDB = Path(torch.__file__).parent / "_export" / "db" / "examples"


def line_of(path: Path, marker: str) -> int:
    """The line number of the `# LINE: <marker>` comment in `path`."""
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# LINE: {marker}"):
            return number
    raise AssertionError(f"no marker {marker} in {path}")


def load_file(
    model: Path,
    tmp_path: Path,
    *,
    inputs: Path | None = None,
    weights: Path | None = None,
    **options: Any,
) -> LoadedModel:
    return load(
        Upload(model=model, inputs=inputs, weights=weights),
        ExportOptions(**options),
        tmp_path / "work",
    )


def load_fixture(name: str, tmp_path: Path, **kwargs: Any) -> LoadedModel:
    return load_file(MODELS / name, tmp_path, **kwargs)


def failure(error: type[ExportError], model: Path, tmp_path: Path, **kwargs: Any) -> ExportError:
    with pytest.raises(error) as info:
        load_file(model, tmp_path, **kwargs)
    assert info.value.stage == "loading"
    json.dumps(info.value.to_body().model_dump(mode="json"))  # details are plain JSON
    return info.value


def make_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


class Payload:
    """Unpickling this creates `marker`: proof that a pickle payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


# --- the model symbol ----------------------------------------------------------------


def test_instance(tmp_path: Path) -> None:
    loaded = load_fixture("load_instance.py", tmp_path)
    assert loaded.entry == "load_instance.py"
    assert loaded.device == "cpu"
    assert sys.modules[loaded.module_name].model is loaded.module
    assert type(loaded.module).__module__ == loaded.module_name
    assert loaded.source_map.root == tmp_path / "work" / "src"
    (x,) = loaded.args
    assert x.shape == (4, 3) and loaded.kwargs == {}
    with torch.no_grad():
        assert torch.equal(loaded.eager_outputs, loaded.module(x))
    assert set(loaded.eager_buffers) == {"offset"}
    assert torch.equal(loaded.eager_buffers["offset"], torch.ones(2))
    spec = loaded.module_dynamic_shapes
    assert set(spec) == {"x"} and isinstance(spec["x"][0], type(Dim("b")))
    assert spec["x"][0].__name__ == "batch"


def test_class_is_instantiated(tmp_path: Path) -> None:
    loaded = load_fixture("load_class.py", tmp_path)
    assert type(loaded.module).__name__ == "Masked"
    (x,) = loaded.args
    mask = loaded.kwargs["mask"]
    assert torch.equal(loaded.eager_outputs, torch.where(mask, x, torch.zeros_like(x)))
    assert loaded.module_dynamic_shapes is None


def test_function_is_wrapped_with_its_signature(tmp_path: Path) -> None:
    loaded = load_fixture("load_function.py", tmp_path)
    assert isinstance(loaded.module, torch.nn.Module)
    assert list(inspect.signature(loaded.module.forward).parameters) == ["x", "y", "scale"]
    x, y = loaded.args
    assert torch.equal(loaded.eager_outputs, x * 2.0 + y)


def test_wrapped_function_exports_strictly_with_named_dynamic_shapes(tmp_path: Path) -> None:
    loaded = load_fixture("load_function.py", tmp_path)
    rows = Dim("rows", min=2, max=32)
    program = torch.export.export(
        loaded.module,
        loaded.args,
        dynamic_shapes={"x": {0: rows}, "y": {0: rows}},
        strict=True,
    )
    assert list(program.graph_signature.user_inputs) == ["x", "y"]
    x = torch.randn(5, 3)
    assert torch.allclose(program.module()(x, x), x * 3.0)


def test_get_model_factory(tmp_path: Path) -> None:
    loaded = load_fixture("load_factory.py", tmp_path)
    assert type(loaded.module).__name__ == "Doubler"
    assert torch.equal(loaded.eager_outputs, torch.arange(6.0).reshape(2, 3) * 2)


def test_symbol_option(tmp_path: Path) -> None:
    minus = load_fixture("load_symbols.py", tmp_path / "a", symbol="minus")
    assert torch.equal(minus.eager_outputs, -torch.ones(3))
    helper = load_fixture("load_symbols.py", tmp_path / "b", symbol="helper")
    assert torch.equal(helper.eager_outputs, torch.zeros(3))


def test_symbol_missing_lists_candidates(tmp_path: Path) -> None:
    error = failure(ModelNotFound, MODELS / "load_symbols.py", tmp_path, symbol="absent")
    assert error.details["symbol"] == "absent"
    assert error.details["available"] == ["Minus", "Plus", "helper", "minus", "plus"]
    assert error.location is None


def test_no_model_and_no_factory(tmp_path: Path) -> None:
    error = failure(ModelNotFound, MODELS / "load_no_model.py", tmp_path)
    assert error.details == {"symbol": "model", "available": ["Encoder", "encoder"]}


def test_symbol_not_exportable(tmp_path: Path) -> None:
    error = failure(ModelNotFound, MODELS / "load_not_model.py", tmp_path)
    assert error.details["got"] == "int"
    assert error.details["available"] == ["Net", "net"]


def test_class_needing_arguments(tmp_path: Path) -> None:
    path = MODELS / "load_construct_fails.py"
    error = failure(ModelNotFound, path, tmp_path)
    assert error.details["exception"] == "TypeError"
    assert error.location is not None
    assert error.location.file == "load_construct_fails.py"
    assert error.location.line == line_of(path, "needs_args")


def test_class_whose_init_raises(tmp_path: Path) -> None:
    path = MODELS / "load_construct_fails.py"
    error = failure(ModelNotFound, path, tmp_path, symbol="Broken")
    assert error.details["exception"] == "RuntimeError"
    assert error.location is not None
    assert (error.location.file, error.location.line) == (
        "load_construct_fails.py",
        line_of(path, "broken"),
    )


@pytest.mark.parametrize(
    "example", sorted(p.name for p in EXPORTDB.glob("*.py") if p.name != "__init__.py")
)
def test_exportdb_examples_upload_as_they_are(tmp_path: Path, example: str) -> None:
    loaded = load_file(EXPORTDB / example, tmp_path)
    assert isinstance(loaded.module, torch.nn.Module)
    assert loaded.args or loaded.kwargs
    assert loaded.eager_outputs is not None


# --- import failures -----------------------------------------------------------------


def test_missing_package(tmp_path: Path) -> None:
    path = MODELS / "load_missing_package.py"
    error = failure(ModelImportFailed, path, tmp_path)
    assert error.details == {
        "exception": "ModuleNotFoundError",
        "missing_module": "torchport_no_such_package_for_tests",
    }
    assert error.location is not None
    assert (error.location.file, error.location.line) == (
        "load_missing_package.py",
        line_of(path, "missing"),
    )


def test_import_raises_in_user_helper(tmp_path: Path) -> None:
    path = MODELS / "load_import_raises.py"
    error = failure(ModelImportFailed, path, tmp_path)
    assert error.details == {"exception": "ValueError"}
    assert error.location is not None
    assert (error.location.file, error.location.line) == (
        "load_import_raises.py",
        line_of(path, "raise"),
    )
    assert error.location.code == 'raise ValueError("bad configuration")  # LINE: raise'
    assert (
        error.hint is not None and f"load_import_raises.py:{line_of(path, 'raise')}" in error.hint
    )


def test_syntax_error_location(tmp_path: Path) -> None:
    source = tmp_path / "broken.py"
    source.write_text("import torch\n\n\ndef forward(x:\n    return x\n")
    error = failure(ModelImportFailed, source, tmp_path)
    assert error.details == {"exception": "SyntaxError"}
    assert error.location is not None
    assert error.location.file == "broken.py"
    assert error.location.line in (4, 5)
    # the hint names the line; a missing package is no fix for a syntax error
    assert error.hint is not None and f"broken.py:{error.location.line}" in error.hint
    assert error.hint != outcome("model_import_failed").hint


def test_import_of_a_name_a_package_lacks_names_the_package(tmp_path: Path) -> None:
    source = tmp_path / "old_api.py"
    source.write_text("import torch\nfrom torch import no_such_name_for_tests\n")
    error = failure(ModelImportFailed, source, tmp_path)
    assert error.details == {"exception": "ImportError", "module": "torch"}
    assert error.location is not None
    assert (error.location.file, error.location.line) == ("old_api.py", 2)
    assert error.hint is not None and "`torch`" in error.hint and "old_api.py:2" in error.hint


def test_non_utf8_source(tmp_path: Path) -> None:
    source = tmp_path / "latin.py"
    source.write_bytes(b"import torch\nname = '\xe9t\xe9'\n")
    error = failure(ModelImportFailed, source, tmp_path)
    assert error.details["exception"] == "SyntaxError"
    assert error.location is not None
    assert (error.location.file, error.location.line) == ("latin.py", 2)


def test_failed_import_is_not_left_registered(tmp_path: Path) -> None:
    before = set(sys.modules)
    failure(ModelImportFailed, MODELS / "load_import_raises.py", tmp_path)
    assert not [name for name in set(sys.modules) - before if "load_import_raises" in name]


# --- eager reference run -------------------------------------------------------------


def test_eager_failure_points_at_user_line(tmp_path: Path) -> None:
    path = MODELS / "load_eager_fails.py"
    error = failure(EagerRunFailed, path, tmp_path)
    assert error.details == {"exception": "RuntimeError"}
    assert error.location is not None
    assert (error.location.file, error.location.line) == (
        "load_eager_fails.py",
        line_of(path, "matmul"),
    )


def test_eager_run_leaves_module_and_inputs_pristine(tmp_path: Path) -> None:
    loaded = load_fixture("load_buffer_mutation.py", tmp_path)
    assert torch.equal(loaded.module.count, torch.zeros(1))
    assert torch.equal(loaded.eager_buffers["count"], torch.ones(1))
    assert torch.equal(loaded.eager_outputs, torch.full((2,), 3.0))
    assert torch.equal(loaded.args[0], torch.ones(2))


def test_eager_run_without_deepcopy_restores_buffers(tmp_path: Path) -> None:
    loaded = load_fixture("load_buffer_mutation.py", tmp_path)

    class Uncopyable(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            raise TypeError("no copies")

    module = Uncopyable(loaded.module)
    outputs, buffers = engine.load.loading.run_eager(module, loaded.args, {}, loaded.source_map)
    assert torch.equal(outputs, torch.full((2,), 3.0))
    assert torch.equal(loaded.args[0], torch.ones(2))
    assert torch.equal(buffers["inner.count"], torch.ones(1))
    assert torch.equal(module.inner.count, torch.zeros(1))


# --- inputs --------------------------------------------------------------------------


def test_inputs_file_wins_over_example_args(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.pt"
    torch.save({"args": (torch.randn(7, 3),)}, inputs)
    loaded = load_fixture("load_instance.py", tmp_path, inputs=inputs)
    assert loaded.args[0].shape == (7, 3)
    assert loaded.eager_outputs.shape == (7, 2)


def test_json_inputs_for_a_model_without_example_args(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.json"
    inputs.write_text(
        '{"args": [{"shape": [5, 3]}], "kwargs": {"bias": {"shape": [2], "fill": "ones"}}}'
    )
    loaded = load_fixture("load_no_inputs.py", tmp_path, inputs=inputs)
    assert loaded.args[0].shape == (5, 3)
    assert torch.equal(loaded.kwargs["bias"], torch.ones(2))
    assert loaded.eager_outputs.shape == (5, 2)


def test_safetensors_inputs(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.safetensors"
    safetensors.torch.save_file({"args.0": torch.randn(2, 3)}, str(inputs))
    loaded = load_fixture("load_no_inputs.py", tmp_path, inputs=inputs)
    assert loaded.eager_outputs.shape == (2, 2)


def test_no_example_inputs_anywhere(tmp_path: Path) -> None:
    error = failure(InvalidInputs, MODELS / "load_no_inputs.py", tmp_path)
    assert error.details == {"source": "module", "missing": "example_args"}


def test_pickle_inputs_refused_in_load(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    inputs = tmp_path / "inputs.pt"
    torch.save({"args": (Payload(marker),)}, inputs)
    error = failure(InvalidInputs, MODELS / "load_no_inputs.py", tmp_path, inputs=inputs)
    assert error.details["pickle_refused"] is True
    assert not marker.exists()


# --- weights -------------------------------------------------------------------------


def fresh_state() -> dict[str, torch.Tensor]:
    return {
        "linear.weight": torch.full((2, 3), 0.5),
        "linear.bias": torch.full((2,), -1.0),
        "offset": torch.full((2,), 3.0),
    }


def test_weights_safetensors(tmp_path: Path) -> None:
    weights = tmp_path / "w.safetensors"
    safetensors.torch.save_file(fresh_state(), str(weights))
    loaded = load_fixture("load_instance.py", tmp_path, weights=weights)
    assert torch.equal(loaded.module.linear.weight, torch.full((2, 3), 0.5))
    (x,) = loaded.args
    expected = x.sum(dim=1, keepdim=True) * 0.5 - 1.0 + 3.0
    assert torch.allclose(loaded.eager_outputs, expected.expand(4, 2))


def test_weights_pt_state_dict(tmp_path: Path) -> None:
    weights = tmp_path / "w.pt"
    torch.save(fresh_state(), weights)
    loaded = load_fixture("load_instance.py", tmp_path, weights=weights)
    assert torch.equal(loaded.module.offset, torch.full((2,), 3.0))


def test_weights_mismatch_details(tmp_path: Path) -> None:
    state = fresh_state()
    del state["offset"]
    state["linear.weight"] = torch.zeros(4, 3)
    state["head.weight"] = torch.zeros(1)
    weights = tmp_path / "w.safetensors"
    safetensors.torch.save_file(state, str(weights))
    error = failure(WeightsMismatch, MODELS / "load_instance.py", tmp_path, weights=weights)
    assert error.details == {
        "missing": ["offset"],
        "unexpected": ["head.weight"],
        "shape_mismatch": [{"key": "linear.weight", "expected": [2, 3], "got": [4, 3]}],
    }


def test_weights_missing_keys_only(tmp_path: Path) -> None:
    weights = tmp_path / "w.pt"
    torch.save({"linear.weight": torch.zeros(2, 3)}, weights)
    error = failure(WeightsMismatch, MODELS / "load_instance.py", tmp_path, weights=weights)
    assert error.details == {
        "missing": ["linear.bias", "offset"],
        "unexpected": [],
        "shape_mismatch": [],
    }


def test_weights_pickle_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    weights = tmp_path / "w.pt"
    torch.save({"linear.weight": Payload(marker)}, weights)
    error = failure(InvalidInputs, MODELS / "load_instance.py", tmp_path, weights=weights)
    assert error.details["source"] == "weights"
    assert error.details["pickle_refused"] is True
    assert not marker.exists()


def test_weights_training_checkpoint(tmp_path: Path) -> None:
    weights = tmp_path / "ckpt.pt"
    torch.save({"state_dict": fresh_state(), "epoch": 3}, weights)
    loaded = load_fixture("load_instance.py", tmp_path, weights=weights)
    assert torch.equal(loaded.module.linear.bias, torch.full((2,), -1.0))


def test_weights_not_tensors(tmp_path: Path) -> None:
    weights = tmp_path / "w.pt"
    torch.save({**fresh_state(), "linear.bias": 3}, weights)
    error = failure(InvalidInputs, MODELS / "load_instance.py", tmp_path, weights=weights)
    assert error.details["not_tensors"] == ["linear.bias"]


def test_weights_unknown_format(tmp_path: Path) -> None:
    weights = tmp_path / "w.h5"
    weights.write_bytes(b"\x89HDF\r\n\x1a\n")
    error = failure(InvalidInputs, MODELS / "load_instance.py", tmp_path, weights=weights)
    assert error.details == {"source": "weights", "file": "w.h5"}


# --- device --------------------------------------------------------------------------


def test_cuda_without_gpu_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    error = failure(InvalidRequest, MODELS / "load_instance.py", tmp_path, device="cuda")
    assert error.details == {"device": "cuda"}
    assert error.hint


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_moves_module_and_inputs(tmp_path: Path) -> None:
    loaded = load_fixture("load_class.py", tmp_path, device="cuda")
    assert loaded.device == "cuda"
    assert loaded.args[0].is_cuda and loaded.kwargs["mask"].is_cuda
    assert loaded.eager_outputs.is_cuda


# --- zip uploads ---------------------------------------------------------------------

PACKAGE = {
    "pkg/__init__.py": "",
    "pkg/layers.py": (
        "import torch\n"
        "\n"
        "\n"
        "class Shift(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.shape[0] == 0:\n"
        "            raise ValueError('empty')\n"
        "        return x + 10\n"
    ),
    "pkg/consts.py": "FACTOR = 3\n",
    "pkg/net.py": (
        "import torch\n"
        "from . import layers\n"
        "from .consts import FACTOR\n"
        "import consts as sibling\n"
        "\n"
        "\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.shift = layers.Shift()\n"
        "\n"
        "    def forward(self, x):\n"
        "        return self.shift(x) * FACTOR * sibling.FACTOR\n"
        "\n"
        "\n"
        "model = Net()\n"
        "example_args = (torch.ones(2),)\n"
    ),
}


def test_zip_package_with_relative_imports(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "model.zip", PACKAGE)
    loaded = load_file(archive, tmp_path, entry="pkg/net.py")
    assert loaded.entry == "pkg/net.py"
    assert loaded.module_name == "pkg.net"
    assert sys.modules["pkg.net"].model is loaded.module
    assert torch.equal(loaded.eager_outputs, torch.full((2,), 99.0))


def test_zip_package_location_in_a_package_file(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "model.zip", PACKAGE)
    inputs = tmp_path / "inputs.json"
    inputs.write_text('{"args": [{"shape": [0]}]}')
    error = failure(EagerRunFailed, archive, tmp_path, entry="pkg/net.py", inputs=inputs)
    assert error.location is not None
    assert (error.location.file, error.location.line) == ("pkg/layers.py", 7)


def test_second_upload_with_the_same_package_name_gets_its_own_code(tmp_path: Path) -> None:
    first = make_zip(tmp_path / "first.zip", PACKAGE)
    assert float(load_file(first, tmp_path / "a", entry="pkg/net.py").eager_outputs[0]) == 99.0
    second = make_zip(tmp_path / "second.zip", {**PACKAGE, "pkg/consts.py": "FACTOR = 1\n"})
    loaded = load_file(second, tmp_path / "b", entry="pkg/net.py")
    assert torch.equal(loaded.eager_outputs, torch.full((2,), 11.0))


def test_zip_entry_defaults_to_model_py_with_sibling_imports(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.zip",
        {
            "helpers.py": "def double(x):\n    return 2 * x\n",
            "model.py": (
                "import torch\nfrom helpers import double\n\n"
                "def model(x):\n    return double(x)\n\nexample_args = (torch.ones(1),)\n"
            ),
        },
    )
    loaded = load_file(archive, tmp_path)
    assert loaded.entry == "model.py"
    assert torch.equal(loaded.eager_outputs, torch.full((1,), 2.0))


def test_zip_of_a_single_folder(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.zip",
        {
            "proj/net.py": (
                "import torch\nmodel = torch.nn.ReLU()\nexample_args = (-torch.ones(1),)\n"
            ),
            "proj/README.md": "hello",
        },
    )
    loaded = load_file(archive, tmp_path)
    assert loaded.entry == "proj/net.py"
    assert torch.equal(loaded.eager_outputs, torch.zeros(1))


def test_zip_without_a_clear_entry(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", {"a.py": "", "b.py": ""})
    error = failure(InvalidRequest, archive, tmp_path)
    assert error.details == {"entry": None, "candidates": ["a.py", "b.py"]}


def test_zip_entry_option_not_in_zip(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "m.zip", PACKAGE)
    error = failure(InvalidRequest, archive, tmp_path, entry="pkg/missing.py")
    assert error.details["entry"] == "pkg/missing.py"
    assert "pkg/net.py" in error.details["available"]


def test_zip_package_shadowing_a_loaded_module(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.zip", {"json/__init__.py": "", "json/net.py": "import torch\n"}
    )
    error = failure(ModelImportFailed, archive, tmp_path, entry="json/net.py")
    assert error.details == {"exception": "ImportError", "shadowed_module": "json"}


def test_zip_import_error_location(tmp_path: Path) -> None:
    archive = make_zip(
        tmp_path / "m.zip",
        {"pkg/__init__.py": "", "pkg/model.py": "import torch\n\nfrom . import nothing_here\n"},
    )
    error = failure(ModelImportFailed, archive, tmp_path, entry="pkg/model.py")
    assert error.details["exception"] == "ImportError"
    assert error.location is not None
    assert (error.location.file, error.location.line) == ("pkg/model.py", 3)


@pytest.mark.parametrize("name", ["../evil.py", "pkg/../../evil.py", "/tmp/evil.py", "C:/evil.py"])
def test_zip_entry_escaping_the_archive(tmp_path: Path, name: str) -> None:
    archive = make_zip(tmp_path / "m.zip", {"model.py": "", name: "x = 1\n"})
    error = failure(InvalidRequest, archive, tmp_path)
    assert error.details == {"reason": "outside_archive", "zip_entry": name}
    assert not (tmp_path / "evil.py").exists()
    assert not (tmp_path / "work" / "evil.py").exists()


def test_zip_symlink_refused(tmp_path: Path) -> None:
    archive = tmp_path / "m.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("model.py", "")
        link = zipfile.ZipInfo("secrets.py")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
    error = failure(InvalidRequest, archive, tmp_path)
    assert error.details == {"reason": "symlink", "zip_entry": "secrets.py"}
    assert not (tmp_path / "work" / "src" / "secrets.py").exists()


def test_zip_too_many_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.load.loading, "MAX_ZIP_FILES", 3)
    archive = make_zip(tmp_path / "m.zip", {f"m{i}.py": "" for i in range(4)})
    error = failure(InvalidRequest, archive, tmp_path)
    assert error.details == {"reason": "too_many_files", "files": 4, "max_files": 3}


def test_zip_bomb_refused_before_unpacking(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.py", b"\0" * (4 * 1024 * 1024))
    assert archive.stat().st_size < 64 * 1024
    with pytest.raises(InvalidRequest) as info:
        unpack_zip(archive, tmp_path / "out", max_bytes=1024 * 1024)
    assert info.value.details == {
        "reason": "too_large",
        "bytes": 4 * 1024 * 1024,
        "max_bytes": 1024 * 1024,
        "limit": "model",
    }
    assert not (tmp_path / "out" / "model.py").exists()


def test_zip_not_a_zip(tmp_path: Path) -> None:
    archive = tmp_path / "m.zip"
    archive.write_bytes(b"PK\x03\x04 truncated")
    error = failure(InvalidRequest, archive, tmp_path)
    assert error.details["reason"] == "bad_zip"
