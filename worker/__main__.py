"""`python -m krill.worker [--config F] [--set k=v] run|stake|status`."""

from krill.worker.cli import main

main(prog_name="python -m krill.worker")
