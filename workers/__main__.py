"""``python -m streamnb_workers``: the ``streamnb`` command."""

from streamnb_workers.launch import main

raise SystemExit(main())
