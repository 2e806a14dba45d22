"""``python -m recalld.ipc``: the same as the ``recalld`` command."""

import sys

from recalld.ipc.cli import main

sys.exit(main())
