"""``python -m benchmarks``: run the benchmark (see benchmarks.harness)."""

import sys

from benchmarks.harness import main

if __name__ == "__main__":
    sys.exit(main())
