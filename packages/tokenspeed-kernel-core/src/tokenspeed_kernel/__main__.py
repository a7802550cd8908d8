"""``python -m tokenspeed_kernel``: the ``tokenspeed-kernel`` command line."""

import sys

from .cli import main

sys.exit(main())
