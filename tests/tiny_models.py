"""Small transformers configs shared by the model, autograd and autocast tests
(random weights, built in-process: nothing is downloaded)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def bert_config(transformers, **overrides):
    settings = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
    }
    settings.update(overrides)
    return transformers.BertConfig(**settings)


def gpt2_config(transformers, **overrides):
    settings = {
        "vocab_size": 1000,
        "n_positions": 64,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    settings.update(overrides)
    return transformers.GPT2Config(**settings)
