"""The ``streamnb`` command: its entry (:mod:`.launch`, :mod:`.main`), the options its
commands share (:mod:`.options`, :mod:`.arg_types`, :mod:`.settings`), one module per
command (:mod:`.commands`) and what the larger commands run (the worker supervisor, the
stdin filter and many-message modes of ``predict``, the demo)."""
