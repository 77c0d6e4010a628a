"""Workloads: prompts and their (hidden) output lengths.

Modelling assumptions:

* A dataset of ``num_prompts`` prompts is walked in order, ``batch_size / group_size``
  prompts per iteration, wrapping around each epoch.
* Lengths come from a Gaussian copula: a sample's latent ``z`` mixes the prompt's own
  latent (share ``prompt_correlation`` of the variance) with per-sample noise; a
  prompt's latent in epoch e keeps correlation ``epoch_correlation`` with its base, so
  the same prompt stays long across epochs as in real RL. ``z`` is mapped through the
  target distribution's quantile function, so the marginal is exactly that distribution.
* ``histogram`` is StreamRL's Fig. 7 histogram (20K max) scaled to the max length
  (the 5K and 10K datasets are the same lengths × 0.25 and × 0.5); within a bin lengths
  are uniform. ``final_max_output_tokens`` grows the max linearly over the iterations.
* ``trace`` replays (prompt_id, prompt_tokens, output_tokens) rows; a prompt with several
  rows cycles through them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtr

from policies.records import Request
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.token_counts import check_token_counts, read_length_table
from policies.workload_section import MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS
from sim.tables import data_path

HISTOGRAM_MAX_TOKENS = 20000


class LengthDistribution:
    """Quantile function of the output-length distribution at a given max length."""

    def __init__(self, spec: RunSpec) -> None:
        w = spec.workload
        self.kind = w.kind
        self._w = w
        if w.kind == "histogram":
            hist = pd.read_csv(data_path("output_length_hist.csv"))
            mass = hist["prob_mass_normalized"].to_numpy(float)
            self._lo = hist["bin_lo"].to_numpy(float)
            self._hi = hist["bin_hi"].to_numpy(float)
            self._cdf = np.concatenate([[0.0], np.cumsum(mass / mass.sum())])

    def tokens(self, z: np.ndarray, max_tokens: int) -> np.ndarray:
        """Map standard-normal latents to output lengths in [1, max_tokens]."""
        u = np.clip(ndtr(z), 1e-12, 1 - 1e-12)
        if self.kind == "histogram":
            raw = self._histogram_quantile(u) * max_tokens / HISTOGRAM_MAX_TOKENS
        elif self.kind == "lognormal":
            raw = self._w.lognormal_median_tokens * np.exp(self._w.lognormal_sigma * z)
        else:  # pareto
            raw = self._w.pareto_min_tokens * (1 - u) ** (-1 / self._w.pareto_alpha)
        return np.clip(np.round(raw), 1, max_tokens).astype(int)

    def _histogram_quantile(self, u: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(self._cdf, u, side="right") - 1, 0, len(self._lo) - 1)
        frac = (u - self._cdf[i]) / (self._cdf[i + 1] - self._cdf[i])
        return self._lo[i] + frac * (self._hi[i] - self._lo[i])


class Workload:
    """The simulator's prompt source (``PromptSource``) and the truth about lengths."""

    def __init__(self, spec: RunSpec, rngs: RngStreams) -> None:
        self.spec = spec
        self._rngs = rngs
        w = spec.workload
        self._per_iter = spec.prompts_per_iteration
        self._group = spec.algorithm.group_size
        self._trace, trace_prompt_tokens = (
            _load_trace(Path(w.trace_path)) if w.kind == "trace" else (None, None)
        )
        self._num_prompts = len(self._trace) if self._trace is not None else w.num_prompts
        base = rngs.get("workload-prompts")
        self._prompt_z = base.standard_normal(self._num_prompts)
        sigma = w.prompt_tokens_sigma
        prompt_tokens = w.prompt_tokens_median * np.exp(
            sigma * base.standard_normal(self._num_prompts)
        )
        bounds = (MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS)  # the spec keeps the median inside
        self._prompt_tokens = np.clip(np.round(prompt_tokens), *bounds).astype(int)
        if trace_prompt_tokens is not None:
            self._prompt_tokens = trace_prompt_tokens
        self._dist = None if self._trace is not None else LengthDistribution(spec)
        self._epoch_z: dict[int, np.ndarray] = {}
        self._truth: dict[int, int] = {}

    def max_tokens_at(self, iteration: int) -> int:
        w, n = self.spec.workload, self.spec.run.iterations
        if w.final_max_output_tokens is None or n <= 1:
            return w.max_output_tokens
        frac = min(1.0, iteration / (n - 1))
        return int(
            round(w.max_output_tokens + frac * (w.final_max_output_tokens - w.max_output_tokens))
        )

    def batch(self, iteration: int) -> list[Request]:
        first = iteration * self._per_iter
        slots = np.arange(first, first + self._per_iter)
        prompt_ids = slots % self._num_prompts
        epochs = slots // self._num_prompts
        lengths = self._lengths(iteration, prompt_ids, epochs)
        max_tokens = self.max_tokens_at(iteration)
        out = []
        for j, (pid, length) in enumerate(zip(np.repeat(prompt_ids, self._group), lengths)):
            sample_id = first * self._group + j
            self._truth[sample_id] = int(length)
            out.append(
                Request(
                    sample_id=sample_id,
                    prompt_id=int(pid),
                    group_id=first + j // self._group,
                    iteration=iteration,
                    prompt_tokens=int(self._prompt_tokens[pid]),
                    max_tokens=max_tokens,
                )
            )
        return out

    def true_output_tokens(self, request: Request) -> int:
        return self._truth[request.sample_id]

    def _lengths(self, iteration: int, prompt_ids: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        if self._trace is not None:
            return self._trace_lengths(prompt_ids, epochs, self.max_tokens_at(iteration))
        w = self.spec.workload
        z_prompt = np.array([self._epoch_latent(int(e))[p] for p, e in zip(prompt_ids, epochs)])
        z_prompt = np.repeat(z_prompt, self._group)
        noise = self._rngs.get(f"workload-samples-{iteration}").standard_normal(len(z_prompt))
        z = np.sqrt(w.prompt_correlation) * z_prompt + np.sqrt(1 - w.prompt_correlation) * noise
        assert self._dist is not None
        return self._dist.tokens(z, self.max_tokens_at(iteration))

    def _epoch_latent(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_z:
            rho = self.spec.workload.epoch_correlation
            noise = self._rngs.get(f"workload-epoch-{epoch}").standard_normal(self._num_prompts)
            self._epoch_z[epoch] = np.sqrt(rho) * self._prompt_z + np.sqrt(1 - rho) * noise
        return self._epoch_z[epoch]

    def _trace_lengths(
        self, prompt_ids: np.ndarray, epochs: np.ndarray, max_tokens: int
    ) -> np.ndarray:
        assert self._trace is not None
        out = []
        for p, e in zip(prompt_ids, epochs):
            row = self._trace[int(p)]
            for g in range(self._group):
                out.append(row[(int(e) * self._group + g) % len(row)])
        return np.minimum(np.asarray(out, int), max_tokens)

    def sample_lengths(self, num_samples: int, iteration: int = 0) -> np.ndarray:
        """Independent draws of output lengths (for calibration and stage-time models),
        capped as the run caps them (a trace's too: the allocator sized the stages by the
        uncapped lengths while the run generated the capped ones)."""
        if self._trace is not None:
            flat = np.concatenate([np.asarray(r, int) for r in self._trace])
            return np.minimum(np.resize(flat, num_samples), self.max_tokens_at(iteration))
        z = self._rngs.get("workload-calibration").standard_normal(num_samples)
        assert self._dist is not None
        return self._dist.tokens(z, self.max_tokens_at(iteration))

    @property
    def mean_prompt_tokens(self) -> float:
        return float(np.mean(self._prompt_tokens))

    @property
    def longest_sequence_tokens(self) -> int:
        """The longest prompt plus the largest ``max_tokens`` any iteration asks for: what
        an instance's KV cache must hold (vLLM refuses a ``max_model_len`` above it)."""
        last = max(0, self.spec.run.iterations - 1)
        return int(self._prompt_tokens.max()) + max(self.max_tokens_at(0), self.max_tokens_at(last))


def _load_trace(path: Path) -> tuple[list[list[int]], np.ndarray | None]:
    """Rows of (prompt_id, prompt_tokens, output_tokens) grouped by prompt, in id order."""
    if not path.exists():
        raise ValueError(f"workload.trace_path: {path} does not exist")
    frame = read_length_table(path, f"workload.trace_path: {path}")
    missing = {"prompt_id", "output_tokens"} - set(frame.columns)
    if missing:
        raise ValueError(
            f"workload.trace_path: {path} lacks column(s) {', '.join(sorted(missing))}"
        )
    if frame.empty:
        raise ValueError(f"workload.trace_path: {path} has no rows")
    check_token_counts(frame, "output_tokens", f"workload.trace_path: {path}")
    if (blank := frame["prompt_id"].isna()).any():  # groupby would drop the row unsaid
        row = int(blank.to_numpy().argmax()) + 1
        raise ValueError(f"workload.trace_path: {path} data row {row}: prompt_id is empty")
    grouped = frame.groupby("prompt_id", sort=True)
    lengths = [list(map(int, g)) for _, g in grouped["output_tokens"]]
    prompt_tokens = None
    if "prompt_tokens" in frame.columns:
        prompt_tokens = grouped["prompt_tokens"].first().to_numpy(int)
    return lengths, prompt_tokens
