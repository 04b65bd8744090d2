"""The device memory TriForce's caches take, term by term, known before anything is loaded: what
``hf-triforce estimate`` adds to plain decoding's weights and KV cache. Each term is an allocation size read off the
code that allocates it, exact: the ``RetrievalCache``, its chunk summaries and level 1's retrieval view (``tests/unit/
test_bench_memory.py`` checks each against the caches of real ``generate()`` calls).

Example:
    >>> from transformers import LlamaConfig
    >>> llama2_7b = LlamaConfig()  # its defaults are Llama-2-7B's shape
    >>> view_bytes(llama2_7b, 10**5, 2, TriForceConfig(retrieval_budget=4096)) / 2**20  # MiB, the fixed view
    2055.0
"""

from __future__ import annotations

from ..config import TriForceConfig
from ..hf.model import config_windows
from .bandwidth import head_dim, kv_bytes_per_token, kv_heads, text_config


def layer_keys_bytes(config, tokens: int, dtype_bytes: int) -> int:
    """Bytes of one layer's keys (or values) for ``tokens`` tokens: ``[1, kv_heads, tokens, head_dim]``. Exact.

    Example:
        >>> from transformers import LlamaConfig
        >>> layer_keys_bytes(LlamaConfig(), 1024, 2) / 2**20  # MiB, Llama-2-7B's shape
        8.0
    """
    return tokens * kv_heads(config) * head_dim(config) * dtype_bytes


def triforce_kv_bytes(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Bytes of the ``RetrievalCache``'s keys and values (``RetrievalCache.kv_nbytes()``). Exact.

    A full layer reserves ``full_cache_capacity(context)`` slots; a sliding layer (``SlidingLayer``) its window
    minus one and one round (``gamma1 + gamma2 + 1`` slots).

    Example:
        >>> from transformers import LlamaConfig
        >>> triforce_kv_bytes(LlamaConfig(), 1000, 2, TriForceConfig(gamma2=6)) / 2**19  # Llama-2-7B's shape
        1008.0
        >>> from transformers import MistralConfig
        >>> shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> triforce_kv_bytes(MistralConfig(**shape, sliding_window=64), 1000, 2, TriForceConfig()) // 128  # slots
        144
    """
    config, tc = text_config(config), triforce_config
    per_layer = kv_bytes_per_token(config, dtype_bytes) // config.num_hidden_layers
    round_slots = tc.gamma1 + tc.gamma2 + 1
    slots = (tc.full_cache_capacity(context) if w is None else w - 1 + round_slots for w in config_windows(config))
    return per_layer * sum(slots)


def summaries_bytes(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Bytes of the chunk summaries: ``capacity // chunk_size + 1`` mean keys per full layer and KV head. Exact.

    Example:
        >>> from transformers import LlamaConfig
        >>> summaries_bytes(LlamaConfig(), 1000, 2, TriForceConfig(chunk_size=8)) / 2**13 / 32  # Llama-2-7B's shape
        127.0
    """
    config = text_config(config)
    chunks = triforce_config.full_cache_capacity(context) // triforce_config.chunk_size + 1
    full = sum(w is None for w in config_windows(config))  # sliding layers have none
    return full * layer_keys_bytes(config, chunks, dtype_bytes)


def static_view(triforce_config: TriForceConfig) -> bool:
    """Whether the view may be the fixed-capacity ``StaticRetrievalView``: ``cuda_graphs`` not ``False`` (the model is
    of a GPU, where the default ``"auto"`` runs it; on a CPU ``"auto"`` runs the dynamic view)."""
    return triforce_config.cuda_graphs is not False


def view_bytes(config, context: int, dtype_bytes: int, triforce_config: TriForceConfig) -> int:
    """Bytes of one retrieval view: ``selected + TriForceConfig.view_extra_capacity`` slots per layer (on the dynamic
    path rounded up to whole chunks).

    On the static path that is ``TriForceConfig.view_capacity`` (``selected`` is the budget); on the dynamic
    path ``selected`` is at most ``min(retrieval_budget, context)``, and exactly the budget when the selection
    fills it (a cache of ``length`` tokens with ``(length - recent_window) % chunk_size == 0``). Exact in those
    cases, else an upper bound (``TriForceStats.view_bytes`` reports the measured size).

    Example:
        >>> from transformers import LlamaConfig
        >>> view_bytes(LlamaConfig(), 10**5, 2, TriForceConfig(retrieval_budget=4096, cuda_graphs=False)) / 2**20
        2056.0
    """
    tc = triforce_config
    tc = tc.for_context(context)
    slots = min(tc.retrieval_budget, context) + tc.view_extra_capacity
    slots = tc.view_capacity if static_view(tc) else tc.whole_chunks(slots)  # RetrievalView: whole chunks
    return slots * kv_bytes_per_token(text_config(config), dtype_bytes)
