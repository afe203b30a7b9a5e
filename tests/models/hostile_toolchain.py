"""Hostile upload for a job converting to `aoti`: it talks to the zygote's toolchain
broker directly (its request pipe), not through the conversion's `subprocess.run`, and
tries to make the toolchain load a library of its own.

Round 4's attack: the job compiles a shared library named `liblto_plugin.so` into its
scratch (a constructor that writes a marker and starts `/bin/sh` through the dynamic
loader, which stays behind), then asks for a compile with `-fcompare-debug=-B.` run in
that directory: gcc looks for its helpers and its linker plugin there, and `ld` loads the
job's library. Then the same through the broker's request fields: flags, search paths,
linker scripts named like objects, links and files outside. The broker builds every
command from its own templates, so none of it may load the library: the module raises
ESCAPED (the job fails) if the marker appears or any of it is run.
"""

import os
import tempfile

import torch
from worker.sandbox.zygote.relay import TOOLCHAIN
from worker.sandbox.child.requests import channel

scratch = tempfile.mkdtemp()
marker = os.path.join(scratch, "PWNED")
plugin_source = os.path.join(scratch, "plugin.cpp")
plugin = os.path.join(scratch, "liblto_plugin.so")
program = os.path.join(scratch, "a.cpp")
LOADER = next(
    p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)
)
with open(plugin_source, "w") as handle:
    handle.write(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "extern \"C\" int onload(void *) { return 0; }\n"
        "__attribute__((constructor)) static void pwn() {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ld", f); fclose(f); }}\n'
        "  if (fork() == 0) {\n"
        f'    execl("{LOADER}", "ld.so", "/bin/sh", "-c", "sleep 60", (char *)0);\n'
        "    _exit(0);\n  }\n}\n"
    )
with open(program, "w") as handle:
    handle.write("int main() { return 0; }\n")
script = os.path.join(scratch, "script.o")
with open(script, "w") as handle:
    handle.write(f"INPUT({plugin})\n")
os.symlink("/etc/passwd", os.path.join(scratch, "passwd.cpp"))
outcome = {}


def ask(request):
    """Send a toolchain request line as it is; 'run' when the broker ran something."""
    link = channel()
    link.send(request, prefix=TOOLCHAIN)
    reply = link.receive("toolchain") or {}
    return "refused" if reply.get("rc") is None else "run"


def gcc(kind, inputs, output, **knobs):
    request = {"run": "gcc", "kind": kind, "inputs": inputs, "output": output}
    return {**request, "opt": "O3", "march": "x86-64", "isa": "none", **knobs}


# The library, built through the broker (the old form, then the templates': a probe may be
# built, it is loaded only by the job itself).
outcome["build_plugin_exec"] = ask(
    {"exec": ["g++", "-shared", "-fPIC", plugin_source, "-o", plugin], "cwd": scratch}
)
if not os.path.exists(plugin):
    outcome["build_plugin"] = ask(gcc("probe", [plugin_source], plugin))
outcome["compare_debug"] = ask(
    {"exec": ["g++", "-fcompare-debug=-B.", program, "-o", program + ".out"], "cwd": scratch}
)
good = gcc("object", [program], program + ".o")
for name, request in {
    "flags": {**good, "flags": ["-fcompare-debug=-B."]},
    "isa": {**good, "isa": "none -B."},
    "march": {**good, "march": "native -fcompare-debug=-B."},
    "input_flag": {**good, "inputs": ["-fcompare-debug=-B."]},
    "input_link": {**good, "inputs": [os.path.join(scratch, "passwd.cpp")]},
    "script": gcc("shared", [script], os.path.join(scratch, "m.so")),
    "plugin_as_object": gcc("shared", [plugin], os.path.join(scratch, "m.so")),
    "output_outside": {**good, "output": "/tmp/escaped.o"},
}.items():
    outcome[name] = ask(request)
# The control: the templates' object compile of the job's own source, in that directory.
outcome["control_object"] = ask(good)

EXPECTED = {
    "build_plugin_exec": "refused",
    "build_plugin": "run",
    "compare_debug": "refused",
    **{
        name: "refused"
        for name in (
            "flags",
            "isa",
            "march",
            "input_flag",
            "input_link",
            "script",
            "plugin_as_object",
            "output_outside",
        )
    },
    "control_object": "run",
}
if outcome != EXPECTED or os.path.exists(marker):
    raise RuntimeError(f"ESCAPED or broken: {outcome}, marker: {os.path.exists(marker)}")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


model = Small()
example_args = (torch.randn(2, 8),)
