"""Module paths other projects import (vLLM's TokenSpeed MoE backend); each re-exports
one implementation from :mod:`tokenspeed_kernel_amd.moe`."""
