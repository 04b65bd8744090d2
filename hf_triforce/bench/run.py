"""The end-to-end benchmark: plain ``generate()`` vs TriForce on a real model and a long document.

With ``tp=N`` (``hf-triforce bench --tp N`` under ``torchrun --nproc-per-node N``) the model is loaded sharded over
the ranks (:mod:`.tp_launch` checks the launch first); every rank runs every row and rank 0's results carry each
rank's own figures (:mod:`.rank_figures`).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import TriForceConfig
from ..errors import TriForceConfigError
from ..generation import enable
from ..hf.linears import int4_weight_copy, int8_weight_copy
from ..hf.model import attn_implementation, context_limit
from ..hf.processors import answer_repetition_penalty, custom_processor_replaces_builtin
from .backend import preferred_attn_implementation
from .bandwidth import device_bandwidth, kv_bytes_per_token
from .batch import modeled_batch_results, run_batch_benchmark
from .comparison import compare
from .documents import DEFAULT_QUESTION, DocumentError, DocumentQuestion, question_prompt
from .generate_kwargs import generate_kwargs
from .loading import load_model
from .machine import machine_info
from .memory_fit import check_batch_fits, check_fits, longest_context
from .plain_baselines import DEFAULT_PLAIN
from .prefix import Prefix
from .profile import profile_phases
from .prompt_set import BENCH_PROMPTS, BenchPrompt, prompt_record, user_prompt
from .prompt_set import bench_prompt as bench_prompt_named
from .rank_figures import attach_rank_figures, gather_rank_figures, is_report_rank, rank_figures
from .real_acceptance import real_acceptance
from .repetition import DEFAULT_REPETITION_PENALTY, loops, repeated_fraction
from .report import modeled_speedups
from .shapes import kv_heads, preset_config, random_model
from .sharding import local_shard, sharded_loading_kwargs
from .summary import attach_floors, summarize
from .tp_launch import check_tensor_parallel, quiet_other_ranks, rank_device, torchrun_command

logger = logging.getLogger(__name__)


@dataclass
class BenchOptions(DocumentQuestion):
    """A sweep: every combination of prompt, prompt length, temperature, budget, drafter and tree budget is measured.

    By default the prompts are the seven documents and questions of
    :data:`~hf_triforce.bench.prompt_set.BENCH_PROMPTS` (one per genre); a ``document`` or a
    ``question`` of the user's replaces them with that one prompt (the question defaulting to the demo's).
    Every row times the plain decodings of ``plain`` (the fastest is "best plain") beside TriForce, each from a
    copy of the prompt's one prefill (:mod:`.prefix`), with the demo's penalty on the answer's own repetitions
    (``repetition_penalty``; None or 1.0 for none) given to every run alike.
    """

    question: str | None = None
    prompts: list[str] | None = None  # names from BENCH_PROMPTS (None: all of them)
    plain: list[str] = field(default_factory=lambda: list(DEFAULT_PLAIN))
    repetition_penalty: float | None = DEFAULT_REPETITION_PENALTY

    prompt_tokens: list[int | str] = field(default_factory=lambda: [7000])  # "max": the longest that fits (CUDA)
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6])
    budgets: list[int] = field(default_factory=lambda: [TriForceConfig.retrieval_budget])  # the config's defaults
    drafters: list[str] = field(default_factory=lambda: [TriForceConfig.drafter])
    tree_budgets: list[int | str] = field(default_factory=lambda: ["auto"])  # TriForceConfig.tree_budget, each a row
    new_tokens: int = 128
    top_p: float = 0.9
    gamma1: int | None = None
    gamma2: int | None = None
    seed: int = 0
    profile: bool = False
    preset: str | None = None
    draft_preset: str | None = None
    device: str | None = None
    dtype: str | None = None
    prefill_chunk_size: int | None = None
    rescore_candidates: int | None = None  # TriForceConfig.rescore_candidates (None: the config's default)
    level1_weights: str | None = None  # TriForceConfig.level1_weights (None: the config's default)
    offload_kv: bool = False  # TriForceConfig.offload_kv
    attn_implementation: str = "auto"
    real_acceptance: str | float | None = None
    cuda_graphs: bool | str = TriForceConfig.cuda_graphs
    prompt_lookup: int | None = None
    adaptive: bool = True
    tp: int = 1  # tensor-parallel ranks: run under torchrun --nproc-per-node tp
    batch_size: int = 1  # > 1: rows of different documents and questions, plain batched generate() vs TriForce
    repeats: int = 1  # interleaved (plain, TriForce) pairs per configuration; the median pair is reported


def run_benchmark(options: BenchOptions, command: str = "") -> dict[str, Any]:
    """Measure every combination of ``options``; returns ``{"title", "command", "machine", "rows"}``.

    Each row compares plain ``generate()`` and TriForce on the same prompt in this process (prefill
    excluded, warm-up done). Both are forced to produce exactly ``new_tokens`` tokens
    (``min_new_tokens``), so an early end-of-sequence cannot skew the per-token figures.

    With ``options.tp > 1`` every ``torchrun`` rank calls it: the launch, the options and the model's KV heads
    are checked before anything is loaded (:func:`~.tp_launch.check_tensor_parallel`), the model is loaded
    sharded, and the results (the same on every rank) add each rank's figures (``row["ranks"]``,
    ``row["same_text_on_all_ranks"]``, ``results["tensor_parallel"]``); only rank 0 should write them.

    Example:
        >>> run_benchmark(BenchOptions(prompt_tokens=[7000], temperatures=[0.0]))  # doctest: +SKIP
    """
    check_tensor_parallel(options, command)
    _check_repeats(options)
    if options.batch_size > 1:
        return _batch_benchmark(options, command)
    if options.tp > 1:
        quiet_other_ranks()
    prompt_lengths = _checked_prompt_lengths(options)
    prompts = bench_prompts(options) if options.preset is None else [None]  # a random-weights shape: random ids
    model, tokenizer, assistant = load_bench_models(options, max(prompt_lengths))
    limit = context_limit(model)
    rows, own, quiet = [], [], not is_report_rank()
    for prompt, tokens in tqdm(list(itertools.product(prompts, prompt_lengths)), desc="prompts", disable=quiet):
        ids = bench_prompt(options, tokenizer, prompt, tokens, limit, model)
        prefix = _prefix(options, model, ids)
        sweep = itertools.product(options.temperatures, options.budgets, options.drafters, options.tree_budgets)
        for temperature, budget, drafter, tree_budget in sweep:
            row = _measure_row(options, model, assistant, ids, prefix, temperature, budget, drafter, tree_budget)
            row.update(_answer_facts(prompt, row, prefix))
            rows.append(row)
            if options.tp > 1:
                own.append(rank_figures(row.pop("_comparison"), ids.shape[1]))
            row.pop("_comparison", None)
    results = {"title": "plain generate() vs TriForce", "command": command, "machine": machine_info(), "rows": rows}
    attach_floors(rows, device_bandwidth(results["machine"]["cuda_device"]))
    results["summary"] = summarize(rows)
    if options.tp > 1:
        results["command"] = torchrun_command(options.tp, command)
        attach_rank_figures(results, gather_rank_figures(own), kv_heads(model.config.get_text_config()))
    return results


def _measure_row(
    options: BenchOptions, model, assistant, ids, prefix, temperature, budget, drafter, tree_budget="auto"
) -> dict[str, Any]:
    """One comparison (plain decodings, TriForce, prompt lookup) on ``ids``; its JSON-ready row."""
    config = _config(options, budget, drafter, tree_budget)
    kwargs = generate_kwargs(options.new_tokens, temperature, options.top_p, min_new_tokens=options.new_tokens)
    if options.repetition_penalty not in (None, 1.0) and options.preset is None:
        kwargs.update(answer_repetition_penalty(options.repetition_penalty, ids.shape[1]))
    extra = {"assistant_model": assistant} if assistant is not None and drafter in ("auto", "model") else {}
    on_cpu = model.device.type == "cpu" and options.tp == 1  # the CPU linear patch is per process
    plain = options.plain if options.tp == 1 else ()
    with custom_processor_replaces_builtin():
        result = compare(model, ids, config, seed=options.seed, reference_fast_linears=on_cpu, repeats=options.repeats,
                         plain_prefill_chunk_size=options.prefill_chunk_size, prefix=prefix, plain_decodings=plain,
                         prompt_lookup_tokens=options.prompt_lookup, **extra, **kwargs)  # fmt: skip
    row = {"prompt_tokens": ids.shape[1], "temperature": temperature, "budget": budget, "drafter": drafter}
    row["tree_budget"] = tree_budget
    row.update(result.to_dict(), config=config.to_dict(), weight_bytes=_weight_bytes(model))
    if model.device.type == "cuda":  # what the level-1 floor reads: floors exist on a GPU only
        row["level1_weight_bytes"] = _level1_weight_bytes(model, row["triforce"]["triforce"].get("level1_weights"))
    row.update(shape=options.preset or "model", random_weights=options.preset is not None)
    row["model_config"] = _shape_facts(model)
    kv_per_token = kv_bytes_per_token(model.config.get_text_config(), model.dtype.itemsize)
    row["kv_bytes_per_token"] = kv_per_token // options.tp  # a rank's share under tensor parallelism
    if options.real_acceptance is not None:
        spec = options.real_acceptance
        row["real_acceptance"] = real_acceptance(spec, budget, row["prompt_tokens"], temperature).to_dict()
    row["modeled_speedup"] = modeled_speedups(row)
    if options.profile:
        torch.manual_seed(options.seed)
        row["profile"] = profile_phases(model, ids, triforce_config=config, **extra, **kwargs)
    logger.info("%s: %.2fx best plain (%s), %.2fx default", ids.shape[1], result.speedup_best_plain,
                result.best_plain, result.speedup)  # fmt: skip
    row["_comparison"] = result
    return row


def _prefix(options: BenchOptions, model, ids: torch.LongTensor) -> Prefix | None:
    """The prompt prefilled once for every call of its rows on the CPU, where a 7K prefill costs ~45 s; on a GPU
    (where copies of a 128K cache would not fit beside the model) and under tensor parallelism, fresh calls."""
    if options.tp > 1 or model.device.type != "cpu":
        return None
    return Prefix(model, ids, options.new_tokens, chunk_size=options.prefill_chunk_size)


def _answer_facts(prompt: BenchPrompt | None, row: dict[str, Any], prefix: Prefix | None) -> dict[str, Any]:
    """Which prompt a row asked, whether its answer loops (then it is left out of every summary), the prefill."""
    comparison = row["_comparison"]
    answers = [run.sequences[0, row["prompt_tokens"] :].tolist() for run in (comparison.plain, comparison.triforce)]
    facts: dict[str, Any] = {"prompt": None if prompt is None else prompt_record(prompt)}
    if prompt is not None:  # sampled, the two answers differ: the row loops if either does
        facts["answer_repeated_fraction"] = max(repeated_fraction(a) for a in answers)
        facts["loops"] = any(loops(a) for a in answers)
    if prefix is not None:
        facts["prefix_prefill_seconds"] = dict(prefix.prefill_seconds)
    return facts


def _batch_benchmark(options: BenchOptions, command: str) -> dict[str, Any]:
    """``--batch-size N``: :func:`~.batch.run_batch_benchmark` on the real model (checked before loading)."""
    if options.preset is not None:  # a GPU shape: the bandwidth model's batch figures, labelled as modeled
        return modeled_batch_results(options, command)
    unsupported = {
        "--tp": options.tp > 1,
        "--prompt-lookup": options.prompt_lookup is not None,
        "--profile": options.profile,
        "--draft-preset / drafter model": options.draft_preset is not None or "model" in options.drafters,
        "--prompt-tokens max": "max" in options.prompt_tokens,
    }
    bad = [name for name, hit in unsupported.items() if hit]
    if bad:
        raise TriForceConfigError(f"--batch-size {options.batch_size} does not go with {', '.join(bad)}.")
    model, tokenizer, _ = load_bench_models(options, max(options.prompt_tokens))
    enable(model)
    configs = [_config(options, b, d) for b, d in itertools.product(options.budgets, options.drafters)]
    if model.device.type == "cuda":  # before any generate(): the batch must fit beside the loaded weights
        available = torch.cuda.mem_get_info(model.device)[0] + _weight_bytes(model)
        context = max(options.prompt_tokens) + options.new_tokens + 64  # + the question and the chat template
        for config in configs:
            check_batch_fits(model.config, options.batch_size, context, model.dtype.itemsize, config, available)
    return run_batch_benchmark(options, model, tokenizer, configs, command)


def _check_repeats(options: BenchOptions) -> None:
    """``repeats`` is a positive count, for the one-sequence benchmark on one process (refused elsewhere)."""
    if not isinstance(options.repeats, int) or options.repeats < 1:
        raise TriForceConfigError(f"repeats must be an integer >= 1, got {options.repeats!r}.")
    if options.repeats > 1 and (options.batch_size > 1 or options.tp > 1):
        raise TriForceConfigError(
            "--repeats measures interleaved pairs of the one-sequence benchmark; it is not implemented with "
            "--batch-size or --tp. Run the command several times instead."
        )


def _checked_prompt_lengths(options: BenchOptions) -> list[int]:
    """``options.prompt_tokens`` with ``"max"`` resolved; for a shape preset on CUDA, each checked to fit.

    Raises:
        MemoryBudgetError: a length does not fit the GPU's free memory (before anything is loaded).
        ValueError: ``"max"`` without a shape preset on a CUDA device.
    """
    cases = _memory_cases(options)
    if "max" in options.prompt_tokens and not cases:
        raise TriForceConfigError(
            "--prompt-tokens max (the longest context that fits) needs --preset and --device cuda."
        )
    if "max" in options.prompt_tokens:
        longest = min(longest_context(**c) for c in cases) - options.new_tokens
    lengths = [longest if t == "max" else t for t in options.prompt_tokens]
    for tokens, case in itertools.product(lengths, cases):
        check_fits(context=tokens + options.new_tokens, **case)
    return lengths


def _memory_cases(options: BenchOptions) -> list[dict[str, Any]]:
    """The :func:`~hf_triforce.bench.memory_fit.check_fits` arguments of each budget and drafter of a shape
    preset on a CUDA device, against the GPU's free memory now; empty otherwise (nothing to check)."""
    device = torch.device(options.device or "cpu")
    if options.preset is None or device.type != "cuda":
        return []
    common = dict(
        config=preset_config(options.preset, 1),
        dtype_bytes=getattr(torch, options.dtype or "float32").itemsize,
        available_bytes=torch.cuda.mem_get_info(device)[0],
        plain_prefill_chunk=options.prefill_chunk_size,
    )
    draft = preset_config(options.draft_preset, 1) if options.draft_preset else None
    return [
        dict(common, triforce_config=_config(options, budget, drafter), draft_config=draft)
        for budget, drafter in itertools.product(options.budgets, options.drafters)
    ]


def _config(options: BenchOptions, budget: int, drafter: str, tree_budget: int | str = "auto") -> TriForceConfig:
    names = ("gamma1", "gamma2", "prefill_chunk_size", "rescore_candidates", "level1_weights")
    extra = {k: getattr(options, k) for k in names if getattr(options, k) is not None}
    return TriForceConfig(
        retrieval_budget=budget, drafter=drafter, cuda_graphs=options.cuda_graphs, adaptive=options.adaptive,
        offload_kv=options.offload_kv, tree_budget=tree_budget, **extra,
    )  # fmt: skip


def _weight_bytes(model) -> int:
    """Bytes of the model's parameters this process holds (tied weights counted once; a rank's shards under
    tensor parallelism): what every forward reads."""
    shards = [local_shard(p) for p in model.parameters()]
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in shards}.values())


def _level1_weight_bytes(model, weights: str | None) -> int:
    """Bytes a level-1 step reads as weights: the model's (:func:`_weight_bytes`), with each projection of level 1's
    int8 or int4 copy counted at the copy's size (the copy the call made, kept beside the model; asked for on a GPU
    only, where level 1 runs transformers' forward over that copy: on the CPU the direct forward holds its own, and
    this would quantize the model once more for a floor the CPU has not)."""
    full = _weight_bytes(model)
    make = {"int8": int8_weight_copy, "int4": int4_weight_copy}.get(weights or "")
    if make is None:
        return full
    copy = make(model)
    own = sum(layer.weight.numel() * layer.weight.element_size() for layer in copy)
    return full - own + sum(weight.nbytes() for weight in copy.values())


def load_bench_models(options: BenchOptions, longest_prompt: int):
    """``(target, tokenizer or None, assistant or None)`` as ``hf-triforce bench`` loads them for ``options``: on the
    requested device and dtype, sharded under ``--tp``, random weights of a ``--preset`` shape sized for
    ``longest_prompt`` tokens and the new ones (no tokenizer then).

    Example:
        >>> model, tokenizer, assistant = load_bench_models(BenchOptions(), 4096)  # doctest: +SKIP
    """
    dtype = getattr(torch, options.dtype) if options.dtype else None
    device = rank_device() if options.tp > 1 else options.device or "cpu"
    attn = preferred_attn_implementation(device, options.attn_implementation)
    logger.info("attention implementation: %s", attn)
    if options.tp > 1:
        model, tokenizer = load_model(options.model, attn, dtype or torch.float32, **sharded_loading_kwargs())
        device = model.device
    elif options.preset is not None:
        context = longest_prompt + options.new_tokens + 64
        model = random_model(options.preset, context, dtype or torch.float32, device, options.seed, attn)
        tokenizer = None
    else:
        model, tokenizer = load_model(options.model, attn)
        model = model.to(device=device, dtype=dtype) if dtype else model.to(device)
    assistant = None
    if options.draft_preset is not None:
        context = model.config.max_position_embeddings
        assistant = random_model(options.draft_preset, context, model.dtype, device, options.seed + 1, attn)
        if assistant.config.vocab_size != model.config.vocab_size:
            assistant.resize_token_embeddings(model.config.vocab_size)
    return model, tokenizer, assistant


def bench_prompts(options: BenchOptions) -> list[BenchPrompt]:
    """The prompts ``options`` asks for: :data:`~hf_triforce.bench.prompt_set.BENCH_PROMPTS` (or those
    named by ``options.prompts``), or one prompt of the user's ``document``/``question``.

    Raises:
        DocumentError: an unknown prompt name, or a user's document that cannot be read (before any model work).

    Example:
        >>> [p.name for p in bench_prompts(BenchOptions(prompts=["code", "table"]))]
        ['code', 'table']
    """
    if options.document is not None or options.question is not None:
        if options.prompts is not None:
            raise DocumentError(
                "--prompts chooses among the bench's own documents: drop it with --document/--question."
            )
        return [user_prompt(options.document, options.question or DEFAULT_QUESTION)]
    names = options.prompts or [p.name for p in BENCH_PROMPTS]
    return [bench_prompt_named(name) for name in names]


def bench_prompt(
    options: BenchOptions, tokenizer, prompt: BenchPrompt | None, tokens: int, limit, model
) -> torch.LongTensor:
    """``[1, n]`` prompt ids on ``model``'s device, as ``hf-triforce bench`` builds them: the chat prompt asking
    ``prompt``'s question about its document's first ``tokens`` tokens (at most ``limit`` tokens with the new ones),
    or seeded random ids of length ``tokens`` when ``tokenizer`` is None (a random-weights shape).

    Example:
        >>> ids = bench_prompt(BenchOptions(), tokenizer, BENCH_PROMPTS[0], 7000, 8192, model)  # doctest: +SKIP
    """
    if tokenizer is None:
        generator = torch.Generator().manual_seed(options.seed)
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)
    else:
        ids = question_prompt(tokenizer, prompt.text(), prompt.question, tokens, limit, options.new_tokens)
    return ids.to(model.device)


def _shape_facts(model) -> dict[str, Any]:
    c = model.config.get_text_config()
    names = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size")
    facts = {k: getattr(c, k) for k in names}
    dtype = str(model.dtype).removeprefix("torch.")
    return {**facts, "dtype": dtype, "attn_implementation": attn_implementation(model)}
