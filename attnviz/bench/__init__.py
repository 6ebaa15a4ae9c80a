"""The long-sequence timing sweep: run, report, plots and the ``attnviz bench`` command.

- ``config``: ``Config`` (what a sweep runs with) and its one command line
  (``config_to_argv`` / ``config_from_argv``, the flags ``attnviz bench`` parses);
- ``sweep``: ``run(config)`` and its arithmetic (FLOPs, predicted memory, the float64 check);
- ``report``: ``Record`` and ``Report``, and the report as table text, CSV or JSON;
- ``plots``: the three plots of a report, titled from the report's own config;
- ``cli``: the ``attnviz bench`` command.

Imports neither NumPy nor Qt at import time; torch loads when a sweep runs.
"""
