"""A multi-turn chat that continues each turn from the cache the previous ``generate()`` call returned (the real
model tests' helper; examples/multi_turn_chat.py shows the same reuse as a tutorial)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hf_triforce.hf.versions import cache_kwargs, output_cache
from hf_triforce.hierarchy.drafter import common_prefix_length


@dataclass
class Chat:
    """A conversation with a model, one ``generate()`` call per user turn, each reusing the last call's cache.

    Turn ``n`` renders the whole conversation with the tokenizer's chat template and passes the cache turn
    ``n - 1`` returned (``return_dict_in_generate=True``), so only the tokens after the cached ones are
    prefilled. Where re-rendering the earlier answer does not reproduce the generated tokens (the template adds
    its end-of-turn tokens), the cache is first cropped (``Cache.crop``) to the longest common prefix.

    Attributes:
        model: the model (``hf_triforce.enable``-d when ``generate_kwargs`` has a ``triforce_config``).
        tokenizer: its tokenizer, with a chat template.
        generate_kwargs: every turn's ``generate()`` arguments (``max_new_tokens``, ``triforce_config``, ...).
        messages: the conversation so far (``{"role", "content"}`` dicts).
        prompts: per turn, the tokens of its prompt (the whole conversation so far).
        prefilled: per turn, the prompt tokens that turn prefilled (the rest came from the cache).
        sequences: ``[1, n]`` the last turn's ``sequences``.
        cache: the cache the last turn returned.

    Example:
        >>> chat = Chat(model, tokenizer, {"max_new_tokens": 64, "triforce_config": TriForceConfig()})  # doctest: +SKIP
        >>> chat.say(f"{document}\\n\\nWhat is this about?")  # doctest: +SKIP
        >>> chat.say("And in one sentence?")  # doctest: +SKIP
    """

    model: Any
    tokenizer: Any
    generate_kwargs: dict[str, Any]
    messages: list[dict[str, str]] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)
    sequences: torch.LongTensor | None = None
    cache: Any = None

    def say(self, text: str) -> str:
        """Add a user message, generate the answer (reusing the cache), add it to the conversation, return it."""
        self.messages.append({"role": "user", "content": text})
        ids = self._render()
        self.prompts.append(ids.shape[1])
        reuse = self._reusable(ids)
        out = self.model.generate(ids, return_dict_in_generate=True, **reuse, **self.generate_kwargs)
        self.sequences, self.cache = out.sequences, output_cache(out)
        answer = self.tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True).strip()
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _render(self) -> torch.LongTensor:
        rendered = self.tokenizer.apply_chat_template(
            self.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return rendered["input_ids"]

    def _reusable(self, ids: torch.LongTensor) -> dict[str, Any]:
        """The cache to pass (cropped to what ``ids`` starts with), or nothing on the first turn."""
        if self.cache is None:
            self.prefilled.append(ids.shape[1])
            return {}
        cached = self.sequences[0, : self.cache.get_seq_length()]
        keep = min(common_prefix_length(cached, ids[0]), ids.shape[1] - 1)
        if keep < self.cache.get_seq_length():
            self.cache.crop(-(self.cache.get_seq_length() - keep))  # negative: tokens to remove (transformers >= 5.18)
        self.prefilled.append(ids.shape[1] - keep)
        return cache_kwargs(self.cache)
