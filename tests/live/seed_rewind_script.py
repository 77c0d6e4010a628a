"""Run by tests/live/test_cpu_seed_rewind.py in a process of its own: the same seeded
requests through offline vLLM with the token budget of each argument; prints one JSON line
of each budget's token ids (or the error that stopped the engine)."""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402 - after the environment it reads

# prompts of 25-67 tokens: a budget of 16 prefills each over two to five steps
PROMPTS = [" ".join(["count", str(i)] * (12 + 3 * i)) for i in range(8)]
PARAMS = [
    SamplingParams(temperature=1.0, max_tokens=12, seed=1000 + i, logprobs=0) for i in range(8)
]


def tokens(model: str, budget: int) -> list[list[int]] | str:
    llm = LLM(model=model, max_num_batched_tokens=budget, max_model_len=512, enforce_eager=True,
              max_num_seqs=16, enable_prefix_caching=False, seed=0)  # fmt: skip
    try:
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    except Exception as err:  # noqa: BLE001 - the engine's death is the answer
        return f"{type(err).__name__}: {err}"
    finally:
        del llm
        gc.collect()


if __name__ == "__main__":
    model, budgets = sys.argv[1], [int(b) for b in sys.argv[2:]]
    print(json.dumps({str(b): tokens(model, b) for b in budgets}))
