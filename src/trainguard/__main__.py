"""`python -m trainguard` runs the command line."""

from trainguard.cli import main

raise SystemExit(main())
