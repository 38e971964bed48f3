"""``python -m streamnb_workers``: the ``streamnb`` command."""

from streamnb_workers.cli.launch import main

raise SystemExit(main())
