"""Exit codes of the ``streamnb`` command (docs/cli.md, "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
#: The command ran but did not fully succeed (records skipped, a timeout).
EXIT_FAILURE = 1
#: Bad arguments, settings or model name: one line on stderr.
EXIT_USAGE = 2
#: Redis cannot be reached at start.
EXIT_UNREACHABLE = 3
