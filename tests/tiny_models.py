"""Tiny random Hugging Face models built on the spot (no downloads): a byte-level BPE
tokenizer trained on a few texts and a 1-layer Llama, for the TRL and transformers tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

SPECIALS = ["<unk>", "<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tiny_model(folder: Path, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer trained on `texts` and a 1-layer Llama with random weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                                eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    config = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=fast.pad_token_id,
        eos_token_id=fast.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder
