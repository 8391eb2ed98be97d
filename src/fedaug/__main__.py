"""``python -m fedaug`` is the ``fedaug`` command."""

from fedaug.cli.main import main

raise SystemExit(main())
