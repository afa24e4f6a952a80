"""`python -m krill.coordinator [--config FILE] [--set K=V ...] <command> ...`, the same as
`krill [--config FILE] [--set K=V ...] coordinator <command> ...`: the root command parses the
shared options, so the configuration is loaded exactly as the `krill` command loads it."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from krill.cli import cli
    from krill.coordinator.cli import coordinator

    argv = list(sys.argv[1:] if argv is None else argv)
    root: list[str] = []
    while argv and (argv[0] in ("--config", "--set") or argv[0].startswith(("--config=", "--set="))):
        take = 1 if "=" in argv[0] else 2
        root += argv[:take]
        argv = argv[take:]
    cli.add_command(coordinator, "coordinator")
    cli.main(args=root + ["coordinator"] + argv, prog_name="krill")


if __name__ == "__main__":
    main()
