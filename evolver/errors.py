"""Errors the CLI turns into one line and an exit code."""


class UsageError(Exception):
    """Bad input from the user: the CLI prints the message and exits with code 2."""

    exit_code = 2


class ProviderUnavailable(UsageError):
    """A provider did not answer a command's preflight through its retries: nothing was spent, the CLI
    prints the message and exits with code 3 (try again once it answers), as a run that pauses does."""

    exit_code = 3
