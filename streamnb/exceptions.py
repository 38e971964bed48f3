"""Exceptions raised by streamnb. One module, so callers can catch by type.

scikit-learn is not a dependency, but where it is installed two of these are also its
classes, so that its tools and tests recognise them: a :class:`NotFittedError` is an
instance of ``sklearn.exceptions.NotFittedError``, and :data:`DataConversionWarning` is
``sklearn.exceptions.DataConversionWarning``. Importing scikit-learn takes about a
second, so neither is looked up when this module is imported: the first is resolved when
the first NotFittedError is made, the second when the name is first read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    #: scikit-learn's ``DataConversionWarning`` where it is installed, else a UserWarning
    #: subclass of that name (resolved by the module's ``__getattr__``).
    DataConversionWarning: type[UserWarning]


class StreamnbError(Exception):
    """Base class of every streamnb error."""


class NotFittedError(StreamnbError, ValueError, AttributeError):
    """A model was asked to predict before it has learnt any class.

    Subclasses ValueError and AttributeError, as scikit-learn's does. Where
    scikit-learn is installed, ``NotFittedError(...)`` makes an instance of a subclass
    that also derives from ``sklearn.exceptions.NotFittedError`` (same name, module and
    message), so ``except NotFittedError`` catches it either way and scikit-learn's
    checks see their own class. scikit-learn is imported then, at the first
    NotFittedError of the process, not when streamnb is imported. (A subclass of
    NotFittedError is made as it is.)

    Examples
    --------
    >>> err = NotFittedError("This GaussianNB instance is not fitted yet")
    >>> isinstance(err, (NotFittedError, ValueError, AttributeError)), type(err).__name__
    (True, 'NotFittedError')
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> NotFittedError:
        made_of = _not_fitted_class() if cls is NotFittedError else cls
        return super().__new__(made_of, *args, **kwargs)

    def __reduce__(self) -> Any:
        # Pickled as the base class, which pickle finds by name (the subclass has the same
        # name); unpickling then makes the right one for that process.
        return (NotFittedError, *super().__reduce__()[1:])


#: The class of every NotFittedError this process makes, once known ("NotFittedError").
_MADE_OF: dict[str, type[NotFittedError]] = {}


def _not_fitted_class() -> type[NotFittedError]:
    """The class a new :class:`NotFittedError` is made of: NotFittedError itself, or
    where scikit-learn imports, a subclass that is also scikit-learn's NotFittedError.
    Chosen once, so every such error of the process has the same type (two threads that
    race here keep the first one's: ``dict.setdefault`` is atomic)."""
    made_of = _MADE_OF.get("NotFittedError")
    if made_of is None:
        sklearn_class = _sklearn_exception("NotFittedError")
        built = NotFittedError if sklearn_class is None else type(
            "NotFittedError", (NotFittedError, sklearn_class),
            {"__module__": __name__, "__qualname__": "NotFittedError",
             "__doc__": NotFittedError.__doc__})
        made_of = _MADE_OF.setdefault("NotFittedError", built)
    return made_of


def _sklearn_exception(name: str) -> Any:
    """``sklearn.exceptions.<name>``, or None where scikit-learn is not installed (or
    does not import: a broken optional package must not change which error is raised)."""
    try:  # deferred: scikit-learn is optional and heavy, imported at its first use
        import sklearn.exceptions
    except Exception:  # ImportError, or whatever a broken installation raises
        return None
    return getattr(sklearn.exceptions, name, None)


def __getattr__(name: str) -> Any:
    # DataConversionWarning: scikit-learn's class, looked up when the name is first read.
    if name == "DataConversionWarning":
        value = _sklearn_exception(name) or _LocalDataConversionWarning
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _LocalDataConversionWarning(UserWarning):
    """Input converted to what the model needs (a column-vector y flattened).

    :data:`DataConversionWarning` where scikit-learn is not installed; where it is,
    that name is scikit-learn's own class.
    """


_LocalDataConversionWarning.__name__ = "DataConversionWarning"
_LocalDataConversionWarning.__qualname__ = "DataConversionWarning"


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
