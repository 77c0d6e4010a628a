"""The embedded tiny model: a Llama-config causal LM with a character-level tokenizer.

Built offline, warm-started by supervised training on :mod:`runtime.tasks` (answers
only, teacher forcing) for a fixed number of CPU steps, so rewards start clearly above
zero but below one and RL has room to improve them. The build is a pure function of
:class:`TinyModelConfig` (seed included) and is cached in
``$TANDEM_CACHE/models/tiny-<hash>`` (default ``~/.cache/tandem``); it is built in a
temporary directory and renamed into place, so a crash never leaves half a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.hf_quiet import quiet_progress_bars
from runtime.tasks import VOCAB, TaskPrompt, TaskSet

BUILD_VERSION = 3  # bump when the build recipe (or the tasks it trains on) changes

log = logging.getLogger(__name__)
BuildProgress = Callable[[int, int, float], None]  # (warm-start step, of steps, loss)


@dataclass(slots=True, frozen=True)
class TinyModelConfig:
    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    max_position_embeddings: int = 512
    max_output_tokens: int = 128  # answer lengths seen in warm-start
    sft_steps: int = 600
    sft_count_sigma: float = 1.6  # wider count tail than the RL prompts (1.1): long answers
    sft_batch: int = 48
    sft_lr: float = 3e-3

    def digest(self) -> str:
        text = json.dumps({**dataclasses.asdict(self), "build": BUILD_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    env = os.environ.get("TANDEM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tandem"


def check_model_dir(path: str, what: str) -> None:
    """Refuse a model directory that ``transformers`` and vLLM could not load, naming
    ``what`` (the spec key or option) before anything starts."""
    where = Path(path)
    if not where.exists():
        raise ValueError(f"{what} {path} does not exist")
    if not where.is_dir():
        raise ValueError(f"{what} {path} is a file, not a model directory")
    if not (where / "config.json").is_file():
        raise ValueError(
            f"{what} {path} has no config.json: not a Hugging Face model directory "
            "(tandem model path builds the embedded one; tandem export writes a trained one)"
        )
    config = _read_config(where / "config.json", what)
    if not isinstance(config.get("model_type"), str):
        raise ValueError(
            f"{what} {path}: {where / 'config.json'} names no model_type, so neither "
            'transformers nor vLLM can tell which architecture to build (e.g. "llama")'
        )


def _read_config(path: Path, what: str) -> dict:
    """A model directory's ``config.json`` as a dict; a ``ValueError`` naming ``what``."""
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeError, ValueError) as err:
        raise ValueError(f"{what}: {path} cannot be read as JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what}: {path} is not a JSON object")
    return config


def context_tokens(model_path: str | None) -> int | None:
    """The longest sequence the model takes: ``max_position_embeddings`` of the config.json
    at ``model_path`` (None: the embedded model's, without building it). None where it
    cannot be told: no such field, or a RoPE scaling ``factor`` (vLLM stretches the
    context by it), or a config.json that cannot be read (:func:`check_model_dir` says)."""
    if model_path is None:
        return TinyModelConfig().max_position_embeddings
    try:
        config = _read_config(Path(model_path) / "config.json", "model.path")
    except ValueError:
        return None
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    tokens = config.get("max_position_embeddings")
    if not isinstance(tokens, int) or (isinstance(rope, dict) and "factor" in rope):
        return None
    return tokens


def has_task_tokenizer(model_dir: str) -> bool:
    """Whether ``model_dir``'s tokenizer is the tasks' character vocabulary (the embedded
    model's, :func:`build_tokenizer`): then a completion's text is its token ids one
    character each (:func:`runtime.tasks.completion_text`)."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        vocab = json.loads(path.read_text())["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return vocab == {tok: i for i, tok in enumerate(VOCAB)}


def state_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """The names and shapes of the tensors a trainer on ``model_dir`` holds (and pushes):
    its state dict as its config builds it, on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def ensure_tiny_model(
    seed: int = 0, config: TinyModelConfig | None = None, on_progress: BuildProgress | None = None
) -> Path:
    """The cached model directory for ``config`` (default: seed ``seed``), built if absent
    (``on_progress`` hears of every warm-start step)."""
    config = config or TinyModelConfig(seed=seed)
    final = cache_root() / "models" / f"tiny-{config.digest()}"
    if (final / "config.json").exists():
        return final
    log.info("building the tiny model in %s (%d warm-start steps)", final, config.sft_steps)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".build-"))
    try:
        build_tiny_model(config, tmp, on_progress)
        os.replace(tmp, final)
    except OSError:
        if not (final / "config.json").exists():  # not lost to a concurrent build
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def _llama_config(config: TinyModelConfig):  # -> transformers.LlamaConfig
    """The model's shape; its vocabulary is exactly the tokenizer's (``len(VOCAB)`` ids): a
    padded one let the model sample ids that decode to no character, which the reward never
    saw while the trainer trained on them."""
    from transformers import LlamaConfig

    eos = VOCAB.index("<eos>")
    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=VOCAB.index("<pad>"),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def build_tiny_model(
    config: TinyModelConfig, out_dir: Path, on_progress: BuildProgress | None = None
) -> None:
    """Initialise from ``config.seed``, warm-start on the tasks, save HF files to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    quiet_progress_bars()  # no "Writing model shards" bar: the build has its own
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(_llama_config(config))
    tokenizer = build_tokenizer()
    if config.sft_steps:  # 0: random weights (a model of some shape, for the GPU check)
        warm_start(model, tokenizer, config, on_progress)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    eos = VOCAB.index("<eos>")
    GenerationConfig(eos_token_id=eos, bos_token_id=eos, pad_token_id=0).save_pretrained(out_dir)


def encode_example(tokenizer, prompt: TaskPrompt) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + <eos>, and the loss mask (1 on answer tokens)."""
    prompt_ids = tokenizer.encode(prompt.text, add_special_tokens=False)
    answer_ids = tokenizer.encode(prompt.answer, add_special_tokens=False)
    ids = prompt_ids + answer_ids + [tokenizer.eos_token_id]
    return ids, [0] * len(prompt_ids) + [1] * (len(answer_ids) + 1)


def _sft_batch(tokenizer, prompts: list[TaskPrompt]):  # -> (ids, targets) tensors
    import torch

    encoded = [encode_example(tokenizer, p) for p in prompts]
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.zeros(len(encoded), width, dtype=torch.long)
    targets = torch.full((len(encoded), width), -100, dtype=torch.long)
    for row, (seq, mask) in enumerate(encoded):
        ids[row, : len(seq)] = torch.tensor(seq)
        labels = torch.tensor([t if m else -100 for t, m in zip(seq, mask)])
        targets[row, : len(seq) - 1] = labels[1:]
    return ids, targets


def warm_start(
    model, tokenizer, config: TinyModelConfig, on_progress: BuildProgress | None = None
) -> list[float]:
    """Supervised steps on fresh task prompts (seeded); returns the loss curve."""
    import torch

    tasks = TaskSet(
        config.seed + 10_000,
        config.sft_steps * config.sft_batch,
        config.max_output_tokens,
        count_sigma=config.sft_count_sigma,
    )
    optim = torch.optim.AdamW(model.parameters(), lr=config.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, config.sft_lr, total_steps=config.sft_steps)
    losses = []
    model.train()
    for step in range(config.sft_steps):
        chunk = list(tasks.prompts[step * config.sft_batch : (step + 1) * config.sft_batch])
        ids, targets = _sft_batch(tokenizer, chunk)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_progress is not None:
            on_progress(step, config.sft_steps, losses[-1])
    model.eval()
    return losses


def main() -> None:
    print(ensure_tiny_model())


if __name__ == "__main__":
    main()
