"""Portable programs: inputs and outputs a torch-only loader can rebuild.

A `.pt2` stores the pytree specs of its inputs and outputs by type name. A container
type that torch does not itself define (a user namedtuple, a dataclass, a Hugging
Face `ModelOutput`) traps the user either way (facts measured on torch 2.13):

- registered without a `serialized_type_name` (`register_dataclass`,
  `register_pytree_node` without the name, any namedtuple): `torch.export.export`
  works, `torch.export.save` raises NotImplementedError;
- registered with one: saving works, and `torch.export.load` fails in every process
  that has not imported the module registering the type (a deployment).

`make_portable` finds such types and, unless told to keep them, wraps the model in a
module whose inputs and outputs are plain tuples, lists, dicts and tensors holding the
same leaves in the same order: a dataclass or a dict-like container becomes a dict of
its fields, a namedtuple a tuple. The wrapper shares the model's parameter, buffer and
submodule registries instead of holding it as a submodule, so parameter FQNs and
`state_dict` keys stay exactly the model's own, and its `forward` carries the model's
signature, so a dynamic-shapes spec keyed by argument names still binds.

An object that is no pytree node at all but holds tensors in its attributes (a Hugging
Face `DynamicCache`: `layers[i].keys`, `layers[i].values`) cannot even be traced as an
output. It becomes a dict of its tensor-holding attributes (`{"layers": [{"keys": ...,
"values": ...}]}`); other attributes are dropped from outputs. As an input, the wrapper
rebuilds it from a shallow copy of the example object with those attributes replaced.
"""

from __future__ import annotations

import collections
import collections.abc
import copy
import dataclasses
import inspect
from typing import Any

import torch
import torch.utils._pytree as pytree

from schemas import PortabilityMapping, ReportWarning

__all__ = [
    "Portable",
    "PortableModule",
    "from_plain",
    "make_portable",
    "non_portable_types",
    "to_plain",
]

_PLAIN_NODES: frozenset[Any] = frozenset(
    {
        tuple,
        list,
        dict,
        collections.OrderedDict,
        collections.defaultdict,
        collections.deque,
    }
)


@dataclasses.dataclass
class Portable:
    """What to export: the module and inputs to trace, and how they map to the model's."""

    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    mapping: PortabilityMapping
    warnings: list[ReportWarning] = dataclasses.field(default_factory=list)

    def convert_dynamic_shapes(self, dynamic_shapes: Any) -> Any:
        """The model's dynamic-shapes spec, restated for the wrapper's plain inputs.

        Only containers of the model's own non-portable types change (a spec given as
        an instance of the input's dataclass becomes the dict of its fields); names,
        plain containers and dims pass through.
        """
        if not self.mapping.wrapped or dynamic_shapes is None:
            return dynamic_shapes
        return to_plain(dynamic_shapes)


def make_portable(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    example_outputs: Any,
    *,
    keep_types: bool,
) -> Portable:
    """Wrap `module` when its inputs or outputs use types a torch-only loader lacks.

    Args:
        module: the model as loaded.
        args, kwargs: its example inputs.
        example_outputs: what the model returned on them eagerly.
        keep_types: keep the model's own types (the user asked for them); the report
            then lists the modules a loader must import first.

    Returns:
        The module and inputs to export, the mapping for `signature.json`, and the
        warning for `report.json` (none when everything is portable).
    """
    input_types = non_portable_types((tuple(args), dict(kwargs)))
    output_types = non_portable_types(example_outputs)
    if not input_types and not output_types:
        return Portable(module, tuple(args), dict(kwargs), PortabilityMapping(wrapped=False))

    input_names = [_qualified_name(t) for t in input_types]
    output_names = [_qualified_name(t) for t in output_types]
    unserializable = [
        _qualified_name(t) for t in [*input_types, *output_types] if not _has_serialized_name(t)
    ]
    if keep_types:
        loader_imports = sorted({t.__module__ for t in [*input_types, *output_types]})
        mapping = PortabilityMapping(
            wrapped=False,
            original_input_types=input_names,
            original_output_types=output_names,
            loader_imports=loader_imports,
        )
        warning = ReportWarning(
            code="non_portable_types",
            message=(
                "The program's inputs or outputs use container types that torch alone "
                "cannot rebuild: torch.export.load works only after importing "
                + ", ".join(loader_imports)
                + "."
            ),
            details={
                "types": sorted({*input_names, *output_names}),
                "loader_imports": loader_imports,
                "without_serialized_name": sorted(set(unserializable)),
            },
        )
        return Portable(module, tuple(args), dict(kwargs), mapping, [warning])

    plain_args = to_plain(tuple(args))
    plain_kwargs = to_plain(dict(kwargs))
    in_spec = pytree.tree_structure((tuple(args), dict(kwargs)))
    # objects are leaves to pytree: rebuild from the example itself when inputs hold one
    template = (tuple(args), dict(kwargs)) if any(map(_is_object, input_types)) else None
    wrapper = _wrapper_class(module)(module, in_spec, template)
    leaf_paths = {
        **_leaf_paths((tuple(args), dict(kwargs)), (plain_args, plain_kwargs), inputs=True),
        **_leaf_paths(example_outputs, to_plain(example_outputs), inputs=False),
    }
    mapping = PortabilityMapping(
        wrapped=True,
        original_input_types=input_names,
        original_output_types=output_names,
        leaf_paths=leaf_paths,
    )
    warning = ReportWarning(
        code="outputs_made_portable",
        message=(
            "The model's inputs or outputs use container types that torch alone cannot "
            "rebuild; the program takes and returns plain tuples, lists and dicts with "
            "the same tensors instead (signature.json maps each path)."
        ),
        details={"types": sorted({*input_names, *output_names})},
    )
    objects = sorted(_qualified_name(t) for t in {*input_types, *output_types} if _is_object(t))
    if objects:
        warning.message += (
            " Objects that are not pytree nodes (" + ", ".join(objects) + ") became dicts of "
            "their tensor attributes."
        )
        warning.details["objects"] = objects
    return Portable(wrapper, plain_args, plain_kwargs, mapping, [warning])


def non_portable_types(tree: Any) -> list[type]:
    """The container types in `tree` a process that imported only torch cannot rebuild.

    In order of first appearance, each once.
    """
    found: dict[type, None] = {}
    _collect(tree, found)
    return list(found)


def non_portable_types_in_spec(spec: pytree.TreeSpec) -> list[Any]:
    """Like `non_portable_types`, read off a traced program's spec instead of values."""
    found: dict[Any, None] = {}
    stack = [spec]
    while stack:
        node = stack.pop()
        if node.is_leaf():
            continue
        if not _portable_node(node.type, node.context):
            found.setdefault(node.context if node.type is collections.namedtuple else node.type)
        stack.extend(node.children_specs)
    return list(found)


def to_plain(tree: Any) -> Any:
    """`tree` with every non-portable container replaced by a plain one, same leaves.

    A container whose children have names (dataclass fields, mapping keys) becomes a
    dict in flattening order; any other (a namedtuple) a tuple. Leaves are untouched.
    """
    node_type = pytree._get_node_type(tree)
    if node_type not in pytree.SUPPORTED_NODES:
        attributes = _object_children(tree)
        if attributes is None:
            return tree
        return {name: to_plain(child) for name, child in attributes}
    node = pytree.SUPPORTED_NODES[node_type]
    children, context = node.flatten_fn(tree)
    plain_children = [to_plain(child) for child in children]
    if _portable_node(node_type, context):
        return node.unflatten_fn(plain_children, context)
    names = _child_names(tree, node, children)
    if names is not None:
        return dict(zip(names, plain_children, strict=True))
    return tuple(plain_children)


class PortableModule(torch.nn.Module):
    """Takes plain inputs, calls the model with its own types, returns plain outputs.

    Shares the model's registries rather than holding it as a submodule, so every
    parameter and buffer keeps its FQN; the model itself is called (hooks included).
    """

    def __init__(
        self, original: torch.nn.Module, in_spec: pytree.TreeSpec, template: Any = None
    ) -> None:
        super().__init__()
        # Shared, not copied: the wrapper's state_dict is the model's, key for key, and
        # export's parameter swapping reaches the model through the same dicts.
        self.__dict__["_parameters"] = original._parameters
        self.__dict__["_buffers"] = original._buffers
        self.__dict__["_modules"] = original._modules
        self.__dict__["_non_persistent_buffers_set"] = original._non_persistent_buffers_set
        self.__dict__["_torchport_original"] = original
        self.__dict__["_torchport_in_spec"] = in_spec
        self.__dict__["_torchport_template"] = template
        self.training = original.training

    @property
    def original(self) -> torch.nn.Module:
        """The model this wrapper calls."""
        module: torch.nn.Module = self.__dict__["_torchport_original"]
        return module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Rebuild the model's input types, call it, flatten its output types."""
        template = self.__dict__["_torchport_template"]
        if template is not None:
            original_args, original_kwargs = from_plain(template, (args, kwargs))
        else:
            leaves = pytree.tree_leaves((args, kwargs))
            original_args, original_kwargs = pytree.tree_unflatten(
                leaves, self.__dict__["_torchport_in_spec"]
            )
        outputs = self.__dict__["_torchport_original"](*original_args, **original_kwargs)
        return to_plain(outputs)

    def train(self, mode: bool = True) -> PortableModule:
        """Set the mode on the model too: its own `training` flag is not a child's."""
        self.__dict__["_torchport_original"].train(mode)
        self.training = mode
        return self


def _wrapper_class(module: torch.nn.Module) -> type[PortableModule]:
    """A PortableModule subclass whose forward shows the model's own signature."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return PortableModule

    def forward(self: PortableModule, *args: Any, **kwargs: Any) -> Any:
        return PortableModule.forward(self, *args, **kwargs)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_param, *signature.parameters.values()]
    )
    forward.__doc__ = PortableModule.forward.__doc__
    name = f"Portable{type(module).__name__}"
    return type(name, (PortableModule,), {"forward": forward, "__module__": __name__})


def from_plain(template: Any, plain: Any) -> Any:
    """The inverse of `to_plain`: `plain`'s leaves in `template`'s containers and objects.

    An object is a shallow copy of the template's with its tensor-holding attributes
    replaced (a cache the model updates in place never touches the template).
    """
    attributes = _object_children(template)
    if attributes is not None:
        rebuilt = copy.copy(template)
        for name, child in attributes:
            setattr(rebuilt, name, from_plain(child, plain[name]))
        return rebuilt
    node_type = pytree._get_node_type(template)
    node = pytree.SUPPORTED_NODES.get(node_type)
    if node is None:
        return plain
    children, context = node.flatten_fn(template)
    if _portable_node(node_type, context):
        plain_children, _ = pytree.SUPPORTED_NODES[pytree._get_node_type(plain)].flatten_fn(plain)
    else:
        plain_children = list(plain.values()) if isinstance(plain, dict) else list(plain)
    return node.unflatten_fn(
        [from_plain(t, p) for t, p in zip(children, plain_children, strict=True)], context
    )


_MAX_OBJECT_DEPTH = 8


def _object_children(value: Any, depth: int = 0) -> list[tuple[str, Any]] | None:
    """The tensor-holding attributes of an object pytree does not know, in `vars` order.

    None for anything else: tensors, pytree nodes, modules, classes, functions, objects
    of torch's own or without a `__dict__`, and objects holding no tensor.
    """
    if (
        depth > _MAX_OBJECT_DEPTH
        or isinstance(value, torch.Tensor | torch.nn.Module | type)
        or pytree._get_node_type(value) in pytree.SUPPORTED_NODES
        or callable(value)
        or _defined_by_torch(type(value))
        or not hasattr(value, "__dict__")
    ):
        return None
    held = [
        (name, child)
        for name, child in vars(value).items()
        if isinstance(name, str) and _holds_tensors(child, depth + 1)
    ]
    return held or None


def _holds_tensors(value: Any, depth: int) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth > _MAX_OBJECT_DEPTH:
        return False
    node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(value))
    if node is not None:
        return any(_holds_tensors(child, depth + 1) for child in node.flatten_fn(value)[0])
    return _object_children(value, depth) is not None


def _is_object(cls: Any) -> bool:
    """Whether a type found by `non_portable_types` is an object rather than a node."""
    return isinstance(cls, type) and cls not in pytree.SUPPORTED_NODES


def _collect(tree: Any, found: dict[type, None]) -> None:
    node_type = pytree._get_node_type(tree)
    if node_type not in pytree.SUPPORTED_NODES:
        attributes = _object_children(tree)
        if attributes is not None:
            found.setdefault(type(tree), None)
            for _, child in attributes:
                _collect(child, found)
        return
    children, context = pytree.SUPPORTED_NODES[node_type].flatten_fn(tree)
    if not _portable_node(node_type, context):
        found.setdefault(type(tree), None)
    for child in children:
        _collect(child, found)


def _portable_node(node_type: Any, context: Any) -> bool:
    """Whether a fresh process that imported only torch deserializes this node."""
    if node_type in _PLAIN_NODES:
        return True
    if node_type is collections.namedtuple:
        # The spec's type is the namedtuple factory; the class is the context.
        return _defined_by_torch(context) and _has_serialized_name(context)
    return _defined_by_torch(node_type) and _has_serialized_name(node_type)


def _has_serialized_name(cls: Any) -> bool:
    node_def = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
    return (
        node_def is not None
        and node_def.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND
    )


def _defined_by_torch(cls: Any) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return module == "torch" or module.startswith("torch.")


def _child_names(tree: Any, node: Any, children: list[Any]) -> list[str] | None:
    """Names of the children when every one has a distinct string name, else None.

    From the node's keyed flattening when registered; otherwise by finding each child
    among the mapping's values or the dataclass's fields (a Hugging Face ModelOutput is
    both, registered without keys).
    """
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        return None  # namedtuples become tuples, as they are tuples to every caller
    names: list[str] | None = None
    if node.flatten_with_keys_fn is not None:
        keyed, _ = node.flatten_with_keys_fn(tree)
        names = [_key_name(key) for key, _child in keyed]  # type: ignore[misc]
    elif isinstance(tree, collections.abc.Mapping):
        names = _match(children, [(k, v) for k, v in tree.items() if isinstance(k, str)])
    elif dataclasses.is_dataclass(tree):
        fields = [(f.name, getattr(tree, f.name, None)) for f in dataclasses.fields(tree)]
        names = _match(children, fields)
    if names is None or None in names or len(set(names)) != len(names):
        return None
    return names


def _key_name(key: Any) -> str | None:
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    if isinstance(key, pytree.MappingKey) and isinstance(key.key, str):
        return key.key
    return None


def _match(children: list[Any], named: list[tuple[str, Any]]) -> list[str] | None:
    """Each child's name, found by identity in order among `named`."""
    names = []
    position = 0
    for child in children:
        while position < len(named) and named[position][1] is not child:
            position += 1
        if position == len(named):
            return None
        names.append(named[position][0])
        position += 1
    return names


def _leaf_paths(original: Any, plain: Any, *, inputs: bool) -> dict[str, str]:
    original_paths = [path for path, _ in _named_paths(original, ())]
    plain_paths = [path for path, _ in _named_paths(plain, ())]
    return {
        _render(plain_path, inputs): _render(original_path, inputs)
        for plain_path, original_path in zip(plain_paths, original_paths, strict=True)
    }


def _named_paths(tree: Any, prefix: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    """Like `tree_flatten_with_path`, with names found for nodes registered without keys."""
    node_type = pytree._get_node_type(tree)
    node = pytree.SUPPORTED_NODES.get(node_type)
    if node is None:
        attributes = _object_children(tree)
        if attributes is None:
            return [(prefix, tree)]
        leaves = []
        for name, child in attributes:
            leaves.extend(_named_paths(child, (*prefix, pytree.GetAttrKey(name))))
        return leaves
    children, _ = node.flatten_fn(tree)
    keys: list[Any]
    # A namedtuple (or a torch.return_types structseq, keyed by index in torch) by the
    # names of its fields.
    fields = getattr(type(tree), "_fields", None) or getattr(type(tree), "__match_args__", None)
    if isinstance(tree, tuple) and fields is not None and len(fields) == len(children):
        keys = [pytree.GetAttrKey(name) for name in fields]
    elif node.flatten_with_keys_fn is not None:
        keys = [key for key, _child in node.flatten_with_keys_fn(tree)[0]]
    else:
        names = _child_names(tree, node, children)
        if names is not None:
            keys = [pytree.GetAttrKey(name) for name in names]
        else:
            keys = [pytree.SequenceKey(i) for i in range(len(children))]
    leaves = []
    for key, child in zip(keys, children, strict=True):
        leaves.extend(_named_paths(child, (*prefix, key)))
    return leaves


def _render(path: tuple[Any, ...], inputs: bool) -> str:
    """`args[0]`, `kwargs['mask']` for inputs; `output…` for outputs."""
    if not inputs:
        return "output" + pytree.keystr(path)
    head, rest = path[0], path[1:]
    prefix = "args" if isinstance(head, pytree.SequenceKey) and head.idx == 0 else "kwargs"
    return prefix + pytree.keystr(rest)


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
