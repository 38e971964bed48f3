"""The generative model family (see :mod:`streamnb.models.base`).

>>> from streamnb.models import MultinomialNB, make_model
>>> make_model("multinomial", alpha=0.5)
MultinomialNB(alpha=0.5)
>>> sorted(MODEL_KINDS) == sorted(model_class(kind).kind for kind in MODEL_KINDS)
True
"""

from __future__ import annotations

from streamnb.models.base import GenerativeClassifier
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.categorical import CategoricalNB
from streamnb.models.gaussian import GaussianNB
from streamnb.models.hybrid import HybridNB
from streamnb.models.io import MODEL_KINDS, dumps, load, loads, make_model, model_class, save
from streamnb.models.lda import LinearDiscriminantAnalysis
from streamnb.models.multinomial import MultinomialNB
from streamnb.models.qda import QuadraticDiscriminantAnalysis

__all__ = [
    "MODEL_KINDS",
    "BernoulliNB",
    "CategoricalNB",
    "GaussianNB",
    "GenerativeClassifier",
    "HybridNB",
    "LinearDiscriminantAnalysis",
    "MultinomialNB",
    "QuadraticDiscriminantAnalysis",
    "dumps",
    "load",
    "loads",
    "make_model",
    "model_class",
    "save",
]
