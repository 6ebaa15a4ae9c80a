"""Entry point of the frozen build: the same as the attnviz command."""

import sys

from attnviz.cli import main

sys.exit(main())
