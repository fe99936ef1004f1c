"""Errors the CLI turns into one line and an exit code."""


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message and exits with code 2."""

    exit_code = 2
