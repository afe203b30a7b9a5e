"""The toolchain broker's checks (worker/sandbox/toolchain.py): what a job may have run for
it, and every way of bending the fixed toolchain into running something of its choosing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.sandbox.toolchain import Refused, check

GXX = "/usr/bin/x86_64-linux-gnu-g++-12"
FLATC = "/site/executorch/data/bin/flatc"
ENTRY = {"g++": GXX, "flatc": FLATC}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "tmp" / "cache").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    return tmp_path


def _inductor_compile(root: Path) -> list[str]:
    """A compile line as torch 2.13's inductor writes it (cpp_builder)."""
    cache = root / "tmp" / "cache"
    return [
        "g++",
        str(cache / "k.kernel.cpp"),
        "-D",
        "TORCH_INDUCTOR_CPP_WRAPPER",
        "-D",
        "C10_USING_CUSTOM_GENERATED_MACROS",
        "-DNDEBUG",
        "-O3",
        "-fno-omit-frame-pointer",
        "-g1",
        "-ffp-contract=off",
        "-fexcess-precision=fast",
        "-march=x86-64-v3",
        "-fPIC",
        "-Wall",
        "-std=c++20",
        "-Wno-unused-variable",
        "-pedantic",
        "-fopenmp",
        "-I/usr/include/python3.11",
        "-I/site/torch/include",
        "-mavx2",
        "-mfma",
        "-c",
        "-o",
        str(cache / "k.kernel.o"),
    ]


def test_what_inductor_and_executorch_run_is_allowed(root: Path) -> None:
    cache = root / "tmp" / "cache"
    program, argv, cwd, merge = check(
        {"exec": _inductor_compile(root), "cwd": str(cache), "merge": True}, ENTRY, root
    )
    assert (program, argv[0], cwd, merge) == (GXX, GXX, str(cache), True)
    assert argv[1:] == _inductor_compile(root)[1:]
    link = ["g++", str(cache / "a.o"), str(cache / "b.o"), "-shared", "-fPIC", "-o"]
    link += [str(cache / "m.so"), "-ltorch", "-lgomp", "-L/site/torch/lib"]
    assert check({"exec": link}, ENTRY, root)[0] == GXX
    for probe in (["g++", "--version"], ["g++", "-dumpfullversion", "-dumpversion"]):
        assert check({"exec": probe}, ENTRY, root)[1][1:] == probe[1:]
    flatc = [FLATC, "--binary", "-o", str(cache), str(cache / "s.fbs"), str(cache / "s.json")]
    assert check({"exec": flatc}, ENTRY, root)[0] == FLATC
    assert check({"exec": ["g++", "--version"]}, ENTRY, root)[2] == str(root)  # default cwd


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/sh", "-c", "true"],
        ["sh", "-c", "true"],
        ["/lib64/ld-linux-x86-64.so.2", "/bin/sh"],
        ["ld-linux-x86-64.so.2", "/bin/sh"],
        ["cc1plus", "x.cpp"],
        ["/usr/bin/python3", "-c", "pass"],
        ["g++", "-wrapper", "/bin/sh,-c,true", "--version"],
        ["g++", "-fplugin=/x/evil.so", "--version"],
        ["g++", "-fplugin-arg-evil-x=1", "--version"],
        ["g++", "-B", "/x", "--version"],
        ["g++", "-B/x", "--version"],
        ["g++", "-specs=/x/specs", "--version"],
        ["g++", "@/x/flags.rsp"],
        ["g++", "-Wl,-plugin,/x/evil.so", "--version"],
        ["g++", "-Wa,--defsym,x=1", "--version"],
        ["g++", "-Xlinker", "-plugin", "--version"],
        ["g++", "-fuse-ld=gold", "--version"],
        ["g++", "-flto", "--version"],
        ["g++", "-fuse-linker-plugin", "--version"],
        ["g++", "-x", "python", "--version"],
        ["g++", "-c", "/etc/passwd", "-o", "{root}/tmp/x.o"],
        ["g++", "-c", "{root}/tmp/x.c", "-o", "/tmp/escaped.o"],
        ["g++", "-c", "{root}/tmp/../../x.c"],
        ["g++", "-c", "relative.c"],
        ["g++", "-I", "relative/include", "--version"],
        ["g++", "-o"],
        ["g++", "-print-prog-name=cc1plus"],
        [FLATC, "--conform", "{root}/tmp/x.fbs"],
        [FLATC, "-o", "/tmp", "{root}/tmp/x.fbs"],
        [],
    ],
)
def test_anything_else_is_refused(root: Path, argv: list[str]) -> None:
    request = {"exec": [arg.replace("{root}", str(root)) for arg in argv]}
    with pytest.raises(Refused):
        check(request, ENTRY, root)


def test_cwd_and_links_must_stay_in_the_job(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    with pytest.raises(Refused):
        check({"exec": ["g++", "--version"], "cwd": str(outside)}, ENTRY, root)
    os.symlink(outside, root / "tmp" / "link")  # a link the job made, pointing out
    with pytest.raises(Refused):
        check({"exec": ["g++", "-c", str(root / "tmp" / "link" / "x.c")]}, ENTRY, root)


def test_a_job_without_toolchain_targets_has_no_entry_points(root: Path) -> None:
    with pytest.raises(Refused):
        check({"exec": ["g++", "--version"]}, {}, root)
    with pytest.raises(Refused):  # one target's program is not another's
        check({"exec": ["g++", "--version"]}, {"flatc": FLATC}, root)


@pytest.mark.parametrize(
    "request_",
    [
        {"exec": "g++ --version"},
        {"exec": ["g++", 7]},
        {"exec": ["g++", ""]},
        {"exec": ["g++", "-DX=\x00"]},
        {"exec": ["g++", "-DX"] * 600},
        {"exec": ["g++", "-D" + "X" * 5000]},
    ],
)
def test_malformed_requests_are_refused(root: Path, request_: dict[str, object]) -> None:
    with pytest.raises(Refused):
        check(request_, ENTRY, root)
