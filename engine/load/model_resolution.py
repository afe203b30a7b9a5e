"""Resolving the model symbol of the imported entry module (LOAD stage, step 3).

`resolve_model` turns what the `symbol` option names (an `nn.Module` instance, a module
class, a function of tensors or a `get_model()` factory) into an `nn.Module`; a function
is wrapped by `wrap_function` so its arguments keep their names.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from engine.diagnostics.source_map import SourceMap
from engine.errors import ModelNotFound
from schemas import SourceLocation

__all__ = ["FunctionModule", "model_like_names", "resolve_model", "wrap_function"]

STAGE = "loading"

_MISSING = object()
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


def resolve_model(module: ModuleType, symbol: str, source_map: SourceMap) -> torch.nn.Module:
    """The `nn.Module` named by `symbol` in `module`.

    `symbol` may name an `nn.Module` instance, an `nn.Module` subclass (instantiated
    with no arguments), a function of tensors (wrapped by `wrap_function`) or a
    factory `get_model()`; when `symbol` is `model` and there is none, `get_model()`
    is used.

    Raises:
        ModelNotFound: the symbol is missing, not exportable, or its construction
            raised (details `symbol`, `available`, and `exception` or `got`).
    """
    obj: Any = getattr(module, symbol, _MISSING)
    factory = symbol == "get_model"
    if obj is _MISSING and symbol == "model" and callable(getattr(module, "get_model", None)):
        obj, factory = module.get_model, True
    if obj is _MISSING:
        raise ModelNotFound(
            f"The entry module defines no `{symbol}`"
            + (" and no `get_model()`." if symbol == "model" else "."),
            stage=STAGE,
            details={"symbol": symbol, "available": model_like_names(module)},
        )
    is_module_class = inspect.isclass(obj) and issubclass(obj, torch.nn.Module)
    if is_module_class or (factory and callable(obj) and not inspect.isclass(obj)):
        obj = _construct(obj, symbol, source_map, module)
    if isinstance(obj, torch.nn.Module):
        return obj
    if callable(obj) and not inspect.isclass(obj):
        return wrap_function(obj)
    raise ModelNotFound(
        f"`{symbol}` is a {type(obj).__name__}, not an nn.Module, a module class or a function.",
        stage=STAGE,
        location=_definition_location(obj, source_map),
        details={
            "symbol": symbol,
            "got": type(obj).__name__,
            "available": model_like_names(module),
        },
    )


def _construct(
    factory: Callable[[], Any], symbol: str, source_map: SourceMap, module: ModuleType
) -> Any:
    try:
        return factory()
    except Exception as exc:
        raise ModelNotFound(
            f"Constructing `{symbol}` with no arguments failed: {type(exc).__name__}: "
            f"{source_map.scrub(str(exc))}",
            hint="The model class must be constructible with no arguments, or define "
            "`get_model()` returning an instance.",
            stage=STAGE,
            location=source_map.from_exception(exc) or _definition_location(factory, source_map),
            details={
                "symbol": symbol,
                "exception": type(exc).__name__,
                "available": model_like_names(module),
            },
        ) from exc


def _definition_location(obj: Any, source_map: SourceMap) -> SourceLocation | None:
    try:
        filename = inspect.getsourcefile(obj)
        _, line = inspect.getsourcelines(obj)
    except (TypeError, OSError):
        return None
    return source_map.location(filename, max(line, 1)) if filename else None


def model_like_names(module: ModuleType) -> list[str]:
    """Public module-level names that could be a model: modules, module classes and
    functions defined in `module`."""
    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        defined_here = getattr(value, "__module__", None) == module.__name__
        if (
            isinstance(value, torch.nn.Module)
            or (inspect.isclass(value) and issubclass(value, torch.nn.Module) and defined_here)
            or (inspect.isfunction(value) and defined_here)
        ):
            found.append(name)
    return sorted(found)[:50]


class FunctionModule(torch.nn.Module):
    """An `nn.Module` whose forward calls a plain function of tensors.

    `wrap_function` makes a subclass per function whose `forward` carries the
    function's signature, so arguments keep their names (dynamic_shapes keyed by
    argument name, input names in the exported graph).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function."""
        return self.function(*args, **kwargs)


def wrap_function(function: Callable[..., Any]) -> torch.nn.Module:
    """Wrap a function of tensors in an `nn.Module` with the function's signature."""

    def forward(self: FunctionModule, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self_param, *signature.parameters.values()]
        )
    name = getattr(function, "__name__", "function")
    cls = type(
        name if _IDENTIFIER.match(name) else "function",
        (FunctionModule,),
        {"forward": forward, "__module__": getattr(function, "__module__", __name__)},
    )
    module: torch.nn.Module = cls(function)
    return module
