"""streamnb: online generative classifiers with mergeable sufficient statistics."""

from streamnb._version import __version__
from streamnb.models import *  # noqa: F403
from streamnb.models import GenerativeClassifier

__all__ = ["__version__", "GenerativeClassifier"]
