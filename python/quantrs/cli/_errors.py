"""The one exception type for user mistakes: ``main`` prints it as one line and exits 1."""

from .._core import QuantError


class CliError(QuantError):
    """A mistake the user can fix (bad argument, missing or corrupt file); a
    ``quantrs.QuantError`` like every error quantrs raises."""
