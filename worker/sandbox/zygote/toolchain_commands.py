"""The toolchain broker's command templates: every command line a target's compiler or
flatc runs for a job is built here, from a template of ours and the job's file names.

A job asks for a command by *kind* and names only its files; every flag comes from the
templates below. The knobs it may set are chosen from fixed sets: the optimization level
(`O1`, `O3`), the `-march` value (the x86-64 levels, `native`, and the aarch64 values
torch's inductor uses) and the vector ISA (the flag sets of torch 2.13's
`torch._inductor.cpu_vec_isa`, by name). No flag, spec, plugin, search path, wrapper,
response file or environment variable of the job's choosing reaches `g++`, `cc1plus`,
`as`, `collect2` or `ld`; include and library directories are the ones the worker
resolved (torch's and Python's).

Kinds (`{"run": "gcc", "kind": ...}`; the commands are torch 2.13's inductor's, flag for
flag, so the package it builds is the one inductor builds without the broker):

- `version`, `verbose`: `g++ --version`, `g++ -v`;
- `object`: one `.cpp` or `.S` source compiled to a `.o` (`-c`);
- `shared`: `.o` objects (each an ELF relocatable object) linked into a `.so` against
  libtorch (the model library);
- `probe`: one `.cpp` source compiled and linked into a `.so` against libtorch and
  libtorch_python (inductor's ISA probes, which the job loads into its own process).

flatc (`{"run": "flatc", "kind": ...}`): `binary` (`--binary -o DIR SCHEMA JSON`) and `json`
(`[--raw-binary] --json --defaults-json --strict-json -o DIR SCHEMA -- BIN`), executorch's
two commands.

Files: every input must be a regular file inside the job's directory, named without a
symbolic link anywhere in its path, with the suffix its kind takes (`.cpp`, `.S`, `.o`,
`.fbs`, `.json`, `.bin`); an object must be an ELF relocatable file. An output must lie in
an existing directory of the job's, with its kind's suffix, and not be a link or anything
but a regular file if it exists. The working directory is the output's directory.

`describe` is the job's side: it turns the argv torch's inductor or executorch gives
`subprocess.run` into such a request, and refuses (in the job) an argv that is not exactly
what the template would build, so a torch whose flags differ fails loudly instead of
being compiled with other flags.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ISAS", "MARCHES", "OPTS", "Paths", "Refused", "build", "describe"]


class Refused(ValueError):
    """A toolchain request the broker does not run (the reason is the message)."""


OPTS = ("O1", "O3")
MARCHES = (
    "native",
    "x86-64",
    "x86-64-v2",
    "x86-64-v3",
    "x86-64-v4",
    "armv8.6-a+sve+sve2+bf16",
    "armv8.6-a+sve+bf16",
)
_AVX512 = ("-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma")
_VNNI = (*_AVX512, "-mavx512vnni", "-mavx512vl")
_AMX = (*_VNNI, "-mamx-tile", "-mamx-bf16", "-mamx-int8")
_ARM256 = ("AT_BUILD_ARM_VEC256_WITH_SLEEF",)
ISAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name → (macros, flags), as torch 2.13's cpu_vec_isa classes build them
    "none": ((), ()),
    "avx2": (("CPU_CAPABILITY_AVX2",), ("-mavx2", "-mfma", "-mf16c")),
    "avx512": (("CPU_CAPABILITY_AVX512",), _AVX512),
    "avx512_bf16": (("CPU_CAPABILITY_AVX512",), (*_AVX512, "-mavx512bf16")),
    "avx512_vnni": (("CPU_CAPABILITY_AVX512",), _VNNI),
    "avx512_vnni_bf16": (("CPU_CAPABILITY_AVX512",), (*_VNNI, "-mavx512bf16")),
    "amx": (("CPU_CAPABILITY_AVX512",), _AMX),
    "amx_bf16": (("CPU_CAPABILITY_AVX512",), (*_AMX, "-mavx512bf16")),
    "amx_fp16": (("CPU_CAPABILITY_AVX512",), (*_AMX, "-mamx-fp16")),
    "amx_bf16_fp16": (("CPU_CAPABILITY_AVX512",), (*_AMX, "-mavx512bf16", "-mamx-fp16")),
    "neon": (("CPU_CAPABILITY_NEON", *_ARM256), ()),
    "sve256": (
        ("CPU_CAPABILITY_SVE", "CPU_CAPABILITY_SVE256", *_ARM256, "__ARM_FEATURE_BF16"),
        ("-march=armv8-a+sve+bf16", "-msve-vector-bits=256"),
    ),
}

_MACROS = (
    "TORCH_INDUCTOR_CPP_WRAPPER",
    "STANDALONE_TORCH_HEADER",
    "TORCH_INDUCTOR_PRECOMPILE_HEADERS",
    "C10_USING_CUSTOM_GENERATED_MACROS",
)
_CODEGEN = (
    "-DNDEBUG",
    "-fno-omit-frame-pointer",
    "-g1",
    "-fno-trapping-math",
    "-funsafe-math-optimizations",
    "-ffinite-math-only",
    "-fno-signed-zeros",
    "-fno-finite-math-only",
    "-fno-unsafe-math-optimizations",
    "-fmath-errno",
    "-ffp-contract=off",
    "-fexcess-precision=fast",
    "-fno-tree-loop-vectorize",
)
_LANGUAGE = ("-std=c++20", "-Wno-unused-variable", "-Wno-unknown-pragmas", "-pedantic", "-fopenmp")
_LIBRARIES = {
    "shared": ("torch", "torch_cpu", "gomp"),
    "probe": ("torch", "torch_cpu", "torch_python", "gomp"),
}
_GCC_KINDS = ("version", "verbose", "object", "shared", "probe")
_FLATC_KINDS = ("binary", "json")
_SOURCE_SUFFIXES = {"object": (".cpp", ".S"), "probe": (".cpp",), "shared": (".o",)}
_OUTPUT_SUFFIX = {"object": ".o", "shared": ".so", "probe": ".so"}
MAX_INPUTS = 256
MAX_PATH = 4096
_ELF_REL = b"\x7fELF"


@dataclass(frozen=True)
class Paths:
    """What the worker resolved for a job's targets (`converters.toolchain`)."""

    gxx: str | None
    flatc: str | None
    include: tuple[str, ...]
    """Python's and torch's include directories, in inductor's order."""
    libdirs: tuple[str, ...]
    """Python's library directory and torch's `lib`."""

    @classmethod
    def from_limits(cls, found: dict[str, Any]) -> Paths:
        """From the job's `limits["toolchain"]` (`converters.toolchain`)."""
        return cls(
            gxx=found.get("g++"),
            flatc=found.get("flatc"),
            include=tuple(str(p) for p in found.get("include") or ()),
            libdirs=tuple(str(p) for p in found.get("libdirs") or ()),
        )


def build(request: Any, paths: Paths, root: Path) -> tuple[str, list[str], str, bool]:
    """The program, argv, working directory and output merging for a job's request, or
    `Refused`. `root` is the job's directory, where every file must lie."""
    if not isinstance(request, dict):
        raise Refused("a request is a JSON object")
    run, kind = request.get("run"), request.get("kind")
    if run == "gcc" and paths.gxx is not None and kind in _GCC_KINDS:
        allowed = {"run", "kind", "merge", "inputs", "output", "opt", "march", "isa"}
    elif run == "flatc" and paths.flatc is not None and kind in _FLATC_KINDS:
        allowed = {"run", "kind", "merge", "schema", "data", "outdir", "raw_binary"}
    else:
        raise Refused(f"no {run!r} command of kind {kind!r} for this job's targets")
    if extra := set(request) - allowed:
        raise Refused(f"unknown fields {sorted(extra)[:5]}")
    merge = request.get("merge", False)
    if not isinstance(merge, bool):
        raise Refused("merge must be true or false")
    if run == "flatc":
        argv, cwd = _flatc(request, paths, root)
        return argv[0], argv, cwd, merge
    argv, cwd = _gcc(request, paths, root)
    return argv[0], argv, cwd, merge


def _gcc(request: dict[str, Any], paths: Paths, root: Path) -> tuple[list[str], str]:
    assert paths.gxx is not None
    kind = request["kind"]
    if kind in ("version", "verbose"):
        if set(request) - {"run", "kind", "merge"}:
            raise Refused(f"{kind} takes no files or flags")
        return [paths.gxx, "--version" if kind == "version" else "-v"], str(root)
    opt = _choice(request.get("opt"), OPTS, "opt")
    march = _choice(request.get("march"), MARCHES, "march")
    isa = _choice(request.get("isa"), tuple(ISAS), "isa")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not 0 < len(inputs) <= MAX_INPUTS:
        raise Refused(f"inputs must be a list of 1 to {MAX_INPUTS} files")
    if kind != "shared" and len(inputs) != 1:
        raise Refused(f"{kind} compiles exactly one source")
    files = [_input(name, root, _SOURCE_SUFFIXES[kind], elf=kind == "shared") for name in inputs]
    output = _output(request.get("output"), root, _OUTPUT_SUFFIX[kind])
    argv = gcc_argv(paths, kind, files, output, opt, march, isa)
    return argv, os.path.dirname(output)


def gcc_argv(
    paths: Paths, kind: str, inputs: list[str], output: str, opt: str, march: str, isa: str
) -> list[str]:
    """The compiler's argv for a checked request (torch 2.13's inductor's, flag for flag)."""
    assert paths.gxx is not None
    macros, isa_flags = ISAS[isa]
    argv = [paths.gxx, *inputs]
    for macro in (*_MACROS, *macros):
        argv += ["-D", macro]
    argv += [f"-{opt}", *_CODEGEN, f"-march={march}"]
    if kind in ("shared", "probe"):
        argv.append("-shared")
    argv.append("-fPIC")
    if kind != "probe":
        argv.append("-Wall")
    argv += [*_LANGUAGE, *(f"-I{path}" for path in paths.include), *isa_flags]
    if kind == "object":
        argv.append("-c")
    argv += ["-o", output]
    if kind in _LIBRARIES:
        argv += [f"-l{lib}" for lib in _LIBRARIES[kind]]
        argv += [f"-L{path}" for path in paths.libdirs]
    return argv


def _flatc(request: dict[str, Any], paths: Paths, root: Path) -> tuple[list[str], str]:
    assert paths.flatc is not None
    outdir = _directory(request.get("outdir"), root)
    schema = _input(request.get("schema"), root, (".fbs",))
    if request["kind"] == "binary":
        if "raw_binary" in request:
            raise Refused("raw_binary is for kind json")
        data = _input(request.get("data"), root, (".json",))
        return [paths.flatc, "--binary", "-o", outdir, schema, data], outdir
    raw = request.get("raw_binary", False)
    if not isinstance(raw, bool):
        raise Refused("raw_binary must be true or false")
    data = _input(request.get("data"), root, (".bin", ".pte"))
    argv = [paths.flatc, *(["--raw-binary"] if raw else [])]
    argv += ["--json", "--defaults-json", "--strict-json", "-o", outdir, schema, "--", data]
    return argv, outdir


def _choice(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise Refused(f"{what} must be one of {list(allowed)}")
    return value


def _plain_path(value: Any, root: Path, what: str) -> str:
    """`value` as an absolute path inside `root` with no link anywhere in it."""
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH:
        raise Refused(f"{what} must be an absolute path in the job's directory")
    if "\x00" in value or os.path.normpath(value) != value:
        raise Refused(f"{what} {value!r} is not a plain path")
    if not Path(value).is_relative_to(root) or value == str(root):
        raise Refused(f"{what} {value!r} is outside the job's directory")
    inside = os.path.relpath(value, root)
    if os.path.realpath(value) != os.path.join(os.path.realpath(root), inside):
        raise Refused(f"{what} {value!r} goes through a symbolic link")
    return value


def _input(value: Any, root: Path, suffixes: tuple[str, ...], *, elf: bool = False) -> str:
    path = _plain_path(value, root, "an input")
    if not path.endswith(suffixes):
        raise Refused(f"input {path!r} must end with one of {list(suffixes)}")
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise Refused(f"input {path!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"input {path!r} is not a regular file")
    if elf and not _relocatable_elf(path):
        raise Refused(f"input {path!r} is not an ELF relocatable object")
    return path


def _relocatable_elf(path: str) -> bool:
    """Whether `path` starts as an ELF relocatable object (e_type 1), so the linker reads
    it as an object, never as a linker script."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        header = os.read(fd, 18)
    finally:
        os.close(fd)
    if len(header) < 18 or header[:4] != _ELF_REL:
        return False
    return int.from_bytes(header[16:18], "little" if header[5] == 1 else "big") == 1


def _directory(value: Any, root: Path) -> str:
    path = _plain_path(value, root, "a directory")
    if not os.path.isdir(path):
        raise Refused(f"{path!r} is not a directory")
    return path


def _output(value: Any, root: Path, suffix: str) -> str:
    path = _plain_path(value, root, "the output")
    if not path.endswith(suffix):
        raise Refused(f"the output {path!r} must end with {suffix!r}")
    _directory(os.path.dirname(path), root)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise Refused(f"the output {path!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"the output {path!r} exists and is not a regular file")
    return path


# -- the job's side -------------------------------------------------------------------


def describe(argv: list[str], paths: Paths) -> dict[str, Any]:
    """The request for the argv a converter gave `subprocess.run`, when it is exactly a
    template's (else `Refused`). Runs in the job child: its answer is checked again by
    the broker, it only keeps a converter's flags from being silently replaced."""
    if not argv:
        raise Refused("an empty command")
    program, args = argv[0], argv[1:]
    name = os.path.basename(program)
    if name == "flatc" or program == paths.flatc:
        request = _describe_flatc(args)
        expected = _flatc_args(request)
    elif name in ("g++", "c++") or (paths.gxx is not None and program == paths.gxx):
        request = _describe_gcc(args)
        expected = _gcc_args(request, paths)
    else:
        raise Refused(f"{program!r} is not a program of this job's targets")
    if expected != args:
        raise Refused(
            f"the command differs from the broker's template: {_difference(args, expected)}"
        )
    return request


def _describe_gcc(args: list[str]) -> dict[str, Any]:
    if args in (["--version"], ["-v"]):
        return {"run": "gcc", "kind": "version" if args == ["--version"] else "verbose"}
    inputs = []
    for arg in args:
        if arg.startswith("-"):
            break
        inputs.append(arg)
    if "-c" in args:
        kind = "object"
    elif "-ltorch_python" in args:
        kind = "probe"
    else:
        kind = "shared"
    opt = next((a[1:] for a in args if a in ("-O1", "-O3")), "O3")
    march = next((a.removeprefix("-march=") for a in args if a.startswith("-march=")), "native")
    macros = tuple(args[i + 1] for i, a in enumerate(args[:-1]) if a == "-D")[len(_MACROS) :]
    isa = next(
        (name for name, (m, f) in ISAS.items() if m == macros and _ends_isa(args, f)), "none"
    )
    output = args[args.index("-o") + 1] if "-o" in args[:-1] else ""
    return {
        "run": "gcc",
        "kind": kind,
        "inputs": inputs,
        "output": output,
        "opt": opt,
        "march": march,
        "isa": isa,
    }


def _ends_isa(args: list[str], flags: tuple[str, ...]) -> bool:
    """Whether the ISA flags come right before `-c`/`-o` (where inductor puts them)."""
    if not flags:
        return True
    end = args.index("-o") if "-o" in args else len(args)
    if end and args[end - 1] == "-c":
        end -= 1
    return tuple(args[end - len(flags) : end]) == flags


def _gcc_args(request: dict[str, Any], paths: Paths) -> list[str]:
    if request["kind"] in ("version", "verbose"):
        return ["--version" if request["kind"] == "version" else "-v"]
    stand_in = Paths("g++", None, paths.include, paths.libdirs)
    return gcc_argv(
        stand_in,
        request["kind"],
        request["inputs"],
        request["output"],
        request["opt"],
        request["march"],
        request["isa"],
    )[1:]


def _describe_flatc(args: list[str]) -> dict[str, Any]:
    outdir = args[args.index("-o") + 1] if "-o" in args[:-1] else ""
    if args[:1] == ["--binary"]:
        files = args[3:]
        schema, data = [*files, "", ""][:2]
        return {"run": "flatc", "kind": "binary", "outdir": outdir, "schema": schema, "data": data}
    raw = args[:1] == ["--raw-binary"]
    schema = args[-3] if len(args) >= 3 else ""
    request = {"run": "flatc", "kind": "json", "outdir": outdir, "schema": schema}
    return {**request, "data": args[-1] if args else "", "raw_binary": raw}


def _flatc_args(request: dict[str, Any]) -> list[str]:
    if request["kind"] == "binary":
        return ["--binary", "-o", request["outdir"], request["schema"], request["data"]]
    raw = ["--raw-binary"] if request.get("raw_binary") else []
    fixed = ["--json", "--defaults-json", "--strict-json", "-o", request["outdir"]]
    return [*raw, *fixed, request["schema"], "--", request["data"]]


def _difference(given: list[str], expected: list[str]) -> str:
    for index, (a, b) in enumerate(zip(given, expected, strict=False)):
        if a != b:
            return f"argument {index + 1} is {a[:80]!r}, the template has {b[:80]!r}"
    return f"{len(given)} arguments, the template has {len(expected)}"
