"""The toolchain broker's templates (worker/sandbox/zygote/toolchain_commands.py): the commands a
job may have run for it are built from the broker's own templates; a job names its files
and picks knobs from fixed sets, and every way of bending the toolchain into loading or
running something of its choosing is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from worker.sandbox.confinement.converters import toolchain
from worker.sandbox.zygote.toolchain_commands import ISAS, Paths, Refused, build, describe

GXX = "/usr/bin/x86_64-linux-gnu-g++-12"
FLATC = "/site/executorch/data/bin/flatc"
INCLUDE = ("/usr/include/python3.11", "/site/torch/include", "/site/torch/include/api")
LIBDIRS = ("/usr/lib", "/site/torch/lib")
PATHS = Paths(GXX, FLATC, INCLUDE, LIBDIRS)
ROOT_TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    cache = tmp_path / "tmp" / "cache"
    cache.mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (cache / "k.kernel.cpp").write_text("int f() { return 1; }\n")
    (cache / "w.weights.S").write_text(".section .data\n")
    (cache / "x.fbs").write_text("table T {}\nroot_type T;\n")
    (cache / "x.json").write_text("{}\n")
    return tmp_path


def _object(root: Path, name: str = "k.kernel.o") -> Path:
    """A real ELF relocatable object in the job's cache."""
    path = root / "tmp" / "cache" / name
    source = root / "tmp" / "cache" / "obj.c"
    source.write_text("int g(void) { return 2; }\n")
    subprocess.run(["gcc", "-c", str(source), "-o", str(path)], check=True)
    return path


def _gcc(root: Path, kind: str, inputs: list[str], output: str, **knobs: object) -> dict:
    request = {"run": "gcc", "kind": kind, "inputs": inputs, "output": output}
    return {**request, "opt": "O3", "march": "x86-64-v3", "isa": "avx2", **knobs}


def test_a_compile_is_the_template_with_the_jobs_files(root: Path) -> None:
    cache = root / "tmp" / "cache"
    source, output = str(cache / "k.kernel.cpp"), str(cache / "k.kernel.o")
    program, argv, cwd, merge = build(_gcc(root, "object", [source], output), PATHS, root)
    assert (program, argv[0], argv[1], cwd, merge) == (GXX, GXX, source, str(cache), False)
    assert argv[-3:] == ["-c", "-o", output]
    assert argv[10:12] == ["-D", "CPU_CAPABILITY_AVX2"]
    assert [f"-I{path}" for path in INCLUDE] == [a for a in argv if a.startswith("-I")]
    assert "-march=x86-64-v3" in argv and "-O3" in argv
    assert argv[-6:-3] == list(ISAS["avx2"][1])
    # A link: objects in, the model library out, libtorch and the worker's lib dirs.
    obj = str(_object(root))
    link = _gcc(root, "shared", [obj], str(cache / "m.so"))
    argv = build(link, PATHS, root)[1]
    assert argv[1] == obj and "-shared" in argv
    assert argv[-5:] == ["-ltorch", "-ltorch_cpu", "-lgomp", "-L/usr/lib", "-L/site/torch/lib"]
    for kind in ("version", "verbose"):
        argv = build({"run": "gcc", "kind": kind}, PATHS, root)[1]
        assert argv == [GXX, "--version" if kind == "version" else "-v"]
    flatc = {"run": "flatc", "kind": "binary", "outdir": str(cache)}
    flatc |= {"schema": str(cache / "x.fbs"), "data": str(cache / "x.json")}
    argv = build(flatc, PATHS, root)[1]
    files = [str(cache / "x.fbs"), str(cache / "x.json")]
    assert argv == [FLATC, "--binary", "-o", str(cache), *files]


def _hostile(root: Path) -> list[dict[str, object]]:
    cache = root / "tmp" / "cache"
    source, output = str(cache / "k.kernel.cpp"), str(cache / "k.kernel.o")
    good = _gcc(root, "object", [source], output)
    script = cache / "script.o"
    script.write_text("INPUT(/etc/passwd)\n")  # a linker script named like an object
    os.symlink("/etc/passwd", cache / "linked.cpp")
    os.symlink(cache, root / "tmp" / "via")
    (cache / "fifo.cpp").unlink(missing_ok=True)
    os.mkfifo(cache / "fifo.cpp")
    os.symlink("/tmp/escaped.o", cache / "out-link.o")
    return [
        # The request of round 3's attack: an argv of the job's choosing.
        {"exec": ["g++", "-fcompare-debug=-B.", source, "-o", output]},
        {**good, "flags": ["-B."]},
        {**good, "isa": "avx2 -B."},
        {**good, "isa": "-fplugin=/x.so"},
        {**good, "march": "native -B."},
        {**good, "opt": "-B."},
        {**good, "opt": "O3", "cwd": "/"},
        {**good, "inputs": ["-B."]},
        {**good, "inputs": ["-fcompare-debug=-B."]},
        {**good, "inputs": ["@" + source]},
        {**good, "inputs": ["/etc/passwd"]},
        {**good, "inputs": [str(cache / "linked.cpp")]},
        {**good, "inputs": [str(root / "tmp" / "via" / "k.kernel.cpp")]},
        {**good, "inputs": [str(cache / ".." / "cache" / "k.kernel.cpp")]},
        {**good, "inputs": [str(cache / "fifo.cpp")]},
        {**good, "inputs": [str(cache / "missing.cpp")]},
        {**good, "inputs": [str(cache / "x.json")]},  # not a C++ or assembler source
        {**good, "inputs": ["relative.cpp"]},
        {**good, "inputs": [source, source]},  # one source per object
        {**good, "inputs": source},
        {**good, "output": "/tmp/escaped.o"},
        {**good, "output": str(cache / "k.kernel.so")},  # an object ends in .o
        {**good, "output": str(cache / "out-link.o")},
        {**good, "output": str(cache / "missing-dir" / "k.o")},
        {**good, "output": str(root)},
        _gcc(root, "shared", [str(script)], str(cache / "m.so")),
        _gcc(root, "shared", [source], str(cache / "m.so")),
        {"run": "gcc", "kind": "version", "inputs": [source]},
        {"run": "gcc", "kind": "preprocess", "inputs": [source], "output": output},
        {"run": "sh", "kind": "version"},
        {"run": "gcc", "kind": "version", "merge": "yes"},
        {"run": "flatc", "kind": "binary", "outdir": "/tmp", "schema": "x", "data": "y"},
        {"run": "flatc", "kind": "conform", "outdir": str(cache)},
        [],
        "g++ --version",
    ]


def test_anything_else_is_refused(root: Path) -> None:
    _object(root)
    for request in _hostile(root):
        with pytest.raises(Refused):
            build(request, PATHS, root)
            pytest.fail(f"built: {request}")


def test_a_job_without_toolchain_targets_has_no_programs(root: Path) -> None:
    with pytest.raises(Refused):
        build({"run": "gcc", "kind": "version"}, Paths(None, None, (), ()), root)
    with pytest.raises(Refused):  # one target's program is not another's
        build({"run": "gcc", "kind": "version"}, Paths(None, FLATC, (), ()), root)


def test_the_job_side_refuses_an_argv_that_is_not_a_template(root: Path) -> None:
    cache = root / "tmp" / "cache"
    source, output = str(cache / "k.kernel.cpp"), str(cache / "k.kernel.o")
    argv = build(_gcc(root, "object", [source], output), PATHS, root)[1]
    assert describe(["g++", *argv[1:]], PATHS) == _gcc(root, "object", [source], output)
    for bent in (
        ["g++", "-fcompare-debug=-B.", *argv[1:]],
        ["g++", *argv[1:], "-B."],
        ["g++", *[a.replace("-O3", "-O2") for a in argv[1:]]],
        ["sh", "-c", "true"],
        [],
    ):
        with pytest.raises(Refused):
            describe(bent, PATHS)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_every_command_of_an_aoti_compile_is_a_template(tmp_path: Path) -> None:
    """What torch's inductor runs for an AOTInductor package here (`aoti.isa` portable)
    is a template's command with the worker's directories, flag for flag."""
    script = tmp_path / "capture.py"
    script.write_text(_CAPTURE)
    found = toolchain(["aoti"])
    paths = Paths(None, None, tuple(found["include"]), tuple(found["libdirs"]))
    for isa in ("portable",):  # the others differ only by the knobs the unit tests cover
        log = tmp_path / f"{isa}.json"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"cache-{isa}")}
        subprocess.run(
            [sys.executable, str(script), isa, str(log), str(tmp_path / f"{isa}.pt2")],
            check=True,
            env=env,
            cwd=ROOT_TESTS.parent,
            timeout=240,
        )
        commands = json.loads(log.read_text())
        kinds = {describe(argv, paths)["kind"] for argv in commands}
        assert {"version", "object", "shared"} <= kinds


_CAPTURE = """
import json, subprocess, sys
from pathlib import Path
commands = []
original = subprocess.Popen.__init__
def record(self, args, *rest, **kwargs):
    commands.append([str(a) for a in args])
    return original(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = record
import torch
from engine.targets import aoti
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
program = torch.export.export(model, (torch.randn(3, 8),))
aoti.convert(program, (), {}, Path(sys.argv[3]), isa=sys.argv[1])
json.dump(commands, open(sys.argv[2], "w"))
"""
