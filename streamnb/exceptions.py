"""Exceptions raised by streamnb. One module, so callers can catch by type."""

from __future__ import annotations


class StreamnbError(Exception):
    """Base class of every streamnb error."""


class NotFittedError(StreamnbError, ValueError, AttributeError):
    """A model was asked to predict before it has learnt any class.

    Subclasses ValueError and AttributeError, as scikit-learn's does.
    """


class FormatError(StreamnbError, ValueError):
    """Encoded statistics, snapshots or model files that cannot be decoded.

    Raised for a wrong type tag, a format version newer than this code
    understands, or arrays whose dtype or shape do not match.
    """


class MalformedMessage(StreamnbError, ValueError):
    """A stream message that cannot be processed.

    ``reason`` is a short machine-readable code (``not_msgpack``,
    ``bad_label``, ...) used as the dead-letter reason and metric label;
    ``detail`` is a human-readable sentence.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ConfigConflict(StreamnbError, ValueError):
    """A worker's model configuration differs from the one stored in Redis."""


class SingularCovarianceWarning(UserWarning):
    """A covariance (per class, or shared) was singular or not positive definite.

    The message names the class and how much jitter was added to its diagonal;
    predictions use the regularised covariance and stay finite.
    """


class SettingsError(StreamnbError, ValueError):
    """A bad command-line option, environment variable or configuration file value."""
