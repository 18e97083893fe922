import sys

from mpbroker.cli import main

sys.exit(main())
