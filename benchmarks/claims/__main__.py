"""``python -m benchmarks.claims``: see the package's docstring."""

import sys

from benchmarks.claims import main

sys.exit(main(sys.argv[1:]))
