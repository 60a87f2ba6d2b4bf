"""`python -m graphgen.cli`, the same as the `graphgen` script."""

import sys

from . import main

sys.exit(main())
