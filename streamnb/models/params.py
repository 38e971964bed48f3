"""A model's hyper-parameters as scikit-learn's estimators expose them: the constructor's
arguments (``get_params``) and a ``repr`` of those that differ from their defaults.

>>> class Toy(HyperParams):
...     def __init__(self, alpha=1.0, fit_prior=True):
...         self.alpha, self.fit_prior = alpha, fit_prior
>>> Toy(alpha=0.1).get_params(), Toy(alpha=0.1)
({'alpha': 0.1, 'fit_prior': True}, Toy(alpha=0.1))
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["HyperParams"]


class HyperParams:
    """``get_params`` and ``repr`` over the constructor's arguments, each stored as an
    attribute of the same name (scikit-learn's convention)."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The constructor's arguments, sorted (as scikit-learn's BaseEstimator)."""
        sig = inspect.signature(cls.__init__)
        return sorted(p.name for p in sig.parameters.values()
                      if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyper-parameters as given to the constructor (or ``set_params``);
        ``type(self)(**get_params())`` is an unfitted clone. ``deep`` is accepted for
        scikit-learn: no parameter is itself an estimator."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def __repr__(self) -> str:
        """Like scikit-learn's: the parameters that differ from the defaults."""
        sig = inspect.signature(type(self).__init__).parameters
        changed = []
        for k, v in self.get_params().items():
            default = sig[k].default
            try:
                same = bool(v is default or v == default) and type(v) is type(default)
            except (TypeError, ValueError):
                same = False
            if not same:
                changed.append(f"{k}={v!r}")
        return f"{type(self).__name__}({', '.join(changed)})"
