"""The ``streamnb`` subcommands, one module each: ``NAME``, ``add_parser(subparsers)``
declaring the command and its options, and ``run(args, env)`` returning the exit code.
:mod:`streamnb_workers.cli.main` builds the parser from their list."""
