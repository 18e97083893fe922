"""A worker's side of SIGHUP: notice that the supervisor reloaded the configuration.

The supervisor writes the reloaded settings to a file and bumps `config_generation` in the
control block; a worker compares that word with the last one it saw (a memory read, no
system call) once per loop and reads the file when it changed.
"""

from __future__ import annotations

import logging
import pickle

from mpbroker.config import Config
from mpbroker.shm import ControlBlock

from ._layout import WorkerSpec, reloaded_config

__all__ = ["ConfigWatch"]

log = logging.getLogger("mpbroker.worker")


class ConfigWatch:
    def __init__(self, control: ControlBlock, spec: WorkerSpec) -> None:
        self.control = control
        self.path = reloaded_config(spec.config, spec.layout.instance)
        # A worker (re)started after a reload got the reloaded settings in its spec.
        self.seen = control.config_generation

    def poll(self) -> Config | None:
        """The reloaded configuration, once per reload; None when nothing changed."""
        generation = self.control.config_generation
        if generation == self.seen:
            return None
        self.seen = generation
        try:
            config = pickle.loads(self.path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as exc:
            log.error("cannot read the reloaded configuration %s: %s", self.path, exc)
            return None
        if not isinstance(config, Config):
            log.error("%s does not hold a configuration", self.path)
            return None
        return config
