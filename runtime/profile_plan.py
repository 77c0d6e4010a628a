"""What ``tandem profile`` measures (:mod:`runtime.profiler`): the grid of decode batches,
burst lengths, micro-batches and pushes, and the setup steps its progress ticks."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(slots=True, frozen=True)
class ProfilePlan:
    """The measured grid. Defaults avoid live-tiny's batch (32) and micro-batch (8)."""

    batch_sizes: tuple[int, ...] = (1, 3, 10, 20, 40, 64)  # concurrent requests
    max_tokens: tuple[int, ...] = (24, 112)  # decode steps per burst (+1)
    repeats: int = 2  # bursts per point; the median is kept
    micro_batch_samples: tuple[int, ...] = (2, 4, 12, 16)
    train_repeats: int = 3  # micro-batches (different prompts) per size
    num_pushes: int = 6  # weight pushes, every second one in flight
    contended_batch_sizes: tuple[int, ...] = (3, 20, 64)  # decode again, the trainer busy
    contended_micro_batches: tuple[int, ...] = (4, 12)  # train again, generation busy

    def with_batch_sizes(self, sizes: tuple[int, ...]) -> ProfilePlan:
        """This plan decoding batches of ``sizes``, and under training the least, a middle
        and the largest of them."""
        ordered = sorted(set(sizes))
        if len(ordered) < 2:
            raise ValueError(
                f"--batch-sizes: one batch size ({ordered[0]}); tandem calibrate needs at least "
                "2 distinct batch sizes to separate a decode step's fixed cost from its "
                "per-sequence cost (and prefill's fixed cost from its per-token cost)"
            )
        middle = ordered[len(ordered) // 2]
        contended = tuple(sorted({ordered[0], middle, ordered[-1]}))
        return replace(self, batch_sizes=tuple(ordered), contended_batch_sizes=contended)

    def check_batches(self, max_num_seqs: int) -> None:
        """Refuse decode batches the server would queue: its engine runs ``max_num_seqs``."""
        over = sorted(
            {b for b in (*self.batch_sizes, *self.contended_batch_sizes) if b > max_num_seqs}
        )
        if over:
            raise ValueError(
                f"--batch-sizes: {', '.join(map(str, over))} "
                f"{'exceeds' if len(over) == 1 else 'exceed'} the server's "
                f"cluster.generation.0.max_num_seqs {max_num_seqs}: it would queue them and a "
                "step would time part of the batch; profile smaller batches or raise it "
                "(--set cluster.generation.0.max_num_seqs=N)"
            )

    @property
    def num_measurements(self) -> int:
        """The progress ticks of a profile: its setup steps and every measurement."""
        decode = len(self.batch_sizes) * (1 + len(self.max_tokens))
        contended = len(self.contended_batch_sizes) * len(self.max_tokens)
        contended += len(self.contended_micro_batches)
        train = len(self.micro_batch_samples) * self.train_repeats
        return len(SETUP_STEPS) + decode + train + self.num_pushes + contended


SETUP_STEPS = ("server up", "warm-up")  # ticked before the first measurement
