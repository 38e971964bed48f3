"""streamnb: online generative classifiers with mergeable sufficient statistics.

>>> import streamnb
>>> model = streamnb.MultinomialNB().partial_fit([[2, 0], [0, 3]], ["spam", "ham"])
>>> model.predict([[1, 0]]).tolist()
['spam']
"""

from streamnb._version import __version__
from streamnb.models import (
    BernoulliNB,
    CategoricalNB,
    GaussianNB,
    GenerativeClassifier,
    HybridNB,
    LinearDiscriminantAnalysis,
    MultinomialNB,
    QuadraticDiscriminantAnalysis,
    load,
    make_model,
    save,
)

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
