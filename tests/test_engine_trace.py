"""The scheduler trace's sampling setup (runtime.engine_trace, no vLLM needed)."""

from __future__ import annotations

import pytest

from experiments.scheduler_fidelity import skewed_trace
from policies.records import TraceRequest
from runtime.engine_trace import prompt_tokens_of, sibling_vocabularies


def test_siblings_sample_from_disjoint_vocabularies_so_no_output_block_is_shared():
    trace = skewed_trace(num_groups=3, group_size=4)
    vocabularies = sibling_vocabularies(trace, vocab_size=32)
    by_group: dict[int, list[set[int]]] = {}
    for r, allowed in zip(trace, vocabularies):
        assert allowed and min(allowed) >= 3 and max(allowed) < 32
        by_group.setdefault(r.prompt_group, []).append(set(allowed))
    for sets in by_group.values():
        assert len(sets) == 4
        assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :])
    prompts = prompt_tokens_of(trace, 32)
    assert prompts[0] == prompts[3] and prompts[0] != prompts[4]  # siblings share the prompt


def test_a_vocabulary_too_small_for_the_groups_is_refused():
    trace = [TraceRequest(8, 4, 0) for _ in range(5)]
    with pytest.raises(ValueError, match="too small"):
        sibling_vocabularies(trace, vocab_size=7)
