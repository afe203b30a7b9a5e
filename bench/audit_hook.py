"""What the job child's audit hook (`worker.sandbox.child.run._Attempts.hook`) costs.

    python bench/audit_hook.py

CPython calls every audit hook on every audit event, and torch raises one per `id()`
call. Prints the audit events of one transformer-block export (after the zygote's
warm-up; counted by a hook installed for that export only, in a child interpreter),
and the cost of one event without a hook, with the child's hook (C code: `dict.get` on a
table of tripwires) and with the Python method it replaced (`timeit` of `id(1)`, best
of 5, each mode in its own interpreter: hooks cannot be removed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COUNT = """
import collections, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import sandbox_overhead
from engine.pipeline import export as pipeline
from engine.serialize import roundtrip
from engine.load.model import Upload
from schemas import ExportOptions
from worker.sandbox.zygote import warmup

root = Path(tempfile.mkdtemp(prefix="torchport-audit-"))
model = root / "model.py"
model.write_text(sandbox_overhead.BLOCK)
pipeline.warm_up(root / "warm")
(root / "warm-full").mkdir()
warmup.warm_full_pipeline(root / "warm-full")
events = collections.Counter()
counting = [True]
sys.addaudithook(lambda event, args: counting[0] and events.update((event,)))
pipeline.run_export(
    pipeline.ExportRequest(
        upload=Upload(model=model), options=ExportOptions(),
        out_dir=root / "out", work_dir=root / "work",
    ),
    roundtrip_runner=roundtrip.run_in_process,
)
counting[0] = False
print(json.dumps(events.most_common()))
"""

TIME = """
import sys, timeit
from pathlib import Path
from worker.sandbox.child import run as child

class Before:  # the hook as the child had it before the tripwires: a Python method
    def hook(self, event, args):
        what = child._FORBIDDEN_EVENTS.get(event)
        if what is None:
            return

if sys.argv[1] == "hook":
    sys.addaudithook(child._Attempts([Path("/nonexistent")]).hook)
elif sys.argv[1] == "before":
    sys.addaudithook(Before().hook)
print(min(timeit.repeat("id(1)", number=200_000, repeat=5)) / 200_000)
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    events = json.loads(_python(COUNT, str(ROOT / "bench")))
    total = sum(count for _, count in events)
    print(f"audit events in one transformer-block export: {total}")
    for name, count in events[:5]:
        print(f"  {name}: {count}")
    per_event = {mode: float(_python(TIME, mode)) for mode in ("none", "hook", "before")}
    print(f"id(1) without a hook: {per_event['none'] * 1e9:.0f} ns")
    for mode, name in (("hook", "the child's hook (tripwires)"), ("before", "a Python hook")):
        cost = per_event[mode] - per_event["none"]
        print(
            f"id(1) with {name}: {per_event[mode] * 1e9:.0f} ns; "
            f"{cost * 1e9:.0f} ns per event, ~{cost * total * 1000:.0f} ms per export"
        )


if __name__ == "__main__":
    main()
