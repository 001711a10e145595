"""``python -m sediment``: the same command line as the ``sediment`` console script."""

import sys

from sediment.cli import main

if __name__ == "__main__":
    sys.exit(main())
