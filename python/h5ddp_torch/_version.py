"""The package's version: one definition, below every module that writes it into a file (partial.py, writer.py)
and the package's __init__.py, which exports it."""
__version__ = "0.1.0"
