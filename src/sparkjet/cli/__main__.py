"""``python -m sparkjet.cli``: the ``sparkjet`` command."""

import sys

from sparkjet.cli import main

sys.exit(main())
