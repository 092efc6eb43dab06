"""`python -m wal inspect|verify DIR`."""

import sys

from wal.cli import main

sys.exit(main())
