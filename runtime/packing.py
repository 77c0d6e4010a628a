"""A trainer micro-batch as one packed row: the sequences end to end, no padding.

Each sequence is its prompt then its output less the last token (whose logits predict
nothing). With ``share_prompts`` the samples of one prompt (a GRPO group) share a single
copy of it: each output segment attends to its prompt's segment and causally to itself,
through an explicit [row, row] attention mask, and takes positions that continue the
prompt's. On the long-tail task prompts are ~57 % of the tokens of a step and a group
has 4 samples, so a group's row is about half as long. Without sharing the positions
restart at 0 for each sequence and transformers builds the block-causal mask from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Packing:
    ids: torch.Tensor  # [L] the row's token ids
    positions: torch.Tensor  # [L] each token's position in its own sequence
    where: torch.Tensor  # [batch, width] row index whose logits predict each output token
    targets: torch.Tensor  # [batch, width] the output tokens (0 past each output's end)
    mask: torch.Tensor  # [batch, width] 1.0 on real output tokens
    attend: torch.Tensor | None  # [L, L] bool, query may see key; None: from positions


def pack(
    prompts: Sequence[tuple[int, ...]], outputs: Sequence[tuple[int, ...]], share_prompts: bool
) -> Packing:
    """The packed row of these sequences (every prompt at least one token long)."""
    ids: list[int] = []
    positions: list[int] = []
    segment: list[int] = []  # each row token's segment: a prompt's copy or one output
    parent: list[int] = []  # per segment: the prompt segment it may also see (itself: none)
    prompt_end: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (last index, segment)
    width = max(len(o) for o in outputs)
    where = torch.zeros(len(outputs), width, dtype=torch.long)
    targets = torch.zeros(len(outputs), width, dtype=torch.long)
    mask = torch.zeros(len(outputs), width)
    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        if not prompt:
            raise ValueError(f"sample {i} has an empty prompt: nothing predicts its first token")
        if not share_prompts or prompt not in prompt_end:
            seg = len(parent)
            parent.append(seg)
            ids += prompt
            positions += range(len(prompt))
            segment += [seg] * len(prompt)
            prompt_end[prompt] = (len(ids) - 1, seg)
        last, prompt_seg = prompt_end[prompt]
        n = len(output)
        start = len(ids)
        if n > 1:
            seg = len(parent)
            parent.append(prompt_seg)
            ids += output[:-1]
            positions += range(len(prompt), len(prompt) + n - 1)
            segment += [seg] * (n - 1)
        where[i, :n] = torch.tensor([last] + list(range(start, start + n - 1)))[:n]
        targets[i, :n] = torch.tensor(output, dtype=torch.long)
        mask[i, :n] = 1.0
    attend = None
    if share_prompts:
        seg = torch.tensor(segment)
        sees = seg[None, :] == seg[:, None]
        sees |= seg[None, :] == torch.tensor(parent)[seg][:, None]
        attend = sees & torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    return Packing(torch.tensor(ids), torch.tensor(positions), where, targets, mask, attend)


def packed_logprobs(
    model, prompts: Sequence[tuple[int, ...]], outputs: Sequence[tuple[int, ...]],
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Log-probs of each output token given its prefix ([batch, width]) and the mask."""
    device = next(model.parameters()).device  # the model's (a sharded trainer's: this rank's)
    p = pack(prompts, outputs, share_prompts)
    extra = {} if p.attend is None else {"attention_mask": p.attend[None, None].to(device)}
    # use_cache=False: with a cache transformers would not read the packing from positions
    logits = model(
        input_ids=p.ids[None].to(device), position_ids=p.positions[None].to(device),
        use_cache=False, **extra,
    ).logits[0]  # fmt: skip
    where, targets, mask = p.where.to(device), p.targets.to(device), p.mask.to(device)
    logp = torch.log_softmax(logits[where].float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    return logp * mask, mask
