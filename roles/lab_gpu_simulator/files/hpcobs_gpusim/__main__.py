"""python3 -m hpcobs_gpusim: the same as the hpcobs-gpusim launcher."""

import sys

from .cli import main

sys.exit(main())
