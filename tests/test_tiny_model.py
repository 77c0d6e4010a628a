"""The embedded model's shape: it can sample no id its tokenizer cannot decode."""

import json

from transformers import AutoTokenizer

from runtime.model import TinyModelConfig, build_tiny_model
from runtime.tasks import VOCAB


def test_the_model_vocabulary_is_exactly_the_tokenizer(tmp_path):
    config = TinyModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, sft_steps=0)
    build_tiny_model(config, tmp_path)
    vocab_size = json.loads((tmp_path / "config.json").read_text())["vocab_size"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert vocab_size == len(tokenizer) == len(VOCAB)
    assert tokenizer.convert_ids_to_tokens(list(range(vocab_size))) == list(VOCAB)


def test_only_the_task_tokenizer_has_its_text_made_from_token_ids(tmp_path):
    """Another model (``model.path``) keeps its server's text: the task vocabulary's one
    character a token would turn its ids into garbage and its rewards with them."""
    from runtime.gen_client import GenerationClient
    from runtime.model import has_task_tokenizer

    config = TinyModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, sft_steps=0)
    build_tiny_model(config, tmp_path / "tiny")
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"hello": 0}}}))
    assert has_task_tokenizer(str(tmp_path / "tiny"))
    assert not has_task_tokenizer(str(other)) and not has_task_tokenizer(str(tmp_path))

    line = {"index": 0, "token_ids": [9, 7], "logprobs": [-0.1, -0.2], "text": "hi",
            "prompt_token_ids": [3], "finish_reason": "length", "version_start": 0,
            "version_end": 0}  # fmt: skip
    from policies.records import Request

    request = Request(0, 0, 0, 0, prompt_tokens=1, max_tokens=2, prompt="x")
    for task_tokens, text in ((True, "ge"), (False, "hi")):
        client = GenerationClient(0, "http://127.0.0.1:1", 1.0, task_tokens=task_tokens)
        assert client.for_instance(1, "http://127.0.0.1:2").task_tokens is task_tokens
        assert client._streamed(line, [request], 0.0, 0.0, 0.0).text == text
