"""Wrappers of AMD's AITER library (registered only when ``aiter`` is installed).

Importing these modules does not import ``aiter``; each wrapper imports it on its
first call. The wrappers adapt AITER's calling conventions to the public ops'
arguments and refuse (ValueError) any argument value they cannot honour.
"""
