"""`python -m krill.worker [--config F] [--set k=v] init|stake|run|status|unstake|withdraw|claim`."""

from krill.worker.cli import main

main(prog_name="python -m krill.worker")
