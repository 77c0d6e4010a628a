"""Traces: (request, output length) tables the ranker learns from and is scored on.

A trace is a ``pandas.DataFrame`` with the request columns of :mod:`ranker.features`
plus ``output_tokens``. It is read from a ``samples.parquet`` of any tandem run (sim or
live) or from a CSV/parquet of ``prompt, output_tokens`` pairs, where a prompt that
comes back again counts as a later iteration (the next epoch). A CSV's prompt is text as
written (``NA`` too); where the text numbers the prompts, a blank or missing one is refused.
Ids and iterations must be whole numbers >= 0, token counts whole numbers >= 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from policies.records import Request
from policies.token_counts import check_token_counts, check_whole_numbers, read_length_table
from ranker.features import REQUEST_COLUMNS

TRACE_COLUMNS = [*REQUEST_COLUMNS, "output_tokens"]
# columns that count tokens: each must hold whole numbers >= 1 (``int64`` of a blank is
# -2^63, with only a numpy warning)
LENGTH_COLUMNS = ("output_tokens", "prompt_tokens", "max_tokens")
# columns that number things: whole numbers >= 0
ID_COLUMNS = ("prompt_id", "iteration")


def requests_frame(requests: Sequence[Request]) -> pd.DataFrame:
    """The request frame of a list of :class:`Request`."""
    return pd.DataFrame(
        {
            "prompt_id": np.array([r.prompt_id for r in requests], dtype=np.int64),
            "iteration": np.array([r.iteration for r in requests], dtype=np.int64),
            "prompt_tokens": np.array([r.prompt_tokens for r in requests], dtype=np.int64),
            "max_tokens": np.array([r.max_tokens for r in requests], dtype=np.int64),
            "prompt": pd.Series([r.prompt for r in requests], dtype=object),
        }
    )


def trace_frame(requests: Sequence[Request], output_tokens: Sequence[int]) -> pd.DataFrame:
    if len(requests) != len(output_tokens):
        raise ValueError(
            f"{len(requests)} requests but {len(output_tokens)} output lengths: they must pair up"
        )
    frame = requests_frame(requests)
    frame["output_tokens"] = np.asarray(output_tokens, dtype=np.int64)
    return frame


def read_trace(path: Path) -> pd.DataFrame:
    """A trace from a samples file or a (prompt, output_tokens) table; see the module doc."""
    if not path.exists():
        raise ValueError(f"trace {path} does not exist")
    raw = read_length_table(path, f"trace {path}")
    if "output_tokens" not in raw.columns:
        raise ValueError(f"trace {path} lacks column output_tokens")
    if raw.empty:
        raise ValueError(f"trace {path} has no data rows")
    if "prompt_id" not in raw.columns:
        if "prompt" not in raw.columns:
            raise ValueError(f"trace {path} needs column prompt_id or prompt")
        check_prompts(raw, f"trace {path}")
        raw = _ids_from_text(raw)
    for column in ID_COLUMNS:
        if column in raw.columns:
            check_whole_numbers(raw, column, f"trace {path}")
    for column in LENGTH_COLUMNS:
        if column in raw.columns:
            check_token_counts(raw, column, f"trace {path}")
    return normalize(raw)


def check_prompts(raw: pd.DataFrame, where: str) -> None:
    """Refuse a blank or missing prompt where the text is what numbers the prompts (no
    ``prompt_id`` column): an empty text is no prompt to recognise again."""
    empty = np.flatnonzero([not (isinstance(p, str) and p) for p in raw["prompt"]])
    if len(empty):
        more = f" ({len(empty)} such rows)" if len(empty) > 1 else ""
        raise ValueError(
            f"{where} data row {empty[0] + 1}: prompt is empty (a trace without a prompt_id "
            f"column numbers its prompts by their text){more}"
        )


def _ids_from_text(raw: pd.DataFrame) -> pd.DataFrame:
    """Number prompts by text; the k-th occurrence of a prompt is iteration k."""
    out = raw.copy()
    out["prompt_id"] = pd.factorize(out["prompt"])[0]
    if "iteration" not in out.columns:
        out["iteration"] = out.groupby("prompt_id").cumcount()
    return out


def normalize(raw: pd.DataFrame) -> pd.DataFrame:
    """Fill the columns a trace may lack: iteration 0, prompt tokens = characters, no text."""
    out = pd.DataFrame(
        {
            "prompt_id": raw["prompt_id"].to_numpy(np.int64),
            "output_tokens": raw["output_tokens"].to_numpy(np.int64),
        }
    )
    out["iteration"] = raw["iteration"].to_numpy(np.int64) if "iteration" in raw else 0
    prompt = raw["prompt"].astype(object) if "prompt" in raw else pd.Series([None] * len(raw))
    out["prompt"] = np.array([p if isinstance(p, str) else None for p in prompt], dtype=object)
    if "prompt_tokens" in raw:
        out["prompt_tokens"] = raw["prompt_tokens"].to_numpy(np.int64)
    else:
        out["prompt_tokens"] = [len(p) if p else 1 for p in out["prompt"]]
    if "max_tokens" in raw:
        out["max_tokens"] = raw["max_tokens"].to_numpy(np.int64)
    else:
        out["max_tokens"] = int(out["output_tokens"].max()) if len(out) else 1
    return out[TRACE_COLUMNS].reset_index(drop=True)


def repeated_prompt_trace(
    prompts: Sequence[tuple[int, str, int]],
    num_epochs: int,
    group_size: int,
    max_tokens: int,
    rng: np.random.Generator,
    prompt_sigma: float = 0.1,
    sample_sigma: float = 0.15,
) -> pd.DataFrame:
    """A trace of ``(prompt_id, text, reference_tokens)`` prompts seen once per epoch.

    A policy model's lengths scatter around the reference answer's: each sample's length
    is the reference times ``exp(prompt_bias + noise)``, where a prompt keeps its bias
    (std ``prompt_sigma``) across epochs and the noise (std ``sample_sigma``) is fresh per
    sample; lengths are rounded and clipped to ``[1, max_tokens]``. Iteration = epoch.
    """
    ids = np.array([p[0] for p in prompts], dtype=np.int64)
    reference = np.array([p[2] for p in prompts], dtype=float)
    bias = prompt_sigma * rng.standard_normal(len(prompts))
    frames = []
    for epoch in range(num_epochs):
        noise = sample_sigma * rng.standard_normal((group_size, len(prompts)))
        lengths = np.clip(np.round(reference * np.exp(bias + noise)), 1, max_tokens)
        frames.append(
            pd.DataFrame(
                {
                    "prompt_id": np.tile(ids, group_size),
                    "iteration": epoch,
                    "prompt_tokens": np.tile([len(p[1]) for p in prompts], group_size),
                    "max_tokens": max_tokens,
                    "prompt": np.tile(np.array([p[1] for p in prompts], dtype=object), group_size),
                    "output_tokens": lengths.reshape(-1).astype(np.int64),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[TRACE_COLUMNS]
