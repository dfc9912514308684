"""The version, in one place (read by the package and the command line)."""
__version__ = "0.1.0"
