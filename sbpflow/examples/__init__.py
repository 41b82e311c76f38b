"""Runnable examples: `python -m sbpflow.examples.<name>`."""
