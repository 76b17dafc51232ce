"""The package version (a leaf: the modules that record it in files import it from here)."""

__version__ = "0.1.0"
