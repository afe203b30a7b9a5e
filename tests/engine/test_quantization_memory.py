"""What a torchao-quantized copy of a big model holds: no float32 embedding table, and no
float weight's pages once its linear is quantized (`engine.quantization.linears`,
`engine.load.pages`)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from engine.load import pages
from engine.quantization.linears import quantize

pytest.importorskip("torchao")


class _Model(torch.nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for layer in self.layers:
            hidden = torch.relu(layer(hidden))
        return self.norm(hidden)


def _resident_kb(path: Path) -> int:
    """The resident size of this process's mappings of `path`."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
            inside = len(fields) >= 6 and fields[-1] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_a_bfloat16_models_embedding_stays_bfloat16_and_gives_float32_rows() -> None:
    torch.manual_seed(0)
    model = _Model(vocab=512, width=64, layers=2).to(torch.bfloat16).eval()
    ids = torch.randint(0, 512, (1, 7))
    program = quantize(model, (ids,), {}, scheme="8da4w", group_size=32, float32=True)
    table = program.state_dict["embed.weight"]
    assert table.dtype == torch.bfloat16 and table.data_ptr() == model.embed.weight.data_ptr()
    widened = program.module()(ids)
    assert widened.dtype == torch.float32
    # the same as a model whose table was widened first
    reference = _Model(vocab=512, width=64, layers=2).eval()
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    expected = quantize(reference, (ids,), {}, scheme="8da4w", group_size=32).module()(ids)
    assert torch.equal(widened, expected)


def test_quantized_linears_give_back_their_float_weights_pages(tmp_path: Path) -> None:
    """Weights that are views of a file's private mapping (a checkpoint mapped from its
    zip) are not all resident after quantization: each linear's pages go back once it is
    quantized, and the model still computes the same afterwards."""
    torch.manual_seed(0)
    width, layers = 1024, 8
    model = _Model(vocab=64, width=width, layers=layers).eval()
    path = tmp_path / "weights.bin"
    weights = [layer.weight.detach() for layer in model.layers]
    path.write_bytes(b"".join(w.contiguous().numpy().tobytes() for w in weights))
    with path.open("rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    first = torch.frombuffer(mapping, dtype=torch.uint8, count=1)
    pages.register(pages.Mapping(mapping, base=first.data_ptr()))
    size = width * width * 4
    for index, layer in enumerate(model.layers):
        view = torch.frombuffer(
            mapping, dtype=torch.float32, count=width * width, offset=index * size
        )
        layer.weight = torch.nn.Parameter(view.view(width, width), requires_grad=False)
    ids = torch.randint(0, 64, (1, 5))
    before = model(ids)
    assert _resident_kb(path) * 1024 >= 0.9 * layers * size  # all read by the run
    quantize(model, (ids,), {}, scheme="8da4w", group_size=32)
    assert _resident_kb(path) * 1024 <= size  # at most about one layer's left
    assert torch.equal(model(ids), before)  # read again from the file, the same bytes


def test_release_leaves_a_tensor_of_its_own_memory_as_it_is() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    assert pages.release(tensor) is False
    assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.float32))


def test_a_target_that_runs_out_of_memory_says_so_and_what_it_asked_for() -> None:
    from engine.targets import failures

    with pytest.raises(RuntimeError) as raised:
        torch.empty(1 << 50, dtype=torch.uint8)  # the allocator's own failure
    body = failures.error("executorch", raised.value)
    assert body.code == "target_failed"
    assert body.details["reason"] == "out_of_memory"
    assert body.details["requested_bytes"] == 1 << 50
    assert body.details["target"] == "executorch"
    assert "memory_mb" in (body.hint or "")
    other = failures.error("executorch", RuntimeError("Missing out variants: {'aten::foo'}"))
    assert "reason" not in other.details


class _Refused(torch.nn.Module):
    """Linears XNNPACK takes, and an integer add it refuses (its partitioner's `why`
    then keeps the refused node)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(96, 160)
        self.second = torch.nn.Linear(160, 96)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.second(torch.relu(self.first(x))), (ids + 1).sum()


def test_a_converted_programs_weights_are_not_kept_alive_by_caches(tmp_path: Path) -> None:
    """ExecuTorch's `is_same_node` cache, FakeTensorMode's dispatch cache, torch's
    proxy-tensor map of the last trace, the XNNPACK partitioner's `why` (the last node
    it refused) and a ShapeEnv's own dispatch cache held the lowered programs, and every
    quantized weight with them, after the conversion."""
    import gc

    pytest.importorskip("executorch")
    from executorch.exir.backend.utils import WhyNoPartition
    from torch._subclasses.fake_tensor import FakeTensor

    from engine.targets import executorch

    torch.manual_seed(0)
    x, ids = torch.randn(2, 96), torch.arange(4)
    dims = ({0: torch.export.Dim("batch", max=8)}, {0: torch.export.Dim("length", max=16)})
    program = quantize(
        _Refused().eval(), (x, ids), {}, scheme="8da4w", group_size=32, dynamic_shapes=dims
    )
    executorch.convert(program, (x, ids), {}, tmp_path / "model.pte")
    del program
    gc.collect()
    objects = gc.get_objects()  # a dead weakref.proxy among them fails isinstance
    alive = [
        o
        for o in objects
        if issubclass(type(o), torch.Tensor)
        and not issubclass(type(o), FakeTensor)
        and o.dtype == torch.int8
        and o.shape in ((160, 96), (96, 160))  # this model's (other tests' may live on)
    ]
    assert alive == []
    refusers = [o for o in objects if issubclass(type(o), WhyNoPartition)]
    assert refusers and all(each.node is None for each in refusers)
