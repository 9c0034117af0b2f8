"""``python -m pi_durable_lmdb.cli``: the ``durable-log`` command, through its entry point (the
module beside the package, which answers Ctrl-C for the rest of the start)."""

import sys

from pi_durable_lmdb_launcher import main

sys.exit(main())
