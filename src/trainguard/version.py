"""trainguard's version, in a module of its own: the modules that record it (the run store's
metadata, checkpoint sidecars, `--version`) import it without importing the package's exports."""

__version__ = "0.1.0"
