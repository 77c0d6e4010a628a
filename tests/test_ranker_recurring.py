"""The ranker's summary says when few of its prompts had come up before: then it ranked
without their history, and a low figure is no sign of a broken ranker."""

from __future__ import annotations

import pandas as pd

from experiments.ranker_quality import brief, rank_quality


def _samples(prompt_ids: list[int], iterations: list[int]) -> pd.DataFrame:
    n = len(prompt_ids)
    return pd.DataFrame(
        {
            "prompt_id": prompt_ids,
            "iteration": iterations,
            "gen_end_s": [1.0] * n,
            "output_tokens": list(range(1, n + 1)),
            "predicted_output_tokens": list(range(n, 0, -1)),
        }
    )


def test_a_run_whose_prompts_never_recur_says_the_ranker_had_no_history() -> None:
    quality = rank_quality(_samples([0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 2, 2, 3, 3]))
    assert quality["ranker_recurring_share"] == 0.0
    assert "only 0% of its prompts had come up in an earlier iteration" in brief(quality)


def test_a_run_whose_prompts_recur_gives_the_figure_alone() -> None:
    quality = rank_quality(_samples([0, 1, 0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2, 3, 3]))
    assert quality["ranker_recurring_share"] == 0.75  # all but iteration 0's
    assert "earlier iteration" not in brief(quality)
