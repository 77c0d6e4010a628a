"""Verifiable string tasks with long-tailed output lengths, for the tiny live model.

Four families over a character vocabulary of 24 symbols (plus 3 special tokens):

* ``R{k}:{s}=`` — repeat ``s`` (1–3 letters) ``k`` times, each copy followed by a
  two-digit countdown: ``R3:ab=`` → ``ab03ab02ab01``; ``k`` is heavy-tailed (log-normal),
  so a short prompt can ask for a very long answer;
* ``E:{c1}{k1}{c2}{k2}..=`` — expand run-length code ``a3b7`` to ``aaabbbbbbb`` (counts 1–9);
* ``V:{s}=`` — reverse ``s``: output length equals the string's length;
* ``N:{s}=`` — count the letters of ``s`` in decimal: a long prompt, a 1–2 token answer.

Two task sets (``workload.tasks``): ``mixed`` draws the four families (mean answer about
13 tokens, a tail up to the cap); ``longtail`` is a long-tail workload for the policies
that exist for stragglers: 92 % short prompts (``N`` or a 2–4-letter ``V``: 2–5 tokens)
and 8 % long repeats (``R`` with ``k`` near what the token cap allows: 75–127 tokens,
25–40x the short ones), each long answer predictable from its prompt.

Output length is set by *parsing* the prompt (multi-digit counts, their sum, the family),
not by the prompt's length, so an output-length ranker has real work to do. The long
answers are written so that a small model can produce them at their true length: the
countdown makes "how many copies are left" visible in the model's own output (it copies
``k`` once, then decrements and stops after ``01``), and run lengths stay within what it
counts reliably. Without that (plain ``s * k``, runs up to 40) the tiny model's long
answers came out anywhere from a fifth to the full length, and output length was mostly
sampling noise (docs/ranker.md). Every draw comes from the named stream ``tasks`` of
:class:`policies.rng.RngStreams`.

The reward is verifiable: the share of answer positions matched exactly, over the longer
of answer and completion — 1.0 exactly when the completion equals the answer. It scores
:func:`completion_text` of the generated token ids: one character per token, every token
but the final ``<eos>``, so a ``<pad>`` or ``<unk>`` the model emits mid-answer is a wrong
character there (a tokenizer's ``skip_special_tokens`` dropped it: the trainer trained on a
token the reward never saw).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from policies.records import Request
from policies.rng import RngStreams
from policies.spec import RunSpec

LETTERS = "abcdefgh"
DIGITS = "0123456789"
SYMBOLS = ":="
FAMILY_CHARS = "REVN"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(LETTERS + DIGITS + SYMBOLS + FAMILY_CHARS)
EOS_ID = VOCAB.index("<eos>")
NO_CHAR = "\ufffd"  # a generated token with no character of its own (in no answer)
_CHAR_OF = {i: tok for i, tok in enumerate(VOCAB) if tok not in SPECIAL_TOKENS}


class Family(StrEnum):
    REPEAT = "R"
    EXPAND = "E"
    REVERSE = "V"
    COUNT = "N"


@dataclass(slots=True, frozen=True)
class TaskPrompt:
    """One prompt of the task set, with its verifiable answer."""

    prompt_id: int
    text: str
    family: Family
    answer: str

    @property
    def prompt_tokens(self) -> int:
        return len(self.text)  # one token per character

    @property
    def expected_output_tokens(self) -> int:
        return len(self.answer) + 1  # the answer and <eos>


def completion_text(token_ids: Sequence[int]) -> str:
    """The text the reward scores: one character per generated token but a final ``<eos>``;
    a special token (``<pad>``, ``<unk>``, an ``<eos>`` before the end) or an id outside
    :data:`VOCAB` is :data:`NO_CHAR`, which matches no answer character."""
    ids = list(token_ids)
    if ids and ids[-1] == EOS_ID:
        ids.pop()
    return "".join(_CHAR_OF.get(i, NO_CHAR) for i in ids)


def reward(prompt: TaskPrompt, completion_text: str) -> float:
    """Share of answer characters matched position by position, over the longer string."""
    answer = prompt.answer
    longest = max(len(answer), len(completion_text))
    if longest == 0:
        return 1.0
    hits = sum(a == b for a, b in zip(answer, completion_text))
    return hits / longest


def _word(rng: np.random.Generator, n: int) -> str:
    return "".join(LETTERS[i] for i in rng.integers(0, len(LETTERS), size=n))


def _heavy_count(rng: np.random.Generator, median: float, sigma: float, cap: int) -> int:
    """A count from a log-normal with the given median and sigma, in [1, cap]."""
    return int(np.clip(round(median * np.exp(sigma * rng.standard_normal())), 1, max(1, cap)))


def _repeat(rng: np.random.Generator, budget: int, sigma: float) -> tuple[str, str]:
    s = _word(rng, min(int(rng.integers(1, 4)), max(1, budget - 2)))
    k = _heavy_count(rng, 4.0, sigma, min(99, budget // (len(s) + 2)))
    return f"R{k}:{s}=", "".join(f"{s}{i:02d}" for i in range(k, 0, -1))


def _expand(rng: np.random.Generator, budget: int, sigma: float) -> tuple[str, str]:
    num_runs = int(rng.integers(2, 4))
    letters = _word(rng, num_runs)
    counts = [_heavy_count(rng, 3.0, sigma, min(9, budget // num_runs)) for _ in letters]
    code = "".join(f"{c}{k}" for c, k in zip(letters, counts))
    return f"E:{code}=", "".join(c * k for c, k in zip(letters, counts))


def _reverse(rng: np.random.Generator, budget: int, sigma: float) -> tuple[str, str]:
    s = _word(rng, int(rng.integers(2, min(16, max(3, budget)))))
    return f"V:{s}=", s[::-1]


def _count(rng: np.random.Generator, budget: int, sigma: float) -> tuple[str, str]:
    s = _word(rng, int(rng.integers(3, 40)))
    return f"N:{s}=", str(len(s))


_MAKERS = {
    Family.REPEAT: _repeat,
    Family.EXPAND: _expand,
    Family.REVERSE: _reverse,
    Family.COUNT: _count,
}
_FAMILY_WEIGHTS = (0.35, 0.25, 0.2, 0.2)


COUNT_SIGMA = 1.1  # log-normal sigma of the repeat and run-length counts
LONG_SHARE = 0.08  # longtail: share of the long repeat prompts


class TaskMix(StrEnum):
    MIXED = "mixed"
    LONGTAIL = "longtail"


def _short(rng: np.random.Generator, budget: int, sigma: float) -> tuple[Family, str, str]:
    """A 1–2-digit count or a 2–4-letter reversal: an answer of 2–5 tokens with <eos>."""
    if rng.random() < 0.5:
        return (Family.COUNT, *_count(rng, budget, sigma))
    s = _word(rng, int(rng.integers(2, 5)))
    return Family.REVERSE, f"V:{s}=", s[::-1]


def _long_repeat(rng: np.random.Generator, budget: int, sigma: float) -> tuple[str, str]:
    """A repeat whose count is in the top 40 % of what ``budget`` tokens can hold."""
    s = _word(rng, int(rng.integers(1, 3)))
    most = max(1, min(99, budget // (len(s) + 2)))
    k = int(rng.integers(max(1, (most * 3) // 5), most + 1))
    return f"R{k}:{s}=", "".join(f"{s}{i:02d}" for i in range(k, 0, -1))


class TaskSet:
    """``num_prompts`` deterministic prompts; answers fit in ``max_output_tokens`` (with <eos>).

    ``count_sigma`` widens or narrows the heavy tail of the counts; the warm-start trains
    on a wider tail than the RL prompts use, so that the rare long answers are practised.
    """

    def __init__(
        self,
        seed: int,
        num_prompts: int,
        max_output_tokens: int,
        *,
        count_sigma: float = COUNT_SIGMA,
        mix: str = TaskMix.MIXED,
    ) -> None:
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, not {num_prompts}")
        if max_output_tokens < 4:
            raise ValueError(f"max_output_tokens must be >= 4, not {max_output_tokens}")
        if count_sigma <= 0:
            raise ValueError(f"count_sigma must be > 0, not {count_sigma}")
        self.seed = seed
        self.max_output_tokens = max_output_tokens
        self.count_sigma = count_sigma
        try:
            self.mix = TaskMix(mix)
        except ValueError:
            known = ", ".join(m.value for m in TaskMix)
            raise ValueError(f"workload.tasks: unknown task set {mix!r} (known: {known})") from None
        self._prompts = self._make(RngStreams(seed).get("tasks"), num_prompts)

    def _make(self, rng: np.random.Generator, num_prompts: int) -> list[TaskPrompt]:
        families = list(_MAKERS)
        budget = self.max_output_tokens - 1
        out = []
        for prompt_id in range(num_prompts):
            if self.mix == TaskMix.LONGTAIL:
                family, text, answer = self._longtail(rng, budget)
            else:
                family = families[int(rng.choice(len(families), p=_FAMILY_WEIGHTS))]
                text, answer = _MAKERS[family](rng, budget, self.count_sigma)
            out.append(TaskPrompt(prompt_id, text, family, answer))
        return out

    def _longtail(self, rng: np.random.Generator, budget: int) -> tuple[Family, str, str]:
        if rng.random() < LONG_SHARE:
            return (Family.REPEAT, *_long_repeat(rng, budget, self.count_sigma))
        return _short(rng, budget, self.count_sigma)

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, prompt_id: int) -> TaskPrompt:
        return self._prompts[prompt_id]

    @property
    def prompts(self) -> Sequence[TaskPrompt]:
        return self._prompts

    def reward(self, prompt_id: int, completion_text: str) -> float:
        return reward(self._prompts[prompt_id], completion_text)


def task_set(spec: RunSpec) -> TaskSet:
    """The live task set of a spec: ``workload.tasks`` drawn with ``run.seed``."""
    w = spec.workload
    return TaskSet(spec.run.seed, w.num_prompts, w.max_output_tokens, mix=w.tasks)


def check_model_context(max_model_len: int, model_tokens: int | None, where: str) -> None:
    """A ``ValueError`` naming ``where`` if ``max_model_len`` is longer than the model's
    context (``model_tokens``; None: unknown): vLLM refuses to start above it."""
    if model_tokens is not None and max_model_len > model_tokens:
        raise ValueError(
            f"{where} ({max_model_len}) is longer than the model's context ({model_tokens} "
            "tokens, max_position_embeddings of its config): vLLM would refuse to start; "
            f"make it at most {model_tokens}"
        )


def check_context(
    tasks: TaskSet, max_model_len: int, where: str = "live.max_model_len",
    model_tokens: int | None = None,
) -> None:  # fmt: skip
    """A ``ValueError`` unless a server's context (``max_model_len`` tokens, from ``where``)
    holds the longest prompt with ``workload.max_output_tokens`` after it: vLLM would end a
    longer answer at the context length and the run would train on it as it is. With
    ``model_tokens`` (the model's own limit, ``max_position_embeddings``) also unless
    ``max_model_len`` fits the model: vLLM refuses to start above it."""
    longest = max(p.prompt_tokens for p in tasks.prompts)
    need = longest + tasks.max_output_tokens
    model = f"the model's context ({model_tokens} tokens, max_position_embeddings of its config)"
    if model_tokens is not None and need > model_tokens:
        raise ValueError(
            f"{model} cannot hold the longest prompt ({longest} tokens) plus "
            f"workload.max_output_tokens ({tasks.max_output_tokens}): lower "
            f"workload.max_output_tokens to at most {model_tokens - longest} "
            f"({where} cannot go above {model_tokens})"
        )
    check_model_context(max_model_len, model_tokens, where)
    if max_model_len < need:
        raise ValueError(
            f"{where} ({max_model_len}) is shorter than the longest prompt ({longest} tokens) "
            f"plus workload.max_output_tokens ({tasks.max_output_tokens}): answers would be cut "
            f"at the context length; make it at least {need} or lower workload.max_output_tokens"
        )


class TaskPromptSource:
    """The controller's ``PromptSource`` over a :class:`TaskSet`.

    Iteration ``i`` takes ``batch_size / group_size`` prompts, each ``group_size`` times.
    Prompts are visited in a fresh seeded order every epoch, so the same prompt ids come
    back each epoch. Sample ids are ``i * batch_size + j``, group ids ``i * P + g``:
    unique and a pure function of the iteration (a resumed run regenerates the same ids).
    """

    def __init__(self, tasks: TaskSet, batch_size: int, group_size: int) -> None:
        if group_size < 1 or batch_size % group_size:
            raise ValueError(
                f"batch_size ({batch_size}) must be a positive multiple of group_size ({group_size})"
            )
        self.tasks = tasks
        self.batch_size = batch_size
        self.group_size = group_size
        self._streams = RngStreams(tasks.seed)
        self._orders: dict[int, np.ndarray] = {}  # epoch -> prompt order

    @property
    def prompts_per_iteration(self) -> int:
        return self.batch_size // self.group_size

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            rng = self._streams.get(f"epoch-{epoch}")
            self._orders[epoch] = rng.permutation(len(self.tasks))
        return self._orders[epoch]

    def prompt_ids(self, iteration: int) -> list[int]:
        per = self.prompts_per_iteration
        n = len(self.tasks)
        ids = []
        for k in range(iteration * per, (iteration + 1) * per):
            ids.append(int(self._order(k // n)[k % n]))
        return ids

    def batch(self, iteration: int) -> list[Request]:
        out = []
        for g, prompt_id in enumerate(self.prompt_ids(iteration)):
            prompt = self.tasks[prompt_id]
            group_id = iteration * self.prompts_per_iteration + g
            for j in range(self.group_size):
                sample_id = iteration * self.batch_size + g * self.group_size + j
                out.append(
                    Request(
                        sample_id=sample_id,
                        prompt_id=prompt_id,
                        group_id=group_id,
                        iteration=iteration,
                        prompt_tokens=prompt.prompt_tokens,
                        max_tokens=self.tasks.max_output_tokens,
                        prompt=prompt.text,
                    )
                )
        return out
