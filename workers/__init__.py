"""The streamnb daemon (installed as ``streamnb_workers``): workers that learn and predict
from Redis streams, and the ``streamnb`` command. Importing it changes nothing in the
process; :mod:`streamnb_workers.cli.launch` sets up a process that runs the daemon."""
