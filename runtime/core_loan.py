"""The generation cores lent to the trainer while no request runs on any server.

The launcher splits the host between the engines and the trainer (``runtime.procs``).
Whenever no request runs on any server — `disagg-sync` training its batch, a wave mode
waiting for its step, the backlog a `pipeline` run trains at its end — the generation
cores idle while the trainer runs one thread on its own core. With a loan the trainer then
runs one torch thread per core of the host, on every core, and goes back to its own cores
and threads once a request is sent: two threads trained a micro-batch of eight 128-token
answers in 70-87 ms against 127-149 on one (the tiny model, compiled).

The flag is one byte of shared memory: the actor sets it as requests go out and come back
(``Recorder.on_generation_idle``), the trainer child reads it before each micro-batch, so
a micro-batch already running keeps its threads (at most one, 10-150 ms here, shares the
cores with generation). A compiled trainer compiles its kernels for each thread count, so
:meth:`CoreLoan.warm` repeats the warm-up under the lent threads before the run's clock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from multiprocessing.context import BaseContext


class CoreLoan:
    """Made by the launcher, handed to the trainer child (pickled with its arguments); the
    parent calls :meth:`generation_idle`, the child :meth:`apply`."""

    def __init__(self, own: list[int], every: list[int], ctx: BaseContext) -> None:
        if not set(own) < set(every):
            raise ValueError(f"a core loan needs more cores than the trainer's {own}: {every}")
        self.own, self.every = sorted(own), sorted(every)
        self._flag = ctx.Value("b", 0, lock=False)  # 1: no request runs on any server
        self._lent = False  # the child's state: running on every core
        self._own_threads = 0  # the child's torch threads on its own cores

    def generation_idle(self, idle: bool) -> None:
        """Parent: whether any request runs on a server."""
        self._flag.value = 1 if idle else 0

    def apply(self) -> None:
        """Child: take every core while generation idles, give them back when it does not."""
        self._use(bool(self._flag.value))

    def warm(self, warm_up: Callable[[], None]) -> None:
        """Child: run ``warm_up`` again on the lent cores and threads, then go back."""
        self._use(True)
        try:
            warm_up()
        finally:
            self._use(False)

    def _use(self, lent: bool) -> None:
        import torch

        if lent == self._lent:
            return
        if not self._own_threads:
            self._own_threads = torch.get_num_threads()
        cores = set(self.every if lent else self.own)
        for task in os.listdir("/proc/self/task"):  # every thread, torch's pool included
            try:
                os.sched_setaffinity(int(task), cores)
            except OSError:  # a thread that has just ended
                continue
        torch.set_num_threads(len(self.every) if lent else self._own_threads)
        self._lent = lent
