"""A tiny random Llama with a word-level tokenizer and a chat template, saved with ``save_pretrained`` as a user's
model would be: what the command-line tests load through ``--model`` (built offline, in a second)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = (
    "the a of to and is in it with context manager method enter exit statement value python how what "
    "which order called block object return true false none when then else for while class def"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
)


def word_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[UNK]", "<eos>", "<user>", "<bot>", "Question:", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>")
    tokenizer.chat_template = chat_template
    return tokenizer


def save_model(path, context: int = 1024, chat_template: str | None = CHAT_TEMPLATE) -> str:
    tokenizer = word_tokenizer(chat_template)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=context,
        initializer_range=0.15, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def random_words(path, count: int = 3000, seed: int = 0) -> str:
    """A UTF-8 document of ``count`` random :data:`WORDS` at ``path``; returns the path."""
    gen = torch.Generator().manual_seed(seed)
    words = [WORDS[i] for i in torch.randint(0, len(WORDS), (count,), generator=gen)]
    path.write_text(" ".join(words), encoding="utf-8")
    return str(path)
