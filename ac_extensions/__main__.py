"""``python -m ac_extensions ...`` is ``ac-train ...``."""

import sys

from ac_extensions.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
