"""`krill model init`: build (or find cached) the default base model.

The build is deterministic and offline (see `krill.model.base`); the model is cached under
`$KRILL_HOME/models/<recipe hash>/`, so a second call returns at once. `--out` copies the
cached directory somewhere else; `--force` rebuilds even when cached.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from krill.commands.context import output_folder


@click.group()
def model() -> None:
    """Base models: build the default one."""


@model.command("init")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None, callback=output_folder,
              help="Also copy the model directory here.")
@click.option("--force", is_flag=True, help="Rebuild even if a cached build exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the build record as JSON.")
def init(out: Path | None, force: bool, as_json: bool) -> None:
    """Build the default base model (tiny Llama, warm-started on the default task)."""
    from transformers.utils import logging as hf_logging

    from krill.model.base import BaseModelRecipe, base_model_info, ensure_base_model

    hf_logging.disable_progress_bar()
    recipe = BaseModelRecipe()

    def progress(step: int, loss: float, accuracy: float) -> None:
        if not as_json:
            click.echo(f"warm start step {step:5d}  loss {loss:.3f}  held-out accuracy {accuracy:6.1%}"
                       f"  (target {recipe.target_accuracy:.0%})")

    path = ensure_base_model(recipe, force=force, progress=progress)
    info = base_model_info(path)
    if out is not None:
        shutil.copytree(path, out, dirs_exist_ok=True)
        path = out
    if as_json:
        click.echo(json.dumps({"path": str(path), **info}, indent=2, sort_keys=True))
    else:
        click.echo(f"base model: {path}")
        click.echo(f"task {info['recipe']['task']}, {info['parameters']:,} parameters, {info['steps']} warm-start "
                   f"steps in {info['seconds']:.1f}s, held-out greedy accuracy {info['accuracy']:.1%}")
