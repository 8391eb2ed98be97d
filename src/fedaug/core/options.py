"""The options of a registered builder or component, read from its signature and its docstring.

A dataset builder, a model builder and a method component's ``__init__`` declare their options as
keyword-only parameters with annotations and defaults; their docstrings describe them (Google style,
``Args:``). :func:`option_types` is what the validator accepts
(:func:`fedaug.data.registry.check_options`), and :func:`describe_options` describes exactly those
options for ``fedaug list methods fedfa`` (jsonargparse and LightningCLI read signatures and
docstrings the same way). A string option with a fixed set of values is annotated ``Literal[...]``,
and the component checks it against the same ``Literal`` (:func:`fedaug.core.typecheck.choices`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedaug.core.paths import path_options
from fedaug.core.typecheck import annotations_of, choices, element_type, is_union

#: a Google-style section header: ``Args:``
_SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
#: an ``Args:`` entry: ``name: text`` or ``a, b: text`` (options described together)
_ENTRY = re.compile(r"^(\s*)(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?:\s*(.*)$")
_SIMPLE = {int: "int", float: "float", bool: "bool", str: "str"}
#: a cross-reference in a docstring: ``:func:`fedaug.data.fashion_mnist.fashion_mnist` ``
_REFERENCE = re.compile(r":(?:func|class):`~?([\w.]+)`")
#: an ``Args:`` entry that only points at another class's: ``bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.``
_POINTER = re.compile(r"as (?::class:`~?[\w.]+`|\w+)\.?")


def option_types(fn: Callable[..., Any]) -> dict[str, Any]:
    """The options ``fn`` takes, its keyword-only parameters (``seed`` excluded), with their resolved
    annotations (``Any`` where there is none: :func:`fedaug.core.typecheck.annotations_of`)."""
    hints = annotations_of(fn)
    return {p: hints.get(p, Any) for p, v in inspect.signature(fn).parameters.items()
            if v.kind is inspect.Parameter.KEYWORD_ONLY and p != "seed"}


def docstring_args(doc: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: ``{name: its text on one line}`` (an entry
    ``a, b: text`` describes both; continuation lines are joined).

    >>> docstring_args('''Summary.
    ...
    ...     Args:
    ...         p: probability of augmenting
    ...             (paper 0.5).
    ...         lo, hi: the limits.
    ...
    ...     Returns:
    ...         nothing.''')
    {'p': 'probability of augmenting (paper 0.5).', 'lo': 'the limits.', 'hi': 'the limits.'}
    """
    out: dict[str, list[str]] = {}
    section_indent, entry_indent, current = None, None, []
    for line in inspect.cleandoc(doc or "").splitlines():
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(line)
        if section_indent is None:
            if header and header.group(2) in ("Args", "Arguments", "Parameters"):
                section_indent = indent
            continue
        if not line.strip():
            continue
        if indent <= section_indent or line.lstrip().startswith(">>>"):
            break  # the next section, or an example
        entry = _ENTRY.match(line)
        if entry and (entry_indent is None or indent == entry_indent):
            entry_indent = indent
            current = [entry.group(3)]
            for name in re.split(r"\s*,\s*", entry.group(2)):
                out[name.lstrip("*")] = current
        elif current:
            current.append(line.strip())
    return {name: " ".join(s for s in text if s) for name, text in out.items()}


def referenced(doc: str | None) -> list[Any]:
    """The objects a docstring refers to with ``:func:`` or ``:class:`` and a full dotted path (those
    that cannot be imported are left out): where a builder says its options are another's."""
    out = []
    for target in _REFERENCE.findall(doc or ""):
        module, _, attr = target.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError, ValueError):
            continue
    return out


def plain(text: str) -> str:
    """``text`` without reST markup: ``"x"`` literals and roles (``:class:`~a.B``` -> ``B``).

    >>> plain('``"fused"`` (see :class:`~fedaug.layers.ffa.FFALayer`, :func:`fedaug.data.load`)')
    '"fused" (see FFALayer, fedaug.data.load)'
    """
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"\1", text)
    text = re.sub(r":\w+:`([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def first_sentence(text: str) -> str:
    """``text`` up to the end of its first sentence (a full stop followed by a capital, or the end).

    >>> first_sentence("probability (e.g. 0.5). Paper: 0.5.")
    'probability (e.g. 0.5).'
    """
    m = re.match(r"(.+?\.)\s+(?=[A-Z`])", text)
    return m.group(1) if m else text


def type_name(tp: Any) -> str:
    """A short name of the annotation ``tp`` as a config writes the value: ``float``, ``str``,
    ``list[str]``, ``table``, ``path``, ``any``; ``None`` in a union is left out (unset = the default).

    >>> type_name(float | None), type_name(Sequence[str] | None), type_name(typing.Literal["a", "b"])
    ('float', 'list[str]', 'str')
    """
    if is_union(tp):
        return " | ".join(dict.fromkeys(type_name(a) for a in typing.get_args(tp) if a is not type(None)))
    if choices(tp):
        return type_name(type(choices(tp)[0]))
    if tp in _SIMPLE:
        return _SIMPLE[tp]
    if (typing.get_origin(tp) or tp) is os.PathLike:
        return "path"
    element = element_type(tp)
    if element is not None:
        return f"list[{type_name(element)}]"
    if (typing.get_origin(tp) or tp) in (dict, Mapping):
        return "table"
    return "any"


@dataclass(frozen=True)
class OptionInfo:
    """One option of a builder or component, as ``fedaug list`` shows it.

    Args:
        name: the option's key in its config table.
        type: :func:`type_name` of its annotation; ``path`` for an option that names a file or
            directory (:func:`fedaug.core.paths.path_options`).
        default: its default (a JSON value; ``None``: unset, the builder decides).
        choices: the values it allows, when its annotation is a ``Literal``; else empty.
        help: what it does (its docstring entry on one line, reST markup removed: :func:`plain`;
            empty when it has none).
        required: it has no default.
        bounds: its limits as text (``> 0``), where they are declared (the run config's keys).
    """

    name: str
    type: str
    default: Any
    choices: tuple[Any, ...]
    help: str
    required: bool = False
    bounds: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Everything but the name, JSON-ready (what ``fedaug list ... --format json`` prints)."""
        return {"type": self.type, "default": _jsonable(self.default), "choices": list(self.choices),
                "bounds": self.bounds, "help": self.help, "required": self.required}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def describe_options(fn: Callable[..., Any], *, docs: Sequence[Any] = (), extra: Mapping[str, str] | None = None,
                     skip: Sequence[str] = ()) -> list[OptionInfo]:
    """Every option :func:`option_types` finds in ``fn`` (in signature order), then ``extra``.

    Args:
        fn: the builder, or a component's ``__init__``.
        docs: further objects whose docstrings describe the options, searched after ``fn``'s own
            (a component's class and its bases; the class a model builder returns); last, the
            objects ``fn``'s docstring refers to (:func:`referenced`: "options as :func:`...`").
            An entry that only points at another class (``bn: as FedAvg.``) is passed over, so
            that the option keeps the text of the class it points at (a base, searched later).
        extra: options every builder of the kind accepts beyond its own, with their help
            (a dataset's ``held_out``).
        skip: options filled in by fedaug, not by a config (a model's ``in_channels``).
    """
    helps: dict[str, str] = {}
    for obj in (fn, *docs, *referenced(inspect.getdoc(fn)))[::-1]:  # the first that describes an option wins
        helps.update({k: v for k, v in docstring_args(inspect.getdoc(obj)).items() if not _POINTER.fullmatch(v)})
    params = inspect.signature(fn).parameters
    paths = path_options(fn)
    out = []
    for name, tp in option_types(fn).items():
        if name in skip:
            continue
        default = params[name].default
        required = default is inspect.Parameter.empty
        out.append(OptionInfo(name, "path" if name in paths else type_name(tp),
                              None if required else _jsonable(default), choices(tp), plain(helps.get(name, "")),
                              required))
    out += [OptionInfo(name, "any", None, (), text) for name, text in (extra or {}).items()]
    return out
