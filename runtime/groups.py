"""Groups and advantages: completions wait for their group before they are trained.

A completion the controller places into step ``s`` becomes a :class:`TrainItem` once
every sample of its group has a reward (advantage = reward − group mean). Every mode
places a whole group into one step (the wave modes train iteration ``s`` in step ``s``;
``pipeline`` places finished groups), so when step ``s`` closes all its groups are
complete; streaming micro-batches only hold back samples whose group is still running.
"""

from __future__ import annotations

from policies.records import Completion
from runtime.trainer import TrainItem


class GroupBook:
    """Completions waiting for their groups. The controller's completions count versions
    from this run's start; ``version_offset`` (a resumed run's first global step) turns
    them back into the trainer's global versions, so a sample's lag is one subtraction of
    two global numbers."""

    def __init__(self, group_size: int, version_offset: int = 0) -> None:
        self.group_size = group_size
        self.version_offset = version_offset
        self._rewards: dict[int, dict[int, float]] = {}  # group id -> sample id -> reward
        self._pending: dict[int, list[Completion]] = {}  # step -> placed, group unfinished
        self.prompt_ids: dict[int, tuple[int, ...]] = {}  # sample id -> prompt token ids

    def finished(self, completion: Completion, prompt_ids: tuple[int, ...]) -> None:
        rewards = self._rewards.setdefault(completion.request.group_id, {})
        rewards[completion.sample_id] = completion.reward or 0.0
        self.prompt_ids[completion.sample_id] = prompt_ids

    def _complete(self, c: Completion) -> bool:
        return len(self._rewards.get(c.request.group_id, {})) >= self.group_size

    def place(self, step: int, completions: tuple[Completion, ...]) -> list[TrainItem]:
        """Items ready to train in ``step`` (its earlier pending ones included)."""
        pending = self._pending.setdefault(step, []) + list(completions)
        ready = [c for c in pending if self._complete(c)]
        self._pending[step] = [c for c in pending if not self._complete(c)]
        return [self._item(c) for c in ready]

    def close(self, step: int) -> list[TrainItem]:
        """Everything still pending for ``step`` (its groups are complete by now)."""
        pending = self._pending.pop(step, [])
        assert all(self._complete(c) for c in pending), "a group was split across steps"
        return [self._item(c) for c in pending]

    def _item(self, c: Completion) -> TrainItem:
        rewards = self._rewards[c.request.group_id]
        flat = len(set(rewards.values())) == 1  # advantage exactly 0, not a rounding of it
        mean = (c.reward or 0.0) if flat else sum(rewards.values()) / len(rewards)
        return TrainItem(
            sample_id=c.sample_id,
            prompt_ids=self.prompt_ids[c.sample_id],
            output_ids=tuple(c.token_ids or ()),
            logprobs_old=tuple(c.logprobs or ()),
            advantage=(c.reward or 0.0) - mean,
            reward=c.reward or 0.0,
            version_start=c.prompt_version + self.version_offset,
        )
