"""The embedded demo: everything on one machine, started and cleaned up by one command."""
