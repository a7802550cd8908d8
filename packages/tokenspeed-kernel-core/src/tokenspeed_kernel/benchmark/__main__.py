"""``python -m tokenspeed_kernel.benchmark [TARGET] [options]``: ``tokenspeed-kernel bench``."""

import sys

from .cli import main

sys.exit(main(prog="python -m tokenspeed_kernel.benchmark"))
