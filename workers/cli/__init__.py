"""The ``streamnb`` command: its entry, parser, settings and commands."""
