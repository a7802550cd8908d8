"""``python -m tokenspeed_kernel.numerics [TARGET] [options]``: ``tokenspeed-kernel verify``."""

import sys

from .cli import main

sys.exit(main(prog="python -m tokenspeed_kernel.numerics"))
