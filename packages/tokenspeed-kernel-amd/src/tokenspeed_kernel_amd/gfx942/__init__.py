"""Kernels for CDNA3 (gfx942: MI300X / MI325X): plain functions on torch tensors, callable without selection."""
