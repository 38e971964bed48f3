"""The milter's own parts: what it does with a mail per verdict (:mod:`.policy`) and the
libmilter session that talks to Postfix or Sendmail (:mod:`.session`). The command,
``streamnb milter``, is :mod:`streamnb_workers.cli.commands.milter`."""
