"""The README and docs/ are what an operator reads first: the files they point at, the commands and
flags they show and the configuration fields they name must exist.

Design decisions:
- Paths are read from code spans that start with one of the repository's top-level folders (a role
  folder is `worker/`, never `krill/worker/`: the package name is not a path); `{md,json}` and `*`
  are expanded as a shell would.
- Commands are read from code spans that start with `krill `; flags anywhere in a CLI-reference row
  belong to that row's command group, flags in running text to the command they follow.
- Figures are not checked here: they are dated measurements, compared by hand with bench/results.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from krill.cli import cli
from krill.config import KrillConfig

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("krill/", "worker/", "verifier/", "coordinator/", "explorer/", "contracts/", "bench/", "docs/",
               "tests/", "scripts/", ".ci/")


def _spans(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [p for alt in match.group(1).split(",")
            for p in _expand(pattern[:match.start()] + alt + pattern[match.end():])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_the_docs_name_exists(doc):
    missing = []
    for span in _spans(doc):
        path = span.split()[0].rstrip(".,;:")
        if not path.startswith(TOP_FOLDERS):
            continue
        for candidate in _expand(path):
            if not (ROOT / candidate).exists() and not list(ROOT.glob(candidate)):
                missing.append(candidate)
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def _command(words: list[str]) -> tuple[click.Command | None, list[str]]:
    ctx = click.Context(cli)
    cmd, path = cli, []
    for word in words:
        if not isinstance(cmd, click.Group) or not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        sub = cmd.get_command(ctx, word)
        if sub is None:
            return None, path + [word]
        cmd, path = sub, path + [word]
    return cmd, path


def _options(cmd: click.Command) -> set[str]:
    ctx = click.Context(cli)
    names, todo = {"--help"} | {o for p in cli.params for o in p.opts + p.secondary_opts}, [cmd]
    while todo:
        c = todo.pop()
        names |= {o for p in c.params for o in p.opts + p.secondary_opts}
        if isinstance(c, click.Group):
            todo.extend(c.get_command(ctx, name) for name in c.list_commands(ctx))
    return names


def _words(span: str) -> list[str]:
    words = span.split()[1:]
    while words[:1] and words[0] in ("--config", "--set"):
        words = words[2:]
    return words


def test_every_command_and_flag_the_readme_shows_exists():
    problems = []

    def check(span: str, text: str, scope: int | None) -> None:
        cmd, path = _command(_words(span))
        if cmd is None:
            problems.append(f"no command `krill {' '.join(path)}` ({span})")
            return
        known = _options(cmd if scope is None else _command(path[:scope])[0])
        problems.extend(f"`krill {' '.join(path)}` has no {flag} ({text[:80]})"
                        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text) if flag not in known)

    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        spans = re.findall(r"`(krill [^`]*)`", line)
        if line.startswith("| `krill "):
            check(spans[0], line, scope=1)  # a reference row: `krill keys new ...` / `show ...` / `list`
        else:
            for span in spans:
                check(span, span, scope=None)
    assert not problems, problems


def test_every_configuration_field_the_docs_name_exists():
    sections = KrillConfig.model_fields
    unknown = []
    for doc in DOCS:
        for section, field in re.findall(r"`([a-z_]+)\.([a-z_]+)(?:\s*=[^`]*)?`", doc.read_text(encoding="utf-8")):
            if section in sections and section != "store":  # `store.prepare` etc. are the store's methods
                model = sections[section].annotation
                if field not in model.model_fields:
                    unknown.append(f"{doc.name}: {section}.{field}")
    assert not unknown, unknown
