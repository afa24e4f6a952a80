"""Helpers that test suites of every part share (real services started and stopped by PID)."""
