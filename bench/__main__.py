"""``python -m bench``: see :mod:`bench.cli`."""

import sys

from bench.cli import main

# The guard matters: worker processes use the spawn start method, which imports the main
# module again (as __mp_main__) in every child.
if __name__ == "__main__":
    sys.exit(main())
