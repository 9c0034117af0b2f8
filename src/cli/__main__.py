"""``python -m pi_durable_lmdb.cli``: the ``durable-log`` command."""

import sys

from . import main

sys.exit(main())
