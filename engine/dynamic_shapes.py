"""Dynamic shapes: the contract's JSON grammar (docs/contract.md §3) to torch and back.

```
JSON                                          torch
"auto"                                        {arg: {i: Dim.AUTO for every tensor dim}}
{"x": {"0": {"name": "b", "min": 1}}}         {"x": {0: Dim("b", min=1)}}
{"y": {"0": "b"}} / "2*b+1" / "b-1"           the same Dim / 2*b + 1 / b - 1
"auto" | "dynamic" | "static" (a dim)         Dim.AUTO | Dim.DYNAMIC | Dim.STATIC
7                                             7 (static; must equal the example's size)
{"name": "h", "min": 1, "expr": "2*h"}        2*Dim("h", min=1), where h appears nowhere plain
```
Whether a list or dict is a per-dimension spec or mirrors a container argument is
decided against the example inputs: per-dimension where the example is a tensor.

Every mistake in a spec raises `InvalidRequest` with `details = {"path", "reason"}`;
`path` is dotted into the spec as the user wrote it (`"x.0"`, `"1.mask.2"`), `reason`
a stable token (see `REASONS`).

torch's constraint-violation errors end with "Suggested fixes:" lines
(`dimy = Dim('dimy', max=5)`, `dimx = dimy + 1`, `b = 4`); `suggested_fixes` extracts
them, `apply_fixes` applies them to a torch-form spec, `fix_to_json` renders one for
the report.

The code lives in three modules, re-exported here: `engine.shape_grammar` (JSON → torch),
`engine.shape_json` (torch → JSON, suggested fixes) and `engine.shape_examples` (widening
size-1 dims, proposing a spec from the example inputs).
"""

from __future__ import annotations

from engine.shape_examples import WIDENED_SIZE, Widened, suggest_spec, widen_size_one_dims
from engine.shape_grammar import REASONS, plain_json, to_torch
from engine.shape_json import apply_fixes, fix_to_json, suggested_fixes, to_json

__all__ = [
    "REASONS",
    "WIDENED_SIZE",
    "Widened",
    "apply_fixes",
    "fix_to_json",
    "plain_json",
    "suggest_spec",
    "suggested_fixes",
    "to_json",
    "to_torch",
    "widen_size_one_dims",
]
