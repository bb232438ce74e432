"""The command line: a thin layer over the stages, with fixed exit codes (``main``)."""

from ..plan.plan import DEFAULT_AT, DEFAULT_TRAMP
from .main import EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNKNOWN, EXIT_USAGE, main

__all__ = ["DEFAULT_AT", "DEFAULT_TRAMP", "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_UNKNOWN", "EXIT_USAGE", "main"]
