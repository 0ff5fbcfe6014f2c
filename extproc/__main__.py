"""``python -m extproc``: the same as the ``modelpool-extproc`` command."""

from extproc.cli import main

raise SystemExit(main())
