"""Models built only on the public API (the proof that the kernel boundary holds)."""
