"""The long-sequence timing sweep: run, report, plots and the ``attnviz bench`` command.

- ``config``: ``Config`` (what a sweep runs with) and its one command line
  (``config_to_argv`` / ``config_from_argv``, the flags ``attnviz bench`` parses);
- ``sweep``: ``run(config)`` and the float64 check;
- ``kernels``: the implementations (naive, SDPA and its backends, flex) and their masks;
- ``arithmetic``: FLOPs, bytes read, predicted memory;
- ``devices``: the device, its memory, its clock, and the ceilings measured in a run;
- ``report``: ``Record`` and ``Report``, and the report as table text, CSV or JSON;
- ``plots``: the three plots of a report, titled from the report's own config;
- ``cli``: the ``attnviz bench`` command.

Imports neither NumPy nor Qt at import time; torch loads when a sweep runs.
"""
