"""Adapters that let other libraries drive streamnb's models (``streamnb.compat.river``).

The models themselves are scikit-learn estimators and need no adapter for it; River's
tools want a :class:`river.base.Classifier` that learns one dict at a time, which
:mod:`streamnb.compat.river` wraps around any model. River is imported there only.
"""
