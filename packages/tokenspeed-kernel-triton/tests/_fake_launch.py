"""A stand-in for a compiled kernel's C launcher, shared by the launch tests (conftest puts the folder on
``sys.path``): it logs the arguments of every launch instead of launching."""

from __future__ import annotations


class FakeLauncher:
    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = False

    def __init__(self, log: list) -> None:
        self.log = log

    def launch(self, *a) -> None:
        self.log.append(("hit", a))
