"""``RankerPredictor``: the learned ``LengthPredictor``, refreshed online without blocking.

StreamRL refreshes its ranker on recent generations. Here ``update`` appends the new
completions to the observation table at once (so the history features of the next
requests see them) and starts a refit on the most recent ``refresh_rows`` observations
in a background thread; ``predict`` keeps answering with the current model and swaps in
the new one, atomically under a lock, only when the refit has finished. At most one
refit runs at a time; an ``update`` that arrives during one is folded into the next.
``record`` adds completions to the history only (the simulator records every sample as
it finishes, so a request's history holds exactly the samples finished before it was
dispatched); they join the table when it is next read, not one ``concat`` a sample.

``save`` writes one versioned pickle (format name, format version, feature spec, model,
observations) atomically; ``load`` refuses a file of another format or version. Load
only files you trust: it is a pickle.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from policies.records import Request
from policies.results import write_atomic
from ranker.features import FEATURE_VERSION, FeatureSpec
from ranker.model import FittedModel, train
from ranker.traces import TRACE_COLUMNS, requests_frame, trace_frame

FILE_FORMAT = "tandem-ranker"
FILE_VERSION = 1


class RankerPredictor:
    """Output-length ranker behind the ``length_predictor: ranker`` seam (tokens out)."""

    def __init__(
        self,
        model: str = "hgb",
        spec: FeatureSpec | None = None,
        max_history_rows: int = 500_000,
        refresh_rows: int = 50_000,
    ) -> None:
        self.model_name = model
        self.spec = spec if spec is not None else FeatureSpec()
        self.max_history_rows = max_history_rows  # observations kept for history features
        self.refresh_rows = refresh_rows  # most recent observations an online refit uses
        self._lock = threading.Lock()
        self._fitted: FittedModel | None = None
        self._observations = pd.DataFrame(columns=TRACE_COLUMNS)
        self._recorded: list[tuple[Request, int]] = []  # recorded, not yet in the table
        self._refresh: threading.Thread | None = None
        self._pending = False
        self.num_refreshes = 0
        self.source = "unfitted"  # how it was obtained, in words (run.log, metrics.json)
        self.refit_online = True  # False: ``update`` only records (a model loaded for a run)

    # -- LengthPredictor ----------------------------------------------------------------

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        self.fit_trace(trace_frame(requests, output_tokens))

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        """Predicted tokens; None for every request until a first fit or refresh has
        landed (a live run's ranker starts empty and learns from its own completions)."""
        if self._fitted is None:
            return [None for _ in requests]
        return [float(x) for x in self.predict_tokens(requests_frame(requests))]

    # -- frames -------------------------------------------------------------------------

    def fit_trace(self, trace: pd.DataFrame) -> None:
        """Fit on a trace (blocking); the trace also becomes the observation table."""
        fitted = train(self.model_name, self.spec, trace)
        with self._lock:
            self._fitted = fitted
            self._observations = trace[TRACE_COLUMNS].reset_index(drop=True)
            self._recorded = []

    def predict_tokens(
        self, requests: pd.DataFrame, extra_observations: pd.DataFrame | None = None
    ) -> np.ndarray:
        """Predicted output tokens of a request frame (history: earlier iterations only)."""
        with self._lock:
            self._join_recorded()
            fitted, observations = self._fitted, self._observations
        if fitted is None:
            raise ValueError("the ranker is not fitted: call fit (or load a saved one) first")
        if extra_observations is not None and not extra_observations.empty:
            observations = pd.concat([observations, extra_observations[TRACE_COLUMNS]])
        return np.exp(fitted.predict_log(requests, observations))

    @property
    def fitted(self) -> FittedModel | None:
        return self._fitted

    @property
    def observations(self) -> pd.DataFrame:
        with self._lock:
            self._join_recorded()
            return self._observations

    def run_copy(self) -> RankerPredictor:
        """The same model, not refitted, with an empty history: for one more run of a
        fit made once (each run records its own finished samples)."""
        copy = RankerPredictor(self.model_name, self.spec, self.max_history_rows, self.refresh_rows)
        copy._fitted = self._fitted
        copy._observations = self._observations.iloc[:0]
        copy.source, copy.refit_online = self.source, False
        return copy

    # -- online refresh -----------------------------------------------------------------

    def replace_history(self, trace: pd.DataFrame) -> None:
        """Make ``trace`` the whole observation table (the model stays): a model fitted on
        one trace and used in a run looks up the history of the run's own prompts."""
        kept = trace[TRACE_COLUMNS].iloc[-self.max_history_rows :].reset_index(drop=True)
        with self._lock:
            self._observations = kept
            self._recorded = []

    def record(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        """Add finished samples to the history only (no refit); cheap enough to call for
        every sample (``policies.protocols.HistoryLengthPredictor``)."""
        if len(requests) != len(output_tokens):
            raise ValueError(f"{len(requests)} requests but {len(output_tokens)} output lengths")
        with self._lock:
            self._recorded.extend(zip(requests, output_tokens, strict=True))

    def _join_recorded(self) -> None:
        """Move the recorded samples into the table (the lock held)."""
        if self._recorded:
            requests, tokens = zip(*self._recorded, strict=True)
            self._recorded = []
            self._append(trace_frame(requests, tokens))

    def update_history(self, trace: pd.DataFrame) -> None:
        """Add observations to the history table only (no refit)."""
        with self._lock:
            self._join_recorded()
            self._append(trace)

    def _append(self, trace: pd.DataFrame) -> None:
        merged = pd.concat([self._observations, trace[TRACE_COLUMNS]], ignore_index=True)
        self._observations = merged.iloc[-self.max_history_rows :].reset_index(drop=True)

    def update(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        """Record completions now; refit on recent ones in the background (non-blocking),
        unless ``refit_online`` is off."""
        new = trace_frame(requests, output_tokens)
        with self._lock:
            self._join_recorded()
            self._append(new)
            if not self.refit_online:
                return
            if self._refresh is not None and self._refresh.is_alive():
                self._pending = True
                return
            self._refresh = threading.Thread(target=self._refit_loop, daemon=True)
            self._refresh.start()

    @property
    def refreshing(self) -> bool:
        refresh = self._refresh
        return refresh is not None and refresh.is_alive()

    def wait_for_refresh(self, timeout_s: float | None = None) -> None:
        refresh = self._refresh
        if refresh is not None:
            refresh.join(timeout_s)

    def _refit_loop(self) -> None:
        while True:
            with self._lock:
                self._join_recorded()
                recent = self._observations.iloc[-self.refresh_rows :]
                self._pending = False
            fitted = self._train(recent)  # the slow part, outside the lock
            with self._lock:
                self._fitted = fitted
                self.num_refreshes += 1
                if not self._pending:
                    return

    def _train(self, trace: pd.DataFrame) -> FittedModel:
        return train(self.model_name, self.spec, trace)

    # -- files --------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        with self._lock:
            self._join_recorded()
            payload = {
                "format": FILE_FORMAT,
                "format_version": FILE_VERSION,
                "feature_spec": asdict(self.spec),
                "model_name": self.model_name,
                "max_history_rows": self.max_history_rows,
                "refresh_rows": self.refresh_rows,
                "fitted": self._fitted,
                "observations": self._observations,
            }
        write_atomic(Path(path), pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))

    @classmethod
    def load(cls, path: Path) -> RankerPredictor:
        try:
            payload = pickle.loads(Path(path).read_bytes())
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
            raise ValueError(f"{path} is not a tandem ranker file ({err})") from None
        except (AttributeError, ImportError, IndexError) as err:  # pickled other classes
            raise ValueError(f"{path} is not a tandem ranker file ({err!r})") from None
        if not isinstance(payload, dict) or payload.get("format") != FILE_FORMAT:
            raise ValueError(f"{path} is not a tandem ranker file")
        if payload.get("format_version") != FILE_VERSION:
            raise ValueError(
                f"{path} is ranker file version {payload.get('format_version')}; "
                f"this tandem reads version {FILE_VERSION}: refit it"
            )
        try:
            return cls._from_payload(payload, path)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a tandem ranker file (no or bad {err})") from None

    @classmethod
    def _from_payload(cls, payload: dict, path: Path) -> RankerPredictor:
        spec = FeatureSpec(**payload["feature_spec"])
        if spec.version != FEATURE_VERSION:
            raise ValueError(f"{path} uses feature version {spec.version}, not {FEATURE_VERSION}")
        ranker = cls(
            payload["model_name"], spec, payload["max_history_rows"], payload["refresh_rows"]
        )
        ranker._fitted = payload["fitted"]
        ranker._observations = payload["observations"]
        return ranker
