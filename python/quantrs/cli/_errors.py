"""The one exception type for user mistakes: ``main`` prints it as one line and exits 1."""


class CliError(Exception):
    """A mistake the user can fix (bad argument, missing or corrupt file)."""
