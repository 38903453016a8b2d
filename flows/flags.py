"""A flow's command line from its signature and docstring (``FlowFlags``): a flag per parameter, and
``add_model_flags``' group of flags per pydantic-model parameter (ModelSpec, TrainingParams, ConversionLimits, ...),
one per field, typed, with ``choices`` for the fields that take a fixed set of values. Nothing is declared twice:
a new flow parameter or model field is a new flag."""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any] | None, tuple | None]:
    """The argparse type and choices of a field's annotation (``int | None`` -> int; Literal -> its values)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if typing.get_origin(annotation) is Literal:
        return None, typing.get_args(annotation)
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        return None, typing.get_args(args[0])
    if len(args) == 1 and args[0] in (int, float):
        return args[0], None
    return None, None  # str, or a union such as nodes' int | str: pydantic converts and checks it


def _takes_json(annotation: Any) -> bool:
    """A value given as JSON on the command line: a model, a dict or list, or a union of models (a discriminated
    one included, e.g. a search space's range-or-choice)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    return any(
        _is_model(member) or typing.get_origin(member) in (dict, list) or member in (dict, list)
        for member in members or (annotation,)
    )


def _one_of(choices: tuple) -> Callable[[str], str]:
    """An argparse type for a long list of names: a typo is told the closest names (difflib), not all of them."""

    def check(value: str) -> str:
        if value in choices:
            return value
        close = difflib.get_close_matches(value, choices, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"{value!r} is not one of the {len(choices)} choices{hint}")

    check.__name__ = "choice"
    return check


def add_model_flags(
    parser: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...] = (), group: str | None = None
) -> list[str]:
    """One ``--flag`` per field of ``model`` (defaults None: the model's own apply; a field holding a model or a
    dict takes JSON); the fields added."""
    target = parser.add_argument_group(group) if group else parser
    added = []
    for name, field in model.model_fields.items():
        if name not in skip:
            default = field.get_default(call_default_factory=True)
            _add_flag(target, "--" + name.replace("_", "-"), name, field.annotation, field.description or "", default)
            added.append(name)
    return added


def summary(flow: Any) -> str:
    """A flow's docstring up to its Args: what a command's --help says it does."""
    return (flow.description or "").split("\n\n")[0]


class FlowFlags:
    """A flow's command line, from its signature: a positional argument per parameter without a default, a
    ``--flag`` per other parameter (help from the flow's docstring, as the UI's form shows it), and per parameter
    holding a pydantic model (ModelSpec, TrainingParams, ...) a group of flags, one per field, unless ``whole``
    names it (one flag taking JSON). Flags left out pass nothing: the flow's and the models' own defaults apply.
    ``flags`` renames a parameter's flag; ``skip`` leaves parameters out, ``skip_fields`` fields of a model
    parameter."""

    def __init__(
        self,
        parser: argparse.ArgumentParser,
        flow: Any,
        *,
        skip: tuple[str, ...] = (),
        skip_fields: dict[str, tuple[str, ...]] | None = None,
        flags: dict[str, str] | None = None,
        whole: tuple[str, ...] = (),
    ) -> None:
        self.flow, self.plain, self.models = flow, [], {}
        hints = typing.get_type_hints(flow.fn)
        described = flow.parameters.properties
        for name, parameter in inspect.signature(flow.fn).parameters.items():
            annotation = hints[name]
            if name in skip:
                continue
            if _is_model(annotation) and name not in whole:
                group = f"{name} ({annotation.__name__})"
                self.models[name] = (
                    annotation,
                    add_model_flags(parser, annotation, (skip_fields or {}).get(name, ()), group),
                )
                continue
            description = described.get(name, {}).get("description", "")
            if parameter.default is inspect.Parameter.empty:
                parser.add_argument(name, help=" ".join(description.split()))
            else:
                flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
                _add_flag(parser, flag, name, annotation, description, parameter.default)
            self.plain.append(name)

    def arguments(self, args: argparse.Namespace) -> dict[str, Any]:
        """The flow's keyword arguments from the parsed flags: those given, and each model parameter built from its
        fields' flags (may raise ValidationError)."""
        given = {name: getattr(args, name) for name in self.plain if getattr(args, name) is not None}
        for name, (model, fields) in self.models.items():
            given[name] = model_from_flags(model, args, fields)
        return given

    def with_defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` and the flow's defaults for everything else: every parameter by name."""
        bound = inspect.signature(self.flow.fn).bind_partial(**given)
        bound.apply_defaults()
        return dict(bound.arguments)


def model_from_flags(model: type[T], args: argparse.Namespace, names: list[str], **extra: Any) -> T:
    """``model`` from the flags given (those left out take the model's defaults); may raise ValidationError."""
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return model(**given, **extra)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _add_flag(target: Any, flag: str, name: str, annotation: Any, description: str, default: Any) -> None:
    """One ``--flag`` for a value of ``annotation``; its default None (left out: the model's or flow's own)."""
    kind, choices = _flag_type(annotation)
    shown = "" if default is None or isinstance(default, BaseModel) else f" (default: {default})"
    help = " ".join(description.split()) + shown
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if annotation in (bool, bool | None):
        target.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help)
    elif len(args) == 1 and _takes_json(args[0]):
        target.add_argument(flag, dest=name, type=json.loads, metavar="JSON", default=None, help=f"{help}; as JSON")
    elif choices and len(choices) > 12:  # many names (architectures): the closest first, not all of them
        target.add_argument(
            flag,
            dest=name,
            type=_one_of(choices),
            choices=choices,
            metavar=name.upper(),
            default=None,
            help=f"{help}; one of: {', '.join(choices)}",
        )
    else:
        target.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=help)
