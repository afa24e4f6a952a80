"""Helpers shared by command modules: the effective configuration of the current invocation."""

from __future__ import annotations

import click

from krill.config import KrillConfig, load_config


def current_config(ctx: click.Context | None = None) -> KrillConfig:
    """Load the configuration named by the root command's --config / --set options."""
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    obj = root.obj or {}
    return load_config(obj.get("config_path"), obj.get("overrides", ()))
