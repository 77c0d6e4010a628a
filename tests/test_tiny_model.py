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
