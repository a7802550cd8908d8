"""FlashInfer wrappers (``flashinfer-python``, import ``flashinfer``).

Importing this package imports nothing from FlashInfer: ``_register.register``
registers the wrappers when FlashInfer is installed, and the wrapper modules
(``attention``, ``norm``, ``moe``) import it when a kernel is first resolved.
Set ``TOKENSPEED_FLASHINFER_CACHE`` to choose where FlashInfer keeps its JIT
cache (see ``_jit``).
"""
