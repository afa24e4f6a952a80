"""Helpers shared by command modules: the effective configuration of the current invocation, and the check of
an output path before a long command starts.

Design decisions:
- A command that runs for minutes or hours and writes its results at the end (`krill calibrate --out`,
  `krill train local --summary`, `krill release --out`, `krill model init --out`) checks where it will write
  first (`output_file`, `output_folder`): a path through a file, or a folder it cannot write in, used to
  fail only at the end, with a traceback, after the work was done and lost. The check makes nothing (a
  release whose audit fails writes nothing); it walks up to the nearest part of the path that exists.
- `FiniteFloatRange` is click's `FloatRange` less `nan`, which passes every bound check (each comparison with
  it is false): `--poll nan` reached `time.sleep`, `--lr nan` the optimizer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import click

from krill.config import KrillConfig, load_config


def current_config(ctx: click.Context | None = None) -> KrillConfig:
    """Load the configuration named by the root command's --config / --set options."""
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    obj = root.obj or {}
    return load_config(obj.get("config_path"), obj.get("overrides", ()))


def _check_can_make(value: Path, folder: Path) -> None:
    """Raise `click.BadParameter` unless `folder` is, or can be made as, a writable folder."""
    probe = folder.expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise click.BadParameter(f"{value}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: cannot write in {probe} (permission denied or read-only)")


def output_file(ctx: click.Context, param: click.Parameter, value: Path | str | None) -> Path | str | None:
    """A click callback for an option naming a file to write at the end: its folder must be writable (or
    makeable) now."""
    if value is not None:
        _check_can_make(Path(value), Path(value).expanduser().absolute().parent)
    return value


def output_folder(ctx: click.Context, param: click.Parameter, value: Path | str | None) -> Path | str | None:
    """A click callback for an option naming a folder to write into at the end: it must be a writable folder,
    or makeable, now."""
    if value is not None:
        _check_can_make(Path(value), Path(value))
    return value


class FiniteFloatRange(click.FloatRange):
    """`click.FloatRange` that also refuses `nan` and infinities."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
