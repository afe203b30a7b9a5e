"""Target `aoti`: `model.aoti.pt2`, an AOTInductor package (the program compiled to a
shared library), loaded back with `torch._inductor.aoti_load_package`.

The instruction set. Inductor compiles with `-march=native` and the widest vector ISA of
the machine by default, so a package built on an AVX-512 worker may crash (SIGILL) on a
CPU without AVX-512. torch 2.13's inductor config sets both: `cpp.march` (the `-march`
flag; None = native) and `cpp.simdlen` (the vector width of the generated kernels: 256
picks AVX2, 512 AVX-512, 0 none). They are passed per call (`inductor_configs`, a
scoped `config.patch`), never set globally. `cpp.vec_isa_ok` is set too: inductor then
trusts the CPU flags instead of dry-compiling a probe per ISA and loading each in a
fresh Python process, so the only programs run are the compiler's. Some ISAs are probed
whatever `cpp.vec_isa_ok` says (AVX-512 BF16, VNNI and AMX, on CPUs that report them):
their probe library is dlopen-ed in this process instead (`_probes_in_process`), since a
sandboxed job may run no Python process.

What runs and what is written (for a sandbox profile; seen with `strace -f -e
trace=execve`): `$CXX` or `g++` from PATH (`g++ --version`, then per source file g++ →
cc1plus → as, the weights' `.S` file g++ → cc1 -E → as, the link g++ → collect2 → ld),
no Python subprocess (the ISA probes are skipped, see `cpp.vec_isa_ok`); with
`precompile_headers=True` also `openssl sha512` and `g++ -v` once per header. Written:
files in `$TORCHINDUCTOR_CACHE_DIR` (default `$TMPDIR/torchinductor_<user>`), precompiled
headers in `$TMPDIR/torchinductor_<user>/precompiled_headers` (whatever the cache dir),
the compiler's temporary files in `$TMPDIR`, and `path`. Read: torch's headers and
libraries (`torch/include`, `torch/lib`, linked with -ltorch -ltorch_cpu -lgomp) and
Python's include dir. Loading extracts the package into
`$TMPDIR/aotinductor_XXXXXX` and dlopens the library from there (no `noexec` mount).
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from engine.targets.interface import Conversion, TargetJob
from engine.targets.registry import spec
from schemas import ExportOptions, VerifyOptions

if TYPE_CHECKING:
    from engine.generation import Encoder

__all__ = [
    "THREAD_SETTINGS",
    "Isa",
    "convert",
    "convert_encoder",
    "load",
    "loading",
    "notes",
    "prepare",
    "resolve_isa",
    "runtime",
    "tolerances",
]

THREAD_SETTINGS: tuple[str, ...] = ()
"""What `load(threads=...)` sets besides torch's own thread count: nothing. The kernels run
on OpenMP threads, as many as `torch.set_num_threads` asks (compiled with
`cpp.dynamic_threads`), the library's calls into ATen on torch's intra-op threads."""


def runtime() -> str:
    """The runtime `load` runs the package in, with its version."""
    return f"torch {torch.__version__} (torch._inductor.aoti_load_package)"


_X86 = ("x86_64", "AMD64")
_LEVELS = {
    # -march level → (simdlen, what the CPU needs, torch's check of this CPU for it)
    "x86-64": (0, "any x86-64 CPU", None),
    "x86-64-v2": (0, "SSE4.2 and POPCNT (2009 and later)", None),
    "x86-64-v3": (256, "AVX2 and FMA (Intel Haswell, AMD Zen and later)", "avx2"),
    "x86-64-v4": (512, "AVX-512 F/BW/CD/DQ/VL (Intel Skylake-SP, AMD Zen 4 and later)", "avx512"),
}
_PORTABLE = "x86-64-v3"


@dataclass(frozen=True)
class Isa:
    """The flags a package is compiled with."""

    requested: str
    march: str | None
    """The `-march` value; None = inductor's default (native)."""
    simdlen: int | None
    """Vector width of the kernels; None = the widest this CPU has."""
    runs_on: str
    """Which CPUs the package runs on, in words."""

    def inductor_configs(self) -> dict[str, Any]:
        """The inductor config entries for `aoti_compile_and_package`."""
        configs: dict[str, Any] = {"cpp.vec_isa_ok": True}
        if self.march is not None:
            configs["cpp.march"] = self.march
        if self.simdlen is not None:
            configs["cpp.simdlen"] = self.simdlen
        return configs

    def vec_isa(self) -> str:
        """The vector ISA inductor picks with these flags on this machine."""
        from torch._inductor import config
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        with config.patch(self.inductor_configs()), _probes_in_process():
            picked = str(pick_vec_isa())
        return "none" if picked == "INVALID_VEC_ISA" else picked


def prepare(job: TargetJob) -> Conversion:
    """The program saved as program.pt2 (the job's quantized one with option `quantize`),
    compiled for option `aoti.isa`."""
    source = job.quantizing.program("aoti") if job.quantizing is not None else job.program
    settings = {"isa": job.options.aoti.isa, **job.overrides}
    return Conversion(source, job.args, job.kwargs, settings)


def loading(settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """The package is loaded for the ISA it was compiled for."""
    return {"isa": settings["isa"]}


def tolerances(options: ExportOptions) -> VerifyOptions:
    """The job's verification options."""
    return options.verify


def convert_encoder(
    encoder: Encoder, path: Path, settings: dict[str, Any], facts: dict[str, Any]
) -> tuple[Any, list[Path]]:
    """`encoder.aoti.pt2` beside `path`: the encoder program's own package."""
    program = encoder.program
    assert program is not None, "the encoder program is made first"
    name = spec("aoti").encoder
    assert name is not None
    written = path.with_name(name)
    own: dict[str, Any] = {}
    isa = settings.get("isa", "portable")
    convert(program, (), dict(encoder.kwargs), written, facts=own, isa=isa)
    facts["encoder"] = {key: value for key, value in own.items() if key != "inputs"}
    return load(written, program, isa=isa), [written]


def resolve_isa(isa: str, *, machine: str | None = None) -> Isa:
    """The flags for the option `aoti.isa` on this machine.

    Raises:
        TargetError: an x86-64 level this machine cannot run (the package is run here
            for verification), or an x86-64 level on another architecture.
    """
    from engine.targets import TargetError

    machine = machine or platform.machine()
    if isa == "native":
        return Isa(isa, None, None, f"CPUs with every instruction set of this worker ({machine})")
    if machine not in _X86:
        if isa == "portable":
            return Isa(
                isa,
                None,
                None,
                f"CPUs like this worker's ({machine}): no portable level is "
                "defined for it, torch's default flags were used",
            )
        raise TargetError(
            f"aoti.isa {isa!r} is an x86-64 level; this worker is {machine}",
            hint='Use aoti.isa "portable" or "native".',
            details={"isa": isa, "machine": machine},
        )
    level = _PORTABLE if isa == "portable" else isa
    simdlen, runs_on, needs = _LEVELS[level]
    if needs is not None and not _cpu_has(needs):
        if isa == "portable":
            level = "x86-64-v2"
            simdlen, runs_on, _ = _LEVELS[level]
        else:
            raise TargetError(
                f"aoti.isa {isa!r} needs {needs.upper()}, which this worker's CPU lacks: "
                "the package could not be verified here",
                hint='Use aoti.isa "portable", or run the job on a worker with that CPU.',
                details={"isa": isa, "needs": needs},
            )
    return Isa(isa, level, simdlen, runs_on)


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    *,
    isa: str = "portable",
    precompile_headers: bool = False,
    facts: dict[str, Any] | None = None,
) -> Path:
    """Compile `program` into an AOTInductor package at `path`.

    Args:
        program: the exported program (decomposed or not).
        args, kwargs: its example inputs (unused: the program carries its own).
        path: the package to write.
        isa: `portable`, `native` or an x86-64 level (`resolve_isa`).
        precompile_headers: let inductor precompile its C++ headers: faster compiles
            only when `$TMPDIR` survives between jobs (a cold precompile costs more than
            it saves: ~30 s against ~20 s for a small MLP on 2 cores); runs `openssl` and
            writes under `$TMPDIR/torchinductor_<user>/precompiled_headers`.
        facts: filled with `isa`, `march`, `vec_isa`, `runs_on`.

    Returns:
        `path`.
    """
    import torch._inductor

    chosen = resolve_isa(isa)
    configs = {
        **chosen.inductor_configs(),
        "aot_inductor.precompile_headers": precompile_headers,
        "compile_threads": 1,  # no pool of compile worker processes
        # Kernels take as many OpenMP threads as the deployment asks for at run time
        # (torch.set_num_threads, OMP_NUM_THREADS), not the job's count at compile time,
        # which inductor otherwise writes into every `omp parallel` it emits.
        "cpp.dynamic_threads": True,
    }
    if facts is not None:
        facts.update(
            isa=isa,
            march=chosen.march or "native",
            vec_isa=chosen.vec_isa(),
            runs_on=chosen.runs_on,
            threads="dynamic",
        )
    with _probes_in_process():
        written = torch._inductor.aoti_compile_and_package(
            program, package_path=str(path), inductor_configs=configs
        )
    return Path(written)


def load(
    path: Path,
    program: torch.export.ExportedProgram,
    *,
    isa: str = "portable",
    threads: int | None = None,
) -> Any:
    """The package at `path`, loaded, as a runner of flat outputs.

    Loaded with the same ISA settings it was built with: loading compares the package's
    ISA with the one inductor would pick, which otherwise probes the compiler. `threads`
    is taken for the targets' common signature and changes nothing: the package runs on
    torch's thread count, which the caller sets (`THREAD_SETTINGS`).
    """
    del threads
    import torch._inductor
    from torch._inductor import config

    with config.patch(resolve_isa(isa).inductor_configs()), _probes_in_process():
        compiled = torch._inductor.aoti_load_package(str(path))

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        return pytree.tree_leaves(compiled(*args, **kwargs))

    return run


def notes(facts: dict[str, Any]) -> list[str]:
    """What a deployment should know."""
    vec = facts.get("vec_isa")
    kernels = "scalar (unvectorized)" if vec == "none" else vec
    return [
        f"compiled with -march={facts.get('march')} and {kernels} kernels "
        f"(aoti.isa {facts.get('isa')!r}): runs on {facts.get('runs_on')}.",
        f"load it with torch {torch.__version__.split('+')[0]} on "
        f"{platform.system().lower()} {platform.machine()} "
        "(torch._inductor.aoti_load_package); it holds a shared library built for that "
        "torch.",
        "The package does not check the declared dynamic ranges (min/max): inputs outside "
        "them run without an error, where program.pt2 refuses them.",
    ]


@contextlib.contextmanager
def _probes_in_process() -> Iterator[None]:
    """Inductor's ISA probes load their library here, not in a new Python process.

    `VecISA.check_build` compiles a few intrinsics with an ISA's flags, then (torch 2.13)
    `_probe_load` starts `python -c "cdll.LoadLibrary(...)"` to see that the library
    loads. For AVX-512 BF16, VNNI and AMX it does so even with `cpp.vec_isa_ok`, on CPUs
    whose flags report them; in the sandbox that exec is refused (PermissionError) and
    the whole conversion failed on such workers. The library only defines functions, so
    loading it here runs none of its code. Torch versions without `_probe_load` are left
    as they are."""
    from torch._inductor import cpu_vec_isa

    if not hasattr(cpu_vec_isa.VecISA, "_probe_load"):
        yield
        return

    def load_here(self: object, output_path: str) -> bool:
        try:
            ctypes.CDLL(output_path)
        except OSError:
            return False
        return True

    original = cpu_vec_isa.VecISA._probe_load
    cpu_vec_isa.VecISA._probe_load = load_here  # type: ignore[method-assign]
    try:
        yield
    finally:
        cpu_vec_isa.VecISA._probe_load = original  # type: ignore[method-assign]


def _cpu_has(feature: str) -> bool:
    checks = {"avx2": torch.cpu._is_avx2_supported, "avx512": torch.cpu._is_avx512_supported}
    return bool(checks[feature]())
