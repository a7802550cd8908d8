"""Kernels for CDNA4 (gfx950: MI350X / MI355X): plain functions on torch tensors, callable without selection."""
