"""The calculator's error type is the run description's (``coursekit.spec.errors``): one ``ValueError`` subclass for
every configuration that cannot be, whichever tool finds it."""
from coursekit.spec.errors import ConfigError, choice, positive_int

__all__ = ["ConfigError", "choice", "positive_int"]
