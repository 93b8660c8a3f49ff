"""Closed sets of the library's choices as Typer options: an Enum of the values (``choice_enum``) and a parser
that takes any case and ``-`` or ``_`` and refuses anything else in one line, before any model loads
(``choice_parser``). The values come from the library's light ``*/choices.py`` modules, never a copy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import typer


def choice_enum(name: str, values: Iterable[Any]) -> type[Enum]:
    """An Enum of the library's closed set ``values`` (member names and values are the strings), for Typer."""
    return Enum(name, {str(value): str(value) for value in values}, type=str)  # type: ignore[return-value]


def choice_parser(choices: type[Enum], what: str, aliases: dict[str, str] | None = None) -> Callable[[Any], Enum]:
    """A Typer ``parser`` for a closed set: the Enum member named, whatever its case and ``-``/``_``.

    Typer still lists the members in ``--help`` and completes them; anything else is refused
    as ``unknown WHAT 'x': use one of ...`` (one line, before any model loads). ``aliases``
    (``{former name: member value}``) are accepted but not listed.
    """
    members = {_choice_key(member.value): member for member in choices}
    former = {_choice_key(alias): choices(value) for alias, value in (aliases or {}).items()}
    members.update(former)

    def parse(value: Any) -> Enum:
        if isinstance(value, choices):
            return value
        member = members.get(_choice_key(str(value)))
        if member is None:
            raise typer.BadParameter(f"unknown {what} {value!r}: use one of {', '.join(m.value for m in choices)}")
        if _choice_key(str(value)) in former and _choice_key(str(value)) not in map(_choice_key, choices.__members__):
            from attnviz.cli.console import warn

            warn(f"{what} {str(value)!r} is the former name of {member.value!r}: give {member.value}")
        return member

    return parse


def _choice_key(value: str) -> str:
    return value.strip().lower().replace("-", "_")
