"""The ``fedaug`` command line: one module per subcommand."""
