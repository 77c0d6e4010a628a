"""Model shapes for the cost models: a row of ``models.csv``, a Hugging Face ``config.json``,
or a shape written inline in the spec (``model.name`` / ``model.config`` / ``model.shape``).

What the cost models need of a model: parameters (all, and active per token for a
mixture of experts), layers, attention heads and their size (FLOPs of attention), and the
KV bytes a token holds. Weights and KV are bf16. A mixture of experts reads only the
experts its tokens are routed to: ``weight_bytes_read(rows)`` counts the dense part plus
the expected share of experts that ``rows`` tokens touch, each token picking
``num_experts_per_tok`` of ``num_experts`` (independently: ``1 - (1 - k/E)^rows``).
Multi-head latent attention (DeepSeek) caches ``kv_lora_rank + qk_rope_head_dim`` values
per layer and token. Under tensor parallelism each rank caches its share of the KV heads,
as vLLM does: at least one head (heads are replicated when ``tp > num_kv_heads``), and the
whole latent under latent attention (``kv_bytes_per_token_per_rank``). A shape given under
the name of a models.csv row must be that row's shape (``check_named_shape``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from policies.spec import ModelSection, ModelShape
from sim.tables import data_path

BYTES_PER_VALUE = 2.0  # bf16 weights and KV
PARAMS_TOLERANCE = 0.05  # a config.json's counted parameters against a row's published ones


class TpDoesNotShard(ValueError):
    """A tensor-parallel size vLLM cannot shard a model's attention heads over."""


@dataclass(slots=True, frozen=True)
class Model:
    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int = 0
    vocab_size: int = 0
    active_params: float | None = None  # per token (mixture of experts); None: all
    num_experts: int = 0
    num_experts_per_tok: int = 0
    kv_lora_rank: int = 0  # multi-head latent attention
    qk_rope_head_dim: int = 0

    @property
    def num_active_params(self) -> float:
        return self.num_params if self.active_params is None else self.active_params

    @property
    def weight_bytes(self) -> float:
        return BYTES_PER_VALUE * self.num_params

    @property
    def kv_bytes_per_token(self) -> float:
        if self.kv_lora_rank:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim  # K and V
        return BYTES_PER_VALUE * self.num_layers * per_layer

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each of ``tp`` tensor-parallel ranks caches, as vLLM's
        ``ModelConfig.get_num_kv_heads``: ``max(1, num_kv_heads // tp)``, so with fewer KV
        heads than ranks each head is replicated ``tp / num_kv_heads`` times; 1 under latent
        attention, where every rank caches the whole latent (it is not sharded at all)."""
        return 1 if self.kv_lora_rank else max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_rank(self, tp: int) -> float:
        """KV bytes a token takes on each of ``tp`` ranks, as vLLM's page size per layer
        (``FullAttentionSpec``: K and V of the rank's heads; ``MLAAttentionSpec``: one
        latent of ``kv_lora_rank + qk_rope_head_dim`` values)."""
        if self.kv_lora_rank:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.kv_heads_per_rank(tp) * self.head_dim  # K and V
        return BYTES_PER_VALUE * self.num_layers * per_layer

    def kv_bytes_per_token_all_ranks(self, tp: int) -> float:
        """KV bytes a token takes on all ``tp`` ranks together, replicas included: equal to
        ``kv_bytes_per_token`` where the KV heads split evenly, ``tp`` times it under latent
        attention, ``tp / num_kv_heads`` times it with fewer KV heads than ranks."""
        return tp * self.kv_bytes_per_token_per_rank(tp)

    @property
    def attention_flops_per_context_token(self) -> float:
        """FLOPs one query token spends per token it attends to (QKᵀ and AV, all layers)."""
        width = self.kv_lora_rank + self.qk_rope_head_dim if self.kv_lora_rank else self.head_dim
        return 4.0 * self.num_layers * self.num_attention_heads * width

    def shards(self, tp: int) -> bool:
        """Whether vLLM can shard this model's attention over ``tp`` ranks: the query heads
        split evenly, and the KV heads split evenly or are replicated a whole number of
        times (no KV heads to split under latent attention)."""
        kv = self.num_kv_heads
        if self.num_attention_heads % tp:
            return False
        return bool(self.kv_lora_rank) or not (kv % tp if tp <= kv else tp % kv)

    def check_tp(self, tp: int) -> None:
        """Refuse a tensor-parallel size vLLM cannot shard this model's attention over,
        listing the sizes it can (:meth:`shards`)."""
        if self.shards(tp):
            return
        heads, kv = self.num_attention_heads, self.num_kv_heads
        bad = f"{heads} attention heads" if heads % tp else f"{kv} KV heads"
        counts = f"{heads} attention heads" + ("" if self.kv_lora_rank else f" and {kv} KV heads")
        fits = ", ".join(str(t) for t in range(1, heads + 1) if self.shards(t))
        raise TpDoesNotShard(
            f"tp {tp} cannot shard {self.name}'s {bad} evenly (vLLM refuses it); the tps "
            f"that shard its {counts}: {fits}"
        )

    def weight_bytes_read(self, rows: int) -> float:
        """Weight bytes one forward pass over ``rows`` tokens reads (each weight once)."""
        if not self.num_experts or self.active_params is None:
            return self.weight_bytes
        k, e = self.num_experts_per_tok, self.num_experts
        expert = (self.num_params - self.active_params) / (1.0 - k / e)  # every expert's
        touched = 1.0 - (1.0 - k / e) ** max(1, rows)
        return BYTES_PER_VALUE * (self.num_params - expert + expert * touched)


def _int(row: dict[str, str], key: str, default: int = 0) -> int:
    value = row.get(key) or ""
    return int(value) if value.strip() else default


def _row_model(row: dict[str, str]) -> Model:
    hidden, heads = int(row["hidden_size"]), int(row["num_attention_heads"])
    active = row.get("active_params_b") or ""
    return Model(
        name=row["name"],
        num_params=float(row["num_params_b"]) * 1e9,
        num_layers=int(row["num_layers"]),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(row["num_kv_heads"]),
        head_dim=_int(row, "head_dim", hidden // heads),
        intermediate_size=_int(row, "intermediate_size"),
        vocab_size=_int(row, "vocab_size"),
        active_params=float(active) * 1e9 if active.strip() else None,
        num_experts=_int(row, "num_experts"),
        num_experts_per_tok=_int(row, "num_experts_per_tok"),
        kv_lora_rank=_int(row, "kv_lora_rank"),
        qk_rope_head_dim=_int(row, "qk_rope_head_dim"),
    )


@cache
def model_table() -> dict[str, Model]:
    with data_path("models.csv").open() as f:
        return {r["name"]: _row_model(r) for r in csv.DictReader(f)}


def model(name: str) -> Model:
    table = model_table()
    if name not in table:
        live = (  # the roofline has no shape for it; a profile of the live runtime prices it
            " ('tiny' is the live runtime's model: simulate it with "
            "sim.cost_model=profiled:DIR from tandem calibrate, or run it with tandem run --live)"
            if name == "tiny"
            else ""
        )
        raise ValueError(
            f"model.name: unknown model {name!r}{live}; models.csv has {', '.join(table)}"
        )
    return table[name]


def model_from_shape(name: str, shape: ModelShape) -> Model:
    heads = shape.num_attention_heads
    return Model(
        name=name,
        num_params=shape.num_params_b * 1e9,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=heads,
        num_kv_heads=shape.num_kv_heads or heads,
        head_dim=shape.head_dim or shape.hidden_size // heads,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        active_params=None if shape.active_params_b is None else shape.active_params_b * 1e9,
        num_experts=shape.num_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
    )


def shape_from_hf_config(config: dict[str, Any]) -> ModelShape:
    """A model shape from a Hugging Face ``config.json`` (parameters counted from it)."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, vocab = int(config["num_attention_heads"]), int(config["vocab_size"])
    except KeyError as err:
        raise ValueError(f"model.config: config.json lacks {err.args[0]!r}") from None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    experts = int(
        config.get("num_experts")
        or config.get("n_routed_experts")
        or config.get("num_local_experts")
        or 0
    )
    per_tok = int(config.get("num_experts_per_tok") or 0) if experts else 0
    inter = int(config.get("moe_intermediate_size") or 0) if experts else 0
    inter = inter or int(config.get("intermediate_size") or 4 * hidden)
    kv_lora = int(config.get("kv_lora_rank") or 0)
    rope = int(config.get("qk_rope_head_dim") or 0)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = 3 * hidden * inter  # gated (gate, up, down)
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    total = embeddings + layers * (attention + mlp * max(1, experts))
    active = embeddings + layers * (attention + mlp * per_tok) if experts else None
    return ModelShape(
        num_params_b=total / 1e9,
        active_params_b=None if active is None else active / 1e9,
        num_layers=layers, hidden_size=hidden, intermediate_size=inter,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        num_experts=experts, num_experts_per_tok=per_tok, kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
    )  # fmt: skip


def model_for(section: ModelSection) -> Model:
    """The model a spec names: its inline shape, its ``config.json``, or a table row (a
    shape given under the name of a row must be that row's: :func:`check_named_shape`)."""
    if section.shape is not None:
        given = model_from_shape(section.name, section.shape)
    elif section.config is not None:
        given = model_from_shape(section.name, shape_from_hf_config(_read_config(section.config)))
    else:
        return model(section.name)
    check_named_shape(section, given)
    return given


def check_named_shape(section: ModelSection, given: Model) -> None:
    """Refuse a ``model.name`` that is a row of models.csv given with a ``model.shape`` or
    ``model.config`` of another shape: the run would simulate the given shape under the
    row's name. A shape that agrees with the row (parameters within ``PARAMS_TOLERANCE``,
    a config.json's being counted; an intermediate or vocab size of 0: not given) is fine."""
    row = model_table().get(section.name)
    if row is None:
        return
    source = "model.shape" if section.shape is not None else "model.config"
    differ = [
        f"{key} {_text(old)} in models.csv, {_text(new)} in {source}"
        for key, old, new in _shape_fields(row, given)
        if _differs(key, old, new)
    ]
    if not differ:
        return
    default = "" if "name" in section.model_fields_set else " (model.name's default)"
    raise ValueError(
        f"model.name: {section.name!r}{default} is a row of models.csv, but {source} gives "
        f"another shape ({'; '.join(differ)}); name the shape something models.csv does not "
        f"list, or drop {source} to simulate the row"
    )


def _shape_fields(row: Model, given: Model) -> list[tuple[str, Any, Any]]:
    """(shape key, row's value, given value) of every field of a model's shape."""
    out = [("num_params_b", row.num_params / 1e9, given.num_params / 1e9)]
    active = [None if m.active_params is None else m.active_params / 1e9 for m in (row, given)]
    out.append(("active_params_b", *active))
    skip = {"name", "num_params", "active_params"}
    names = [f for f in Model.__dataclass_fields__ if f not in skip]
    return out + [(f, getattr(row, f), getattr(given, f)) for f in names]


def _differs(key: str, old: Any, new: Any) -> bool:
    if key in ("intermediate_size", "vocab_size") and not new:
        return False  # not given
    if isinstance(old, float) and isinstance(new, float):
        return abs(new - old) > PARAMS_TOLERANCE * old
    return old != new


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def resolved_model(section: ModelSection) -> ModelSection:
    """The section a run records: a ``model.config`` replaced by the shape it gave and the
    file it came from (``shape_source``), so the saved spec says what ran and reruns
    without the file."""
    if section.config is None:
        return section
    shape = shape_from_hf_config(_read_config(section.config))
    source = str(_config_file(section.config).resolve())
    return section.model_copy(update={"config": None, "shape": shape, "shape_source": source})


def _config_file(config: str) -> Path:
    path = Path(config)
    return path / "config.json" if path.is_dir() else path


def _read_config(config: str) -> dict[str, Any]:
    path = _config_file(config)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"model.config: {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"model.config: {path} is not JSON ({err})") from None
