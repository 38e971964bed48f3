"""The generative model family (see :mod:`streamnb.models.base`)."""

from __future__ import annotations

import contextlib

from streamnb.models.base import MODEL_KINDS, GenerativeClassifier

# TEMPORARY during parallel development: modules written by other helpers may not exist yet.
with contextlib.suppress(ImportError):
    from streamnb.models.multinomial import MultinomialNB  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.bernoulli import BernoulliNB  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.categorical import CategoricalNB  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.gaussian import GaussianNB  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.lda import LinearDiscriminantAnalysis  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.qda import QuadraticDiscriminantAnalysis  # noqa: F401
with contextlib.suppress(ImportError):
    from streamnb.models.io import dumps, load, loads, make_model, save  # noqa: F401
