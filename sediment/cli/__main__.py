"""``python -m sediment.cli``: the same command line as ``sediment``."""

import sys

from sediment.cli import main

if __name__ == "__main__":
    sys.exit(main())
