"""streamnb: online generative classifiers with mergeable sufficient statistics.

>>> import streamnb
>>> model = streamnb.MultinomialNB().partial_fit([[2, 0], [0, 3]], ["spam", "ham"])
>>> model.predict([[1, 0]]).tolist()
['spam']
"""

from typing import Any

from streamnb._version import __version__

__all__ = [
    "BernoulliNB",
    "CategoricalNB",
    "GaussianNB",
    "GenerativeClassifier",
    "HybridNB",
    "LinearDiscriminantAnalysis",
    "MultinomialNB",
    "QuadraticDiscriminantAnalysis",
    "__version__",
    "load",
    "make_model",
    "save",
]


def __getattr__(name: str) -> Any:
    # The models load on first use (their import is deferred): a command that needs none of them (a mail filter
    # started once per mail, streamnb_workers' CLI) does not pay for importing them all.
    if name in __all__:
        from streamnb import models  # deferred: see the comment above

        value = getattr(models, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'streamnb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
