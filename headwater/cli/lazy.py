"""A click group whose subcommands are imported only when one of them is asked for.

A command imports its own module and no other: ``headwater serve`` loads no client
command, and no benchmark (through them pyspark). The ``headwater`` group's commands, and
the ``bench`` group's Spark and cluster commands, are registered by name and
``module:attribute``
(``LazyGroup(lazy_subcommands={"spark": "headwater.tools.benchmarks.spark:bench_spark"})``) and
loaded by ``get_command``, which click calls for the command being run and for help (the
group's help lists every command's short help, so ``headwater --help`` loads them all).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click


class LazyGroup(click.Group):
    def __init__(
        self, *args: Any, lazy_subcommands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command
