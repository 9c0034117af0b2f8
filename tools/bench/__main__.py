"""``python -m tools.bench``: the benchmark report (``tools.bench.report``)."""

import sys

from tools.bench.report import main

sys.exit(main())
