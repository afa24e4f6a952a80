"""Benchmarks that need more than a command module: grids of training runs, detection studies."""
