"""Pipeline modes: when training may start, how far generation may run ahead, how weights move.

Each mode is a controller class registered with its traits (:data:`MODES`, one entry per
mode, by :func:`~policies.modes.base.register_mode` on the class); the builder
(:mod:`policies.build`) turns a spec into the controller that both the simulator and the
live runtime execute.

Glossary (the words the controllers, records and metrics use):

* **step** — one optimizer step: the trainer updates the weights from ``batch_size``
  samples. Steps count from 0; ``run.iterations`` is the number of steps in a run.
* **version** — the weights after ``v`` optimizer steps (version 0: the initial weights);
  step ``s`` produces version ``s + 1``. A sample records the version it started and
  ended generating with (``version_start``, ``version_end``) and the step that trained
  it (``train_step`` = ``version_trained``); its lag (staleness) is
  ``version_trained − version_start``, at most the mode's ``max_lag``.
* **iteration** — the ``batch_size`` samples the prompt source hands out for one index
  (``PromptSource.batch(i)``): ``batch_size / group_size`` prompts, each ``group_size``
  times (a **group**, trained together in one step for GRPO's group-mean advantage). In
  the wave modes step ``i`` trains exactly iteration ``i``; in ``pipeline`` a group is
  trained by the first step with room for it before its lag deadline.
* **wave** — what a wave controller generates at once and waits for: one iteration in
  the five wave modes, ``steps_per_generation`` iterations in ``conventional``. A wave
  starts once the previous one is fully generated and every instance holds recent
  enough weights; ``pipeline`` has no waves (generation never stops for training).
"""

from __future__ import annotations

from policies.modes.base import (
    DEFAULT_MAX_LAG,
    MODES,
    Controller,
    ControllerConfig,
    ModeTraits,
    register_mode,
)
from policies.modes.conventional import ConventionalController
from policies.modes.pipeline import PipelineController
from policies.modes.wave import WaveController

__all__ = [
    "DEFAULT_MAX_LAG",
    "MODES",
    "Controller",
    "ControllerConfig",
    "ConventionalController",
    "ModeTraits",
    "PipelineController",
    "WaveController",
    "register_mode",
]
