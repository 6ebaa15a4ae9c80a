"""The long-sequence timing sweep: run, report, plots and the ``attnviz bench`` command.

Imports neither NumPy nor Qt at import time; torch loads when a sweep runs.
"""
