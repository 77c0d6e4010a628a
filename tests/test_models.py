"""Model shapes for the cost models: table rows, Hugging Face config.json files, inline
shapes (issue #14 item 3)."""

from __future__ import annotations

import json

import pytest
from helpers import small_spec

from policies.protocols import Device
from policies.spec import ModelShape, SpecError, load_spec
from sim.cluster import check_sim_run
from sim.costs import build_cost_model
from sim.models import model, model_for, model_table, shape_from_hf_config
from sim.simulator import Simulation

LLAMA2_7B_CONFIG = {  # meta-llama/Llama-2-7b-hf config.json (the fields that matter)
    "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN3_30B_A3B_CONFIG = {
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
    "vocab_size": 151936, "tie_word_embeddings": False,
}  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B",
     "CodeLlama-34B", "Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "DeepSeek-V3"],
)  # fmt: skip
def test_widely_trained_models_are_rows_with_their_kv_and_active_parameters(name):
    m = model(name)
    assert m.num_params > 1e9 and m.kv_bytes_per_token > 0
    assert m.num_active_params <= m.num_params


def test_kv_bytes_follow_attention_type():
    # full multi-head KV (Llama-2-7B): 2 (K,V) x 32 layers x 32 heads x 128 x 2 bytes
    assert model("Llama-2-7B").kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    # grouped-query (Llama-3.1-8B): 8 KV heads
    assert model("Llama-3.1-8B").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    # latent attention (DeepSeek-V3): 512 + 64 values per layer and token
    assert model("DeepSeek-V3").kv_bytes_per_token == 61 * (512 + 64) * 2


def test_a_mixture_of_experts_reads_only_the_routed_experts_at_small_batch():
    m = model("Qwen3-30B-A3B")
    assert m.weight_bytes_read(1) < 0.25 * m.weight_bytes
    assert m.weight_bytes_read(4096) == pytest.approx(m.weight_bytes, rel=1e-3)
    dense = model("Qwen3-8B")
    assert dense.weight_bytes_read(1) == dense.weight_bytes


def test_a_hugging_face_config_gives_the_published_parameter_count():
    shape = shape_from_hf_config(LLAMA2_7B_CONFIG)
    assert shape.num_params_b == pytest.approx(6.74, rel=0.01)
    assert shape.active_params_b is None
    moe = shape_from_hf_config(QWEN3_30B_A3B_CONFIG)
    assert moe.num_params_b == pytest.approx(30.5, rel=0.02)
    assert moe.active_params_b == pytest.approx(3.3, rel=0.08)


def test_a_spec_names_a_config_file_or_an_inline_shape(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    from_file = load_spec(None, ["model.name=my-llama", f"model.config={tmp_path}"])
    assert model_for(from_file.model).kv_bytes_per_token == model("Llama-2-7B").kv_bytes_per_token
    shape = "{num_params_b: 6.74, num_layers: 32, hidden_size: 4096, num_attention_heads: 32}"
    inline = load_spec(None, ["model.name=inline", f"model.shape={shape}"])
    assert model_for(inline.model).num_params == 6.74e9


def test_bad_model_inputs_name_the_key(tmp_path):
    with pytest.raises(SpecError, match="model.shape.num_layers"):
        load_spec(
            None,
            [
                "model.shape={num_params_b: 7, num_layers: 0, hidden_size: 8, num_attention_heads: 1}"
            ],
        )
    with pytest.raises(ValueError, match="model.config: .* does not exist"):
        model_for(load_spec(None, [f"model.config={tmp_path / 'none.json'}"]).model)
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="lacks 'num_hidden_layers'"):
        model_for(load_spec(None, [f"model.config={tmp_path / 'bad.json'}"]).model)
    with pytest.raises(ValueError, match="model.name: unknown model"):
        model_for(load_spec(None, ["model.name=GPT-9"]).model)


def test_a_simulation_runs_on_a_model_given_by_its_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    spec = small_spec(model__name="llama", model__config=str(path))
    result = Simulation(spec).run()
    assert result.metrics["num_samples_trained"] == spec.run.iterations * spec.algorithm.batch_size
    assert build_cost_model(spec).weight_bytes == pytest.approx(2 * 6.74e9, rel=0.01)
    # the spec the run records holds the shape that ran and where it came from, so it
    # reruns alike without the file
    recorded = result.spec.model
    assert recorded.config is None and recorded.shape_source == str(path.resolve())
    assert recorded.shape == shape_from_hf_config(LLAMA2_7B_CONFIG)
    path.unlink()
    again = Simulation(spec.model_copy(update={"model": recorded})).run()
    assert again.metrics["throughput_samples_per_s"] == result.metrics["throughput_samples_per_s"]


def test_the_live_model_in_the_simulator_says_to_add_live():
    with pytest.raises(ValueError, match=r"unknown model 'tiny' \('tiny' is the live .*--live\)"):
        model("tiny")


@pytest.mark.parametrize(
    ("name", "tp", "bad"),
    [("Qwen2.5-7B", 3, "28 attention heads"), ("Qwen2.5-7B", 8, "28 attention heads"),
     ("Llama-2-13B", 16, "40 attention heads"), ("Qwen2.5-32B", 8, None),
     ("Mistral-7B", 16, None)],
)  # fmt: skip
def test_a_tp_vllm_cannot_shard_the_heads_over_is_refused(name, tp, bad):
    """Seen: tp 3 on Qwen2.5-7B (28 heads, 4 KV heads) simulated at 25 samples/s, and
    advise recommended it."""
    m = model(name)
    if bad is None:
        m.check_tp(tp)
        return
    with pytest.raises(ValueError, match=rf"^tp {tp} cannot shard .*{bad}"):
        m.check_tp(tp)
    cost = build_cost_model(load_spec(None, [f"model.name={name}"]))
    with pytest.raises(ValueError, match=rf"tp {tp} cannot shard"):  # what sim and advise ask
        cost.kv_capacity_tokens(Device("H800", tp))


SHAPE_14B = {  # the user trial's model.shape
    "num_params_b": 14.7, "num_layers": 48, "hidden_size": 5120, "intermediate_size": 13824,
    "num_attention_heads": 40, "num_kv_heads": 8, "vocab_size": 152064,
}  # fmt: skip


def test_a_models_csv_name_given_another_shape_is_refused(tmp_path):
    """Seen: ``--set model.name=Qwen2.5-7B`` on a spec with a 14.7B ``model.shape``
    simulated the 14.7B shape and labelled it Qwen2.5-7B."""
    spec = small_spec(model__name="Qwen2.5-7B", model__shape=SHAPE_14B)
    with pytest.raises(
        ValueError,
        match=r"^model\.name: 'Qwen2\.5-7B' is a row of models\.csv, but model\.shape gives",
    ) as info:
        model_for(spec.model)
    assert "num_layers 28 in models.csv, 48 in model.shape" in str(info.value)
    with pytest.raises(ValueError, match=r"^model\.name: "):  # run's and sweep's check
        check_sim_run(spec)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    with pytest.raises(ValueError, match=r"^model\.name: 'Qwen2\.5-7B' .*model\.config"):
        model_for(small_spec(model__name="Qwen2.5-7B", model__config=str(path)).model)


def test_a_models_csv_name_given_its_own_shape_runs(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))  # parameters counted: 6.74 B, about
    from_file = model_for(small_spec(model__name="Llama-2-7B", model__config=str(path)).model)
    assert from_file.kv_bytes_per_token == model("Llama-2-7B").kv_bytes_per_token
    row = model("Qwen2.5-7B")
    shape = {"num_params_b": 7.62, "num_layers": 28, "hidden_size": 3584,
             "intermediate_size": 18944, "num_attention_heads": 28, "num_kv_heads": 4,
             "vocab_size": 152064}  # fmt: skip
    assert model_for(small_spec(model__name="Qwen2.5-7B", model__shape=shape).model) == row


def test_the_tp_hint_lists_the_tps_that_shard_both_head_counts():
    """Seen: tp 7 on Qwen2.5-7B (28 query heads, 4 KV heads) was told to "pick a tp that
    divides 28"; 7 does, the 4 KV heads are what it cannot shard."""
    m = model("Qwen2.5-7B")
    with pytest.raises(ValueError, match=r"4 KV heads .*: 1, 2, 4, 28$"):
        m.check_tp(7)
    for tp in (1, 2, 4, 28):
        m.check_tp(tp)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("num_kv_heads", 7, "num_kv_heads 7 does not divide num_attention_heads 40"),
     ("hidden_size", 5121, "hidden_size 5121 is not a multiple of num_attention_heads 40")],
)  # fmt: skip
def test_a_shape_whose_heads_do_not_divide_names_the_field(field, value, says):
    """Seen: ``num_kv_heads: 7`` with 40 query heads, and ``hidden_size: 5121`` (its head
    size floored), ran without a word."""
    with pytest.raises(SpecError, match=rf"^model\.shape: {says}"):
        small_spec(model__shape={**SHAPE_14B, field: value})
    small_spec(model__shape={**SHAPE_14B, "hidden_size": 5121, "head_dim": 128})  # given


def test_every_models_csv_row_is_a_valid_shape():
    for row in model_table().values():
        fields = {f: getattr(row, f) for f in ModelShape.model_fields if hasattr(row, f)}
        fields["num_params_b"] = row.num_params / 1e9
        ModelShape(**fields)
        row.check_tp(1)
