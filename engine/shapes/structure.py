"""The structure of a dynamic-shapes spec against the example inputs, for both its forms.

A spec mirrors `forward`'s arguments: a dict by parameter name or a list by position,
and inside, lists and dicts mirror container inputs down to each tensor. What a spec
leaves out is static: an argument it does not name, trailing arguments of a list, a key
of a dict input it omits, a container given as null. torch wants every argument and key
spelled out (a dict spec that omits `use_cache` fails), so the walk fills them in.

The JSON form (`engine.shapes.grammar.to_torch`) and the torch form of a module's own
`dynamic_shapes` (`complete`) are walked by the same rules here, so the two accept, fill
and refuse the same specs, with the same `details.path` and `details.reason`. Only what
each form says at a tensor (JSON dims, or torch's `Dim`s) is read by a `Leaf` of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from engine.errors import InvalidRequest

__all__ = [
    "Leaf",
    "combined_inputs",
    "complete",
    "invalid",
    "is_declaration",
    "join_path",
    "static_spec",
    "walk_arguments",
]

Leaf = Callable[[Any, Any, str], Any]
"""What a form makes of the spec of one tensor or scalar input: `(spec, value, path)`."""

_DECLARATION_KEYS = frozenset({"name", "min", "max", "expr"})
_GRAMMAR_HINT = "See the dynamic-shapes grammar in the contract (docs/contract.md §3)."


def invalid(
    path: str, reason: str, message: str, *, hint: str | None = None, **extra: Any
) -> InvalidRequest:
    """The error of a spec that does not fit: `details = {"path", "reason", **extra}`."""
    return InvalidRequest(
        f"dynamic_shapes{'.' + path if path else ''}: {message}",
        stage="tracing",
        details={"path": path, "reason": reason, **extra},
        hint=hint or _GRAMMAR_HINT,
    )


def join_path(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def combined_inputs(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
    """forward's parameters bound to the example inputs, as torch.export binds them."""
    signature = inspect.signature(module.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise invalid("", "invalid_spec", f"example inputs do not fit forward: {exc}") from exc
    return signature, dict(bound.arguments)


def complete(
    spec: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A torch-form spec (a module's `dynamic_shapes`) with what it leaves out made static.

    Anything but a dict, list or tuple (e.g. a `ShapesCollection`) goes to torch as is.

    Raises:
        InvalidRequest: the spec does not mirror the inputs, as for the JSON form.
    """
    if not isinstance(spec, dict | list | tuple):
        return spec
    signature, combined = combined_inputs(module, args, kwargs)
    return walk_arguments(spec, signature, combined, _as_given, declarations=False)


def walk_arguments(
    spec: dict[Any, Any] | list[Any] | tuple[Any, ...],
    signature: inspect.Signature,
    combined: dict[str, Any],
    leaf: Leaf,
    *,
    declarations: bool,
) -> dict[str, Any] | list[Any]:
    """The whole spec checked against the bound inputs, every argument present.

    Args:
        spec: a dict by parameter name (a `**kwargs` parameter's keys by themselves or
            under its name) or a list by position.
        signature: `forward`'s signature.
        combined: the bound inputs (`combined_inputs`).
        leaf: what the form makes of a tensor's or scalar's spec.
        declarations: whether a dict of `name`/`min`/`max`/`expr` is a dim declaration
            (the JSON form), never the spec of a dict input.
    """
    walker = _Walker(leaf, declarations)
    if isinstance(spec, dict):
        return walker.top_level_dict(spec, signature, combined)
    values = list(combined.values())
    if len(spec) > len(values):
        raise invalid(
            str(len(values)), "too_many_arguments", f"{len(spec)} entries for {len(values)} inputs"
        )
    padded = list(spec) + [None] * (len(values) - len(spec))
    return [walker.walk(s, v, str(i)) for i, (s, v) in enumerate(zip(padded, values, strict=True))]


def static_spec(value: Any) -> Any:
    """The spec that keeps `value` static: None, in containers mirroring its own."""
    if isinstance(value, list | tuple) and not isinstance(value, torch.Size):
        return _rebuild(value, [static_spec(v) for v in value])
    if isinstance(value, dict):
        return {key: static_spec(v) for key, v in value.items()}
    return None


def _as_given(spec: Any, value: Any, path: str) -> Any:
    return spec  # torch checks its own dims (and custom pytree inputs) itself


def _rebuild(value: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    if isinstance(value, list):
        return items
    if hasattr(value, "_fields"):  # a namedtuple: torch matches the type
        return type(value)(*items)
    return tuple(items)


class _Walker:
    def __init__(self, leaf: Leaf, declarations: bool) -> None:
        self.leaf = leaf
        self.declarations = declarations

    def top_level_dict(
        self, spec: dict[Any, Any], signature: inspect.Signature, combined: dict[str, Any]
    ) -> dict[str, Any]:
        var_keyword = next(
            (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
        )
        structure: dict[str, Any] = {name: static_spec(value) for name, value in combined.items()}
        extra: dict[str, Any] = {}
        for name, arg_spec in spec.items():
            if name in combined and name != var_keyword:
                structure[name] = self.walk(arg_spec, combined[name], name)
            elif var_keyword is not None and name in combined.get(var_keyword, {}):
                # forward(self, x, **kw): the user names the keyword, not "kw"
                extra[name] = self.walk(arg_spec, combined[var_keyword][name], name)
            elif name == var_keyword:
                structure[name] = self.walk(arg_spec, combined[name], name)
            elif name in signature.parameters:
                raise invalid(name, "argument_not_given", f"no example input for {name!r}")
            else:
                raise invalid(
                    name,
                    "unknown_argument",
                    f"forward has no argument {name!r}",
                    arguments=list(combined),
                )
        if extra and var_keyword is not None:
            kw_spec = structure[var_keyword] or {}
            structure[var_keyword] = {
                key: extra.get(key, kw_spec.get(key)) for key in combined[var_keyword]
            }
        return structure

    def walk(self, spec: Any, value: Any, path: str) -> Any:
        """One input's spec against its example: containers mirrored, leaves to `leaf`."""
        if spec is None:
            return static_spec(value)
        if isinstance(value, torch.Tensor):
            return self.leaf(spec, value, path)
        if isinstance(value, list | tuple):
            return self._sequence(spec, value, path)
        if isinstance(value, dict):
            return self._mapping(spec, value, path)
        return self.leaf(spec, value, path)

    def _sequence(self, spec: Any, value: list[Any] | tuple[Any, ...], path: str) -> Any:
        if not isinstance(spec, list | tuple):
            raise invalid(
                path,
                "structure_mismatch",
                f"expected a list of {len(value)} entries mirroring the input",
            )
        if len(spec) < len(value):
            # which entries a shorter list means is not for us to guess: name the rest
            missing = [join_path(path, i) for i in range(len(spec), len(value))]
            named = ", ".join(f"`{m}`" for m in missing)
            raise invalid(
                path,
                "structure_mismatch",
                f"{len(spec)} entries for an input of {len(value)}: {named} missing",
                hint=f"Add {named} to the spec (null, or None in Python, keeps it static).",
                missing=missing,
            )
        if len(spec) > len(value):
            raise invalid(
                path,
                "structure_mismatch",
                f"{len(spec)} entries for an input of {len(value)}",
            )
        return _rebuild(
            value,
            [
                self.walk(s, v, join_path(path, i))
                for i, (s, v) in enumerate(zip(spec, value, strict=True))
            ],
        )

    def _mapping(self, spec: Any, value: dict[Any, Any], path: str) -> Any:
        if not isinstance(spec, dict) or (self.declarations and is_declaration(spec)):
            raise invalid(path, "structure_mismatch", "expected an object mirroring the input")
        for key in spec:
            if key not in value:
                raise invalid(join_path(path, key), "unknown_key", f"the input has no key {key!r}")
        return {key: self.walk(spec.get(key), v, join_path(path, key)) for key, v in value.items()}


def is_declaration(spec: Any) -> bool:
    """Whether a JSON value is a dim declaration (`{"name": …}`)."""
    return isinstance(spec, dict) and "name" in spec and set(spec) <= _DECLARATION_KEYS
