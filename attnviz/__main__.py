"""``python -m attnviz``: the same as the ``attnviz`` command."""

import sys

from attnviz.cli import main

sys.exit(main())
