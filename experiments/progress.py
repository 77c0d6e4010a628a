"""Progress displays of the CLI's long commands (rich, on stderr).

:class:`RunProgress` shows one bar over the optimizer steps of one or more runs, with the
samples trained so far, the last step's reward and lag, and, as its description, what is
happening now: the latest INFO message of tandem's loggers (starting a server, waiting
for the engine, resuming, which case or round runs), so the 35 s of an engine start are
not silent. Its :meth:`RunProgress.on_step` is an ``on_step`` callback of ``Simulation.run``
and ``run_live``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from policies.logs import is_tandem
from policies.tracking import StepUpdate

STATUS_WIDTH = 60
PLAIN_EVERY_S = 30.0  # without a terminal: a progress line at most this often
QUIET_LOGGERS = ("experiments.tracking",)  # its per-step lines are the bar's own fields


class StatusHandler(logging.Handler):
    """Hands each INFO message of tandem's loggers to ``show``."""

    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._show = show

    def emit(self, record: logging.LogRecord) -> None:
        if is_tandem(record) and not record.name.startswith(QUIET_LOGGERS):
            self._show(record.getMessage())


def step_fields(samples: int, update: StepUpdate) -> str:
    """``N samples · reward R · lag L`` after ``update`` (the parts that are known)."""
    parts = [f"{samples} samples"]
    stats = update.stats
    rewards = [s.reward for s in update.samples if s.reward is not None]
    reward = stats.mean_reward if stats.mean_reward is not None else None
    if reward is None and rewards:
        reward = sum(rewards) / len(rewards)
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    stale = [s.staleness for s in update.samples if s.staleness is not None]
    lag = stats.mean_lag if stats.mean_lag is not None else None
    if lag is None and stale:
        lag = sum(stale) / len(stale)
    if lag is not None:
        parts.append(f"lag {lag:.2f}")
    return " · ".join(parts)


class RunProgress:
    """A bar over ``total`` steps (None: unknown), ``completed`` of them done before it
    starts (a resumed run's), which trained ``completed_samples``; a context manager.
    Without a terminal (CI, nohup) rich draws no bar until the end, and then cut to 80
    columns (``lag 0.…``), so no bar is drawn: a plain line with the same fields is printed
    instead, at most every ``plain_every_s`` seconds of ``clock``, and once more, whole, at
    the end."""

    def __init__(
        self,
        console: Console,
        label: str,
        total: int | None = None,
        transient: bool = False,
        completed: int = 0,
        completed_samples: int = 0,
        plain_every_s: float = PLAIN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.label = label
        self.total = total
        self.transient = transient  # the bar disappears when done
        self.num_samples = completed_samples  # over the whole run, resumed or not
        self._bar: Progress | None = None
        self._task = None
        self._handler = StatusHandler(self.status)
        self._plain_every_s = plain_every_s
        self._clock = clock
        self._start_s = self._last_plain_s = 0.0
        self._done = completed
        self._fields = ""
        self._now = ""
        self._last_plain_text = ""

    def __enter__(self) -> RunProgress:
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=self.transient,
            disable=not self.console.is_terminal,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            self.label, total=self.total, completed=self._done, stats=""
        )
        self._start_s = self._last_plain_s = self._clock()
        logging.getLogger().addHandler(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self._handler)
        if self._bar is not None:
            self._bar.stop()
            if not self.transient:
                self._plain_line(last=True)

    def status(self, text: str) -> None:
        """Show ``text`` as what is happening now."""
        if self._bar is not None:
            text = text if len(text) <= STATUS_WIDTH else text[: STATUS_WIDTH - 1] + "…"
            self._bar.update(self._task, description=f"{self.label} · {text}")
            self._now = text
            self._plain_line()

    def advance(self, text: str | None = None) -> None:
        """One unit of work done (a measurement, a build step)."""
        if text is not None:
            self.status(text)
        if self._bar is not None:
            self._bar.advance(self._task)
            self._done += 1

    def set_total(self, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def on_step(self, update: StepUpdate) -> None:
        """An ``on_step`` callback: one step done; samples, reward and lag shown."""
        self.num_samples += update.stats.num_samples
        if self._bar is not None:
            self._fields = step_fields(self.num_samples, update)
            self._bar.update(self._task, advance=1, stats=self._fields)
            self._done += 1
            self._plain_line()

    def _plain_line(self, last: bool = False) -> None:
        """Without a terminal, what the bar shows as one line, if it is time for one (or
        the ``last``)."""
        now_s = self._clock()
        if self.console.is_terminal or (
            not last and now_s - self._last_plain_s < self._plain_every_s
        ):
            return
        steps = f"{self._done}/{self.total}" if self.total is not None else str(self._done)
        text = " · ".join(p for p in [self.label, f"{steps} steps", self._fields, self._now] if p)
        if last and text == self._last_plain_text:  # said already
            return
        self._last_plain_s, self._last_plain_text = now_s, text
        line = f"{text} · {now_s - self._start_s:.0f} s"
        self.console.print(line, highlight=False, soft_wrap=True, markup=False)


def chain(*callbacks: Callable[[StepUpdate], None] | None) -> Callable[[StepUpdate], None]:
    """One ``on_step`` calling each given callback in turn."""
    given = [c for c in callbacks if c is not None]

    def on_step(update: StepUpdate) -> None:
        for callback in given:
            callback(update)

    return on_step
