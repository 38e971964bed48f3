"""What a worker shows: every metric, quality and drift observations, ``/healthz``, and
the token names published for ``streamnb tokens``."""
