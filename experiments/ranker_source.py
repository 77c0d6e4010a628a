"""Where the ranker behind ``policies.length_predictor: ranker`` comes from.

* ``policies.ranker_path`` set — a model file of ``tandem ranker fit``, checked
  (:func:`load_ranker_file`) and used by the sim and by a live run alike. The file gives
  the *model*, never refitted in the run; the history features look up the run's own
  prompts.
* unset, live — an empty ranker that learns from the run's completions.
* unset, sim, a drawn workload (histogram, lognormal, pareto) — fitted on *held-out
  draws*: the first two epochs of a second workload of the same spec whose every stream
  is redrawn under the prefix ``ranker-fit/`` (other prompt latents, other lengths), so
  the model never sees a length the run simulates.
* unset, sim, a ``trace`` workload — the trace is all the data there is, so the ranker
  is *cross-fitted*: the prompts are split in two halves (named stream ``ranker-folds``),
  one model is fitted on the first two epochs of each half, and each half's requests are
  ranked by the model of the other half.

Every ranker starts a run with an empty history. A live run records its completions as
they come (``update``); the simulator records each sample as it finishes (``record``,
``sim.simulator``), so a request's history holds the samples of its prompt finished
before it was dispatched, in earlier iterations. (Until 2026-12-06 a sim ranker's
history was the run's whole trace up front: a request of iteration ``i`` also saw the
samples of earlier iterations still running, when an asynchronous mode overlaps
iterations and an epoch is a single iteration — ``pipeline``, or ``overlap_waves``.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from policies.records import Request
from policies.rng import RngStreams
from policies.spec import RunSpec
from ranker.online import RankerPredictor
from ranker.traces import requests_frame, trace_frame

log = logging.getLogger(__name__)

WARMUP_EPOCHS = 2
FIT_STREAMS = "ranker-fit"  # prefix of the held-out draws' streams
FOLD_STREAM = "ranker-folds"


def iterations_per_epoch(spec: RunSpec) -> int:
    return max(1, math.ceil(spec.workload.num_prompts / spec.prompts_per_iteration))


def workload_trace(
    spec: RunSpec, num_iterations: int, rngs: RngStreams | None = None
) -> pd.DataFrame:
    """The sim workload's (request, true length) rows of iterations ``[0, num_iterations)``
    (``rngs``: the run's own streams unless given)."""
    from sim.workload import Workload

    workload = Workload(spec, rngs if rngs is not None else RngStreams(spec.run.seed))
    frames = []
    for iteration in range(num_iterations):
        batch = workload.batch(iteration)
        frames.append(trace_frame(batch, [workload.true_output_tokens(r) for r in batch]))
    return pd.concat(frames, ignore_index=True)


def ranker_for(spec: RunSpec, live: bool = False) -> RankerPredictor | CrossFitRanker | None:
    """The learned ranker behind ``policies.length_predictor: ranker`` (module doc), or None
    when the spec uses another predictor. Every entry point builds it here (``tandem run``,
    ``sweep``, ``fidelity``, ``bench``, the reproductions): ``live``, for
    ``run_live(..., ranker)``; otherwise for ``Simulation(spec, ranker=)``."""
    if spec.policies.length_predictor != "ranker":
        return None
    path = spec.policies.ranker_path
    if path is not None:
        ranker = load_ranker_file(path, live)
        ranker.replace_history(ranker.observations.iloc[:0])  # the file's: other prompts
        ranker.refit_online = False  # the file's model throughout
        ranker.source = f"file {path} ({ranker.model_name}, not refitted in the run)"
        log.info("ranker: %s; history: the run's own finished samples", ranker.source)
        return ranker
    if live:
        ranker = RankerPredictor()
        ranker.source = "online: learns from the run's completions"
        return ranker
    return sim_ranker(spec)


def sim_ranker(
    spec: RunSpec, fit_iterations: int | None = None, model: str = "hgb"
) -> RankerPredictor | CrossFitRanker:
    """The built-in ranker of a sim run of ``spec`` (module doc): fitted on
    ``fit_iterations`` iterations (default: two epochs) it does not simulate."""
    if fit_iterations is None:
        fit_iterations = WARMUP_EPOCHS * iterations_per_epoch(spec)
    if spec.workload.kind == "trace":
        run_trace = workload_trace(spec, spec.run.iterations)
        return CrossFitRanker.fit_halves(spec, fit_iterations, model, run_trace)
    held_out = workload_trace(spec, fit_iterations, RngStreams(spec.run.seed).child(FIT_STREAMS))
    ranker = RankerPredictor(model)
    ranker.fit_trace(held_out)
    ranker.replace_history(held_out.iloc[:0])  # the run records its own finished samples
    ranker.refit_online = False
    ranker.source = (
        f"in-run fit: {model} on held-out draws of the workload (streams {FIT_STREAMS}/…, "
        f"{fit_iterations} iterations, {len(held_out)} samples the run does not simulate)"
    )
    log.info("ranker: %s; history: the run's own finished samples", ranker.source)
    return ranker


class CrossFitRanker:
    """Two rankers over a replayed trace, each fitted on half of the prompts and ranking
    the requests of the other half (a ``LengthPredictor``; tokens out)."""

    def __init__(self, models: tuple[RankerPredictor, RankerPredictor], fold_of: dict[int, int]):
        self.models = models
        self.fold_of = fold_of  # prompt id -> 0 or 1: the half whose model it trained
        self.source = "cross-fit"

    @classmethod
    def fit_halves(
        cls, spec: RunSpec, fit_iterations: int, model: str, run_trace: pd.DataFrame
    ) -> CrossFitRanker:
        ids = np.unique(run_trace["prompt_id"].to_numpy())
        if len(ids) < 2:
            raise ValueError(
                "length_predictor ranker on a trace workload of one prompt: the built-in "
                "ranker is cross-fitted on half the prompts each; fit one on another trace "
                "with `tandem ranker fit` and set policies.ranker_path"
            )
        order = RngStreams(spec.run.seed).get(FOLD_STREAM).permutation(ids)
        fold_of = {int(p): int(i >= len(order) // 2) for i, p in enumerate(order)}
        fit = run_trace[run_trace["iteration"] < fit_iterations]
        models = (RankerPredictor(model), RankerPredictor(model))
        cross = cls(models, fold_of)
        cross._fit(fit)
        for m in models:
            m.replace_history(run_trace.iloc[:0])  # the run records its finished samples
            m.refit_online = False
        cross.source = (
            f"in-run cross-fit: {model} on the trace's first {fit_iterations} iterations, two "
            f"halves of the prompts ({FOLD_STREAM}), each half ranked by the other's model"
        )
        log.info("ranker: %s; history: the run's own finished samples", cross.source)
        return cross

    def _folds(self, frame: pd.DataFrame) -> np.ndarray:
        ids = frame["prompt_id"].to_numpy(np.int64)
        return np.array([self.fold_of.get(int(p), int(p) % 2) for p in ids], dtype=np.int64)

    def _fit(self, trace: pd.DataFrame) -> None:
        folds = self._folds(trace)
        for fold, model in enumerate(self.models):
            model.fit_trace(trace[folds == fold].reset_index(drop=True))

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        self._fit(trace_frame(requests, output_tokens))

    def record(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        """Finished samples into both models' history (every prompt's, as live)."""
        for model in self.models:
            model.record(requests, output_tokens)

    def run_copy(self) -> CrossFitRanker:
        """The same two models with an empty history, for one more run."""
        copy = CrossFitRanker((self.models[0].run_copy(), self.models[1].run_copy()), self.fold_of)
        copy.source = self.source
        return copy

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        frame = requests_frame(requests)
        folds = self._folds(frame)
        out = np.zeros(len(frame))
        for fold in (0, 1):
            rows = folds == fold
            if rows.any():  # the other half's model: it never saw these prompts' lengths
                other = self.models[1 - fold]
                out[rows] = other.predict_tokens(frame[rows].reset_index(drop=True))
        return [float(x) for x in out]


def check_ranker_path(spec: RunSpec, live: bool, passed: set[str] | None = None) -> None:
    """Refuse a bad ``policies.ranker_path`` (:func:`load_ranker_file`) before a run starts
    (``live``: only live runs use it; a live run with a sim twin is checked for the sim).
    Every command calls it up front (:func:`experiments.runs.check_run` and the checks of
    ``fidelity``, ``bench`` and ``advise``). ``passed``: files that passed already (a
    sweep's points mostly share one; loading it takes ~0.1 s), to skip; this one joins."""
    path = spec.policies.ranker_path
    if spec.policies.length_predictor != "ranker" or path is None:
        return
    if passed is None or path not in passed:
        load_ranker_file(path, live)
    if passed is not None:
        passed.add(path)


def load_ranker_file(path: str | Path, live: bool) -> RankerPredictor:
    """The model file of ``policies.ranker_path``, checked: it exists, is a tandem ranker
    file with a fitted model, takes this tandem's features and (sim) no prompt text."""
    file = Path(path)
    key = "policies.ranker_path"
    if not file.is_file():
        what = "is not a file" if file.exists() else "does not exist"
        raise ValueError(f"{key}: {file} {what} (give a model file of `tandem ranker fit`)")
    try:
        ranker = RankerPredictor.load(file)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
    if ranker.fitted is None:
        raise ValueError(f"{key}: {file} holds no fitted model (refit it with `tandem ranker fit`)")
    _check_features(ranker, file, key)
    if not live and ranker.spec.use_text and ranker.observations["prompt"].notna().any():
        raise ValueError(
            f"{key}: {file} was fitted on prompts with text, and the simulator's prompts (of a "
            "sim run, or of the sim twin of a live one) have none: its text features would all "
            "be 0, values it never saw. Refit it without them: tandem ranker fit TRACE --out "
            "MODEL --no-text"
        )
    return ranker


def _check_features(ranker: RankerPredictor, file: Path, key: str) -> None:
    """Predict one request: a model fitted on other features than this tandem computes
    (another build of ``ranker/``) fails here, not in the middle of a run."""
    probe = requests_frame([Request(0, 0, 0, 0, prompt_tokens=1, max_tokens=1)])
    try:
        ranker.predict_tokens(probe)
    except (ValueError, AttributeError, KeyError, IndexError) as err:
        raise ValueError(
            f"{key}: {file}: its {ranker.model_name} model does not take the features this "
            f"tandem computes ({err}); refit it with `tandem ranker fit`"
        ) from None
