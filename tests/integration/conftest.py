"""Fixtures for the integration tier: tiny random models of every supported family, built from configs.

Models are float32, ``attn_implementation="sdpa"``, eval mode and seeded, so every run builds the same
weights. ``initializer_range`` is large (0.15) so the logits of a random model are well separated: with
the default 0.02 the logits are nearly flat and an argmax near-tie can flip between a one-token and a
multi-token forward in float32, which would make a greedy-equality check flaky for reasons unrelated
to TriForce. :func:`greedy_check` reports the top-2 logit gap at the first differing position so a
genuine near-tie can be told apart from a bug.

An equality check alone passes when TriForce quietly decodes plainly (every round a plain step gives plain
``generate()``'s tokens). So every greedy-equality and sampling check also reads the call's own statistics
(:func:`hf_triforce.last_stats` is reset at the start of every call) and asserts that the path it names ran:
:func:`check_ran` with what the case exercises (drafts at each level, rejections, round kinds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from unittest import mock

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import hf_triforce
from hf_triforce.hf import facts
from hf_triforce.hierarchy import static_steps
from hf_triforce.hierarchy.planner import Planner
from hf_triforce.stats import TriForceStats
from tests.support.sampled_runs import Sampler, one_thread, tiny_sampler
from tests.support.speculation import LEVEL1_DRAFTED, ForcedPlans, Ran, check_ran

VOCAB = 256
INITIALIZER_RANGE = 0.15
FAMILIES = ("llama_mha", "llama_gqa", "mistral", "qwen2", "qwen3")

_CLASSES = {
    "llama_mha": (LlamaConfig, LlamaForCausalLM, {}),
    "llama_gqa": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"use_sliding_window": False}),
    # Not in FAMILIES (the suites' matrix): fused qkv_proj / gate_up_proj and partial RoPE, for layout tests.
    "phi3": (Phi3Config, Phi3ForCausalLM, {"sliding_window": None, "partial_rotary_factor": 0.5}),
}


def build_model(family: str, num_layers: int = 2, seed: int = 0, vocab_size: int = VOCAB, enable: bool = True):
    """A tiny random causal LM of ``family`` (see ``FAMILIES``), float32, sdpa, eval mode.

    ``num_layers=1`` with another seed gives a *draft* model of the same family and vocabulary.
    ``enable=True`` calls ``hf_triforce.enable`` on it.
    """
    config_cls, model_cls, extra = _CLASSES[family]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4 if family == "llama_mha" else 2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    if enable:
        hf_triforce.enable(model)
    return model


def random_prompt(length: int, seed: int = 0, vocab_size: int = VOCAB) -> torch.LongTensor:
    """``[1, length]`` uniformly random token ids."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=gen)


def repetitive_prompt(length: int, period: int = 24, seed: int = 0, vocab_size: int = VOCAB) -> torch.LongTensor:
    """``[1, length]`` ids repeating a random ``period``-token pattern, so n-gram lookup always drafts."""
    pattern = random_prompt(period, seed, vocab_size)[0]
    return pattern.repeat(length // period + 1)[:length][None]


class ModelZoo:
    """Builds each (family, role) model once and hands out the same instance afterwards."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str], torch.nn.Module] = {}

    def target(self, family: str = "llama_gqa"):
        key = (family, "target")
        if key not in self._models:
            self._models[key] = build_model(family, num_layers=2, seed=FAMILIES.index(family))
        return self._models[key]

    def draft(self, family: str = "llama_gqa"):
        key = (family, "draft")
        if key not in self._models:
            self._models[key] = build_model(family, num_layers=1, seed=100 + FAMILIES.index(family), enable=False)
        return self._models[key]


@pytest.fixture(scope="module")
def zoo() -> ModelZoo:
    """Per-module cache of tiny models: ``zoo.target(family)``, ``zoo.draft(family)``."""
    return ModelZoo()


@pytest.fixture(scope="module")
def llama(zoo: ModelZoo):
    """The tiny Llama GQA target (2 layers, 4 query / 2 KV heads), TriForce-enabled."""
    return zoo.target("llama_gqa")


@pytest.fixture(scope="module")
def llama_draft(zoo: ModelZoo):
    """The tiny 1-layer Llama GQA draft model (same vocabulary)."""
    return zoo.draft("llama_gqa")


@pytest.fixture(scope="session")
def make_prompt() -> Callable[..., torch.LongTensor]:
    """``make_prompt(length, seed=0, repetitive=False)``."""

    def make(length: int, seed: int = 0, repetitive: bool = False) -> torch.LongTensor:
        return repetitive_prompt(length, seed=seed) if repetitive else random_prompt(length, seed=seed)

    return make


def top2_gap(model, ids: torch.LongTensor) -> float:
    """Gap between the two largest next-token logits of a full forward over ``ids``."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


@pytest.fixture(scope="session")
def assert_ran() -> Callable[..., None]:
    """``assert_ran(model_or_stats, ran=Ran(), **fields)``: the latest TriForce call on ``model`` (or the given
    stats) shows the path ``ran`` names; ``fields`` build a :class:`Ran` instead (``drafted=("level0", "level1")``)."""

    def check(target, ran: Ran | None = None, **fields) -> None:
        stats = target if isinstance(target, TriForceStats | dict) else hf_triforce.last_stats(target)
        check_ran(stats, ran if ran is not None else Ran(**fields))

    return check


def greedy_check(
    model, prompt: torch.LongTensor, triforce_config, max_new_tokens: int, ran: Ran = LEVEL1_DRAFTED, **kwargs
) -> torch.Tensor:
    """Assert TriForce greedy output equals plain greedy ``generate()`` and that the call ran the path ``ran`` names
    (by default: level 1 drafted; see :class:`Ran`); returns the plain output.

    On a mismatch the message names the first differing position and the top-2 logit gap of a full
    forward there (a gap near float32 noise, ~1e-5, means a genuine near-tie, otherwise a bug).
    """
    common = dict(max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    assistant = common.pop("assistant_model", None)
    expected = model.generate(prompt, **common)
    got = model.generate(prompt, triforce_config=triforce_config, assistant_model=assistant, **common)
    if not torch.equal(expected, got):
        n = min(expected.shape[1], got.shape[1])
        diff = (expected[0, :n] != got[0, :n]).nonzero()
        pos = int(diff[0, 0]) if diff.numel() else n
        gap = top2_gap(model, expected[:, :pos]) if pos < expected.shape[1] else float("nan")
        pytest.fail(
            f"TriForce greedy output differs from plain generate() at position {pos} (prompt {prompt.shape[1]}, "
            f"lengths {expected.shape[1]} vs {got.shape[1]}); top-2 logit gap there = {gap:.3g}; "
            f"config={triforce_config}\nexpected={expected[0, prompt.shape[1] :].tolist()}\n"
            f"got     ={got[0, prompt.shape[1] :].tolist()}"
        )
    check_ran(hf_triforce.last_stats(model), ran)
    return expected


@pytest.fixture(scope="session")
def assert_greedy_equal() -> Callable[..., torch.Tensor]:
    """``assert_greedy_equal(model, prompt, cfg, max_new_tokens, ran=Ran(), **generate_kwargs)``, see
    :func:`greedy_check`."""
    return greedy_check


@pytest.fixture
def transformers_level1(monkeypatch) -> None:
    """Level 1 runs transformers' forward, as on a GPU, where the plan would run its direct forward on these CPU
    models: the plan reads the model's layout as one the direct forward does not run."""
    monkeypatch.setattr(facts, "direct_forward_problem", lambda model: "the test asks for transformers' forward")


@pytest.fixture
def force_plans() -> Iterator[Callable[..., None]]:
    """``force_plans("levels", "level0", "plain")``: every planner of the test plans its rounds from the kinds in
    turn (a call without a level-0 drafter runs ``"levels"`` where ``"level0"`` comes)."""
    patches = []

    def force(*kinds: str) -> None:
        plans = ForcedPlans(kinds)
        patches.append(mock.patch.object(Planner, "plan_round", lambda planner, room=None: plans.plan_round(planner)))
        patches[-1].start()

    yield force
    for patch in reversed(patches):
        patch.stop()


@pytest.fixture(scope="session")
def model_factory() -> Callable[..., torch.nn.Module]:
    """``model_factory(family, num_layers=2, seed=0, vocab_size=256, enable=True)``: a fresh model, see
    :func:`build_model` (for tests that need their own instance, e.g. to compare with a never-enabled one)."""
    return build_model


@pytest.fixture(scope="module")
def sampler(model_factory) -> Sampler:
    """The sampling tests' tiny 8-token target, its 1-layer draft model and 100-token prompt, one per module, its
    samples memoized (:func:`~tests.support.sampled_runs.tiny_sampler`)."""
    return tiny_sampler(model_factory)


@pytest.fixture(scope="module")
def one_intra_op_thread() -> Iterator[None]:
    """One intra-op thread for a whole module (:func:`~tests.support.sampled_runs.one_thread`); the sampling modules
    ask for it with ``pytest.mark.usefixtures``."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def self_draft_config() -> Callable[..., hf_triforce.TriForceConfig]:
    """A factory of the configuration the self-drafting tests share: 8-token chunks, a ``budget``-token view with 16
    recent tokens, level 0 drafting 3 tokens with a StreamingLLM cache of ``budget`` tokens (4 sinks), level 1 8, a
    fixed schedule (every round through all three levels); ``overrides`` replace any of it. With the target as its
    own draft model and a budget that holds the whole context, every draft is accepted."""

    def make(budget: int, **overrides) -> hf_triforce.TriForceConfig:
        shared = dict(chunk_size=8, retrieval_budget=budget, recent_window=16, gamma1=3, gamma2=8, drafter="model",
                      draft_cache_budget=budget, adaptive=False)  # fmt: skip
        return hf_triforce.TriForceConfig(**{**shared, **overrides})

    return make


@pytest.fixture
def runners(monkeypatch) -> list[static_steps.StaticStepRunner]:
    """Every ``StaticStepRunner`` built during the test, to check which steps ran on the static path."""
    built: list[static_steps.StaticStepRunner] = []
    init = static_steps.StaticStepRunner.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(static_steps.StaticStepRunner, "__init__", record)
    return built


class ForwardCounter:
    """Counts forwards of the watched modules; the first forward fails the test when ``forbid`` is set."""

    def __init__(self, *modules: torch.nn.Module, forbid: bool = True) -> None:
        self.calls = 0
        self.forbid = forbid
        self.handles = [m.register_forward_pre_hook(self._hook) for m in modules]

    def _hook(self, module, args):
        self.calls += 1
        if self.forbid:
            pytest.fail(f"{type(module).__name__}.forward ran before the bad input was rejected")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.fixture
def forward_counter() -> type[ForwardCounter]:
    """``forward_counter(*modules, forbid=True)``: counts the modules' forwards; the first one fails the test
    unless ``forbid=False`` (bad inputs must be refused before any forward). Call ``.remove()`` when done."""
    return ForwardCounter
