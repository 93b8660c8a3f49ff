"""Typer command and group classes whose ``--help`` shows no ``<bool>`` placeholder beside flags and every option
name whole (:mod:`attnviz.cli.help_layout`); :func:`use_plain_flags` puts them on every command of the app."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def _without_flag_placeholders(params: list[Any]) -> list[Any]:
    """Flags (``--force``, ``--help``) take no value: show no ``<bool>`` type beside them in ``--help``."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A Typer command whose help shows no ``<bool>`` placeholder beside flags, and every option name whole."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_placeholders(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from attnviz.cli.help_layout import format_help

        format_help(self, ctx, formatter, super().format_help)


class Group(TyperGroup):
    """A Typer group whose help shows no ``<bool>`` placeholder beside flags, and every option name whole."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_placeholders(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from attnviz.cli.help_layout import format_help

        format_help(self, ctx, formatter, super().format_help)


def use_plain_flags(app: typer.Typer) -> None:
    """Make every command and group of ``app`` (sub-groups included) a :class:`Command` / :class:`Group`."""
    app.info.cls = Group
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # the default class (a command of its own class keeps it)
            info.cls = Command
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_plain_flags(group.typer_instance)
