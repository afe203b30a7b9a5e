"""A big saved program's weights are mapped from the file by the round trip's loader,
not read into memory (engine.serialize.mapped), and run bit for bit as torch's own load."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.serialize import roundtrip
from engine.serialize.mapped import MAPPED_FROM_BYTES, run_releasing


def _anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def test_the_loader_maps_a_big_programs_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 2048))
    x = torch.randn(3, 4096)
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    size_mb = path.stat().st_size / 2**20
    assert path.stat().st_size > MAPPED_FROM_BYTES and size_mb > 90
    before = _anon_mb()
    loaded = roundtrip.load_saved(path)
    grown = _anon_mb() - before
    assert loaded.failure is None
    assert grown < size_mb / 4, f"the load took {grown:.0f} MB of a {size_mb:.0f} MB file"
    with torch.no_grad():
        assert torch.equal(loaded.module(x), torch.export.load(path).module()(x))


def _mapped_rss_mb(path: Path) -> float:
    """Resident MB of this process's mappings of `path`."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = line.endswith(str(path))
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return total / 1024


def test_the_loader_gives_back_each_weights_pages_after_its_last_use(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
    )
    x = torch.randn(3, 2048)
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    size_mb = path.stat().st_size / 2**20
    releasing = roundtrip.load_saved(path)
    assert releasing.mapping is not None
    with torch.no_grad():
        released = run_releasing(releasing.module, releasing.mapping, releasing.in_spec, (x,), {})
    assert _mapped_rss_mb(path) < size_mb / 10  # every weight given back after its use
    plain = roundtrip.load_saved(path)
    with torch.no_grad():
        expected = plain.module(x)
    assert _mapped_rss_mb(path) > size_mb * 0.9  # the plain run keeps them all
    assert torch.equal(released, expected)
    assert torch.equal(released, model(x))
