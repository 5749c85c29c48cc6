"""sweeper's version, importable from both planes without importing anything else."""

__version__ = "0.1.0"
