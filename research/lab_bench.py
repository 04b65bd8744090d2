"""The project's own bench: ``hf-triforce bench`` and what only the project's measurements need, from a checkout.

Beyond the product's options (``hf-triforce bench --help``):

* ``--preset`` / ``--draft-preset``: random weights of a model's shape (:mod:`.shapes`), speed at the paper's scale
  without downloading weights (acceptance is meaningless with random weights); ``--prompt-tokens max`` the longest
  context that fits the GPU (:mod:`.memory_fit`, checked before anything is loaded);
* ``--real-acceptance``: a rate, or a recorded draft-quality JSON, for the speedup the measured latencies model with
  a real model's acceptance (:mod:`.real_acceptance`);
* ``--tp N`` under ``torchrun``: tensor parallelism, every rank's figures on rank 0 (:mod:`.tp_launch`,
  :mod:`.sharding`, :mod:`.rank_figures`);
* ``--batch-size N``: plain batched ``generate()`` against batched TriForce (:mod:`.batch`; with ``--preset``, the
  bandwidth model's batch figures);
* ``--profile`` (torch.profiler's operators per phase, :mod:`.profile`), ``--plot`` (:mod:`.plot`) and ``--repeats N``
  (interleaved pairs, the median reported: timings on a shared machine);
* every row also times plain decoding with hf_triforce's CPU linear fast path (on the CPU) and transformers' assisted
  generation (with a draft model), and sets each step beside its bandwidth floor (a GPU of known bandwidth).

The report is the product's page with the lab's sections after it (:mod:`.lab_report`).

Example:
    >>> args = build_parser().parse_args(["--preset", "tiny", "--prompt-tokens", "1k,max"])
    >>> args.preset, lab_options(args).prompt_tokens
    ('tiny', [1024, 'max'])

From the repository root: ``python -m research.lab_bench --preset llama3.1-8b --device cuda --dtype bfloat16 ...``,
or ``torchrun --nproc-per-node 2 -m research.lab_bench --tp 2 --model <dir> ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from hf_triforce.bench.backend import preferred_attn_implementation
from hf_triforce.bench.bandwidth import kv_bytes_per_token, kv_heads
from hf_triforce.bench.documents import question_prompt
from hf_triforce.bench.loading import load_model
from hf_triforce.bench.report import write_results
from hf_triforce.bench.run import (
    BenchOptions,
    answer_facts,
    bench_config,
    bench_prefix,
    bench_prompts,
    bench_results,
    measure_row,
    row_generate_kwargs,
)
from hf_triforce.bench.timed_run import measure
from hf_triforce.cli import add_bench_arguments, bench_options, run_command, token_counts
from hf_triforce.errors import TriForceConfigError
from hf_triforce.generation import enable
from hf_triforce.hf.linears import int4_weight_copy, int8_weight_copy, swapped_linears
from hf_triforce.hf.model import context_limit
from hf_triforce.hf.versions import cache_kwargs

from .batch import modeled_batch_results, run_batch_benchmark
from .lab_report import attach_floors, device_bandwidth, lab_markdown, modeled_speedups
from .memory_fit import check_batch_fits, check_fits, longest_context
from .profile import profile_phases
from .rank_figures import attach_rank_figures, end_ranks, gather_rank_figures, is_report_rank, rank_figures
from .real_acceptance import parse_real_acceptance, real_acceptance
from .shapes import PRESETS, preset_config, random_model
from .sharding import local_shard, sharded_loading_kwargs
from .tp_launch import check_tensor_parallel, quiet_other_ranks, rank_device, torchrun_command

logger = logging.getLogger(__name__)

SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size")


@dataclass
class LabOptions(BenchOptions):
    """:class:`~hf_triforce.bench.run.BenchOptions` and the lab's own: a ``prompt_tokens`` entry may be ``"max"``."""

    profile: bool = False
    preset: str | None = None
    draft_preset: str | None = None
    real_acceptance: str | float | None = None
    tp: int = 1  # tensor-parallel ranks: run under torchrun --nproc-per-node tp
    repeats: int = 1  # interleaved (plain, TriForce) pairs per configuration; the median pair is reported
    batch_size: int = 1  # > 1: rows of different documents and questions, plain batched generate() vs TriForce


def run_lab(options: LabOptions, command: str = "") -> dict[str, Any]:
    """The product's sweep (:func:`hf_triforce.bench.run.run_benchmark`) with the lab's options.

    With ``options.tp > 1`` every ``torchrun`` rank calls it: the launch, the options and the model's KV heads are
    checked before anything is loaded, the model is loaded sharded, and the results (the same on every rank) add
    each rank's figures (``row["ranks"]``, ``results["tensor_parallel"]``); only rank 0 should write them.
    """
    check_tensor_parallel(options, command)
    if not isinstance(options.repeats, int) or options.repeats < 1:
        raise TriForceConfigError(f"repeats must be an integer >= 1, got {options.repeats!r}.")
    if options.repeats > 1 and (options.batch_size > 1 or options.tp > 1):
        raise TriForceConfigError("--repeats measures interleaved pairs of one process's one-sequence benchmark.")
    if options.batch_size > 1:
        return _batch_benchmark(options, command)
    if options.tp > 1:
        quiet_other_ranks()
    lengths = _checked_prompt_lengths(options)
    prompts = bench_prompts(options) if options.preset is None else [None]  # a random-weights shape: random ids
    model, tokenizer, assistant = load_lab_models(options, max(lengths))
    limit = context_limit(model)
    rows, own = [], []
    for prompt, tokens in tqdm(list(itertools.product(prompts, lengths)), desc="prompts", disable=not is_report_rank()):
        ids = _prompt_ids(options, tokenizer, prompt, tokens, limit, model)
        prefix = bench_prefix(options, model, ids) if options.tp == 1 else None
        sweep = itertools.product(options.temperatures, options.budgets, options.drafters, options.tree_budgets)
        for cell in sweep:
            row, comparison = _measured(options, model, assistant, ids, prefix, *cell)
            row.update(answer_facts(prompt, row, comparison, prefix))
            row.update(_lab_facts(options, model, assistant, ids, row))
            rows.append(row)
            if options.tp > 1:
                own.append(rank_figures(comparison, ids.shape[1]))
    results = bench_results(rows, command)
    attach_floors(rows, device_bandwidth(results["machine"]["cuda_device"]))
    if options.tp > 1:
        results["command"] = torchrun_command(options.tp, command)
        attach_rank_figures(results, gather_rank_figures(own), kv_heads(model.config.get_text_config()))
    return results


def _measured(options: LabOptions, model, assistant, ids, prefix, temperature, *sweep) -> tuple[dict[str, Any], Any]:
    """The product's row (:func:`~hf_triforce.bench.run.measure_row`), ``--repeats`` times (sampled: seeds seed,
    seed + 1, ...; the row is the pair of median speedup), then the lab's extra runs: plain decoding with the CPU
    linear fast path, and transformers' assisted generation with the draft model."""
    per_process = {} if options.tp == 1 else {"plain_decodings": ()}  # best plain is measured on one process
    runs = []
    for i in range(options.repeats):
        seeded = dataclasses.replace(options, seed=options.seed + (i if temperature > 0 else 0))
        runs.append(measure_row(seeded, model, assistant, ids, prefix, temperature, *sweep, **per_process))
    row, comparison = sorted(runs, key=lambda run: run[0]["speedup"])[(len(runs) - 1) // 2]
    if options.repeats > 1:
        row["repeats"] = [{"plain_tokens_per_second": r["plain"]["tokens_per_second"],
                           "triforce_tokens_per_second": r["triforce"]["tokens_per_second"], "speedup": r["speedup"]}
                          for r, _ in runs]  # fmt: skip
        row["identical_output"] = all(r["identical_output"] for r, _ in runs)
    kwargs = row_generate_kwargs(options, temperature, ids.shape[1])
    if prefix is None and options.prefill_chunk_size:
        kwargs["prefill_chunk_size"] = options.prefill_chunk_size
    start = lambda: {} if prefix is None else cache_kwargs(prefix.copy())  # noqa: E731
    if model.device.type == "cpu" and options.tp == 1:  # the CPU linear patch is per process
        with swapped_linears([model]):
            row["plain_fast_linears"] = measure(model, ids, seed=options.seed, **start(), **kwargs).to_dict()
    if assistant is not None and row["drafter"] in ("auto", "model"):  # transformers' own speculation, the peer
        assisted = measure(model, ids, seed=options.seed, assistant_model=assistant, **start(), **kwargs)
        row["assisted_generation"] = assisted.to_dict()
    return row, comparison


def _lab_facts(options: LabOptions, model, assistant, ids, row: dict[str, Any]) -> dict[str, Any]:
    """A row's lab figures: a rank's own bytes under tensor parallelism, level 1's weights on a GPU, the random
    shape, the real-text acceptance and the speedups the measured latencies model, the profile."""
    facts: dict[str, Any] = {"shape": options.preset or "model", "random_weights": options.preset is not None}
    facts["weight_bytes"] = _weight_bytes(model)
    text = model.config.get_text_config()
    facts["model_config"] = {**row["model_config"], **{k: getattr(text, k) for k in SHAPE_FIELDS}}
    facts["kv_bytes_per_token"] = kv_bytes_per_token(text, model.dtype.itemsize) // options.tp  # a rank's share
    if model.device.type == "cuda":  # what the level-1 floor reads: floors exist on a GPU only
        facts["level1_weight_bytes"] = _level1_weight_bytes(model, row["triforce"]["triforce"].get("level1_weights"))
    if options.real_acceptance is not None:
        spec, budget, tokens, temperature = (
            options.real_acceptance,
            row["budget"],
            row["prompt_tokens"],
            row["temperature"],
        )
        facts["real_acceptance"] = real_acceptance(spec, budget, tokens, temperature).to_dict()
    facts["modeled_speedup"] = modeled_speedups({**row, **facts})
    if options.profile:
        torch.manual_seed(options.seed)
        config = bench_config(options, row["budget"], row["drafter"], row["tree_budget"])
        extra = {"assistant_model": assistant} if assistant is not None and row["drafter"] in ("auto", "model") else {}
        kwargs = row_generate_kwargs(options, row["temperature"], ids.shape[1])
        facts["profile"] = profile_phases(model, ids, triforce_config=config, **extra, **kwargs)
    return facts


def _prompt_ids(options: LabOptions, tokenizer, prompt, tokens: int, limit, model) -> torch.LongTensor:
    """The bench's chat prompt, or seeded random ids of length ``tokens`` when there is no tokenizer (a preset)."""
    if tokenizer is None:
        generator = torch.Generator().manual_seed(options.seed)
        return torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator).to(model.device)
    return question_prompt(tokenizer, prompt.text(), prompt.question, tokens, limit, options.new_tokens).to(
        model.device
    )


def _batch_benchmark(options: LabOptions, command: str) -> dict[str, Any]:
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
    model, tokenizer, _ = load_lab_models(options, max(options.prompt_tokens))
    enable(model)
    configs = [bench_config(options, b, d) for b, d in itertools.product(options.budgets, options.drafters)]
    if model.device.type == "cuda":  # before any generate(): the batch must fit beside the loaded weights
        available = torch.cuda.mem_get_info(model.device)[0] + _weight_bytes(model)
        context = max(options.prompt_tokens) + options.new_tokens + 64  # + the question and the chat template
        for config in configs:
            check_batch_fits(model.config, options.batch_size, context, model.dtype.itemsize, config, available)
    return run_batch_benchmark(options, model, tokenizer, configs, command)


def _checked_prompt_lengths(options: LabOptions) -> list[int]:
    """``options.prompt_tokens`` with ``"max"`` resolved; for a shape preset on CUDA, each checked to fit.

    Raises:
        MemoryBudgetError: a length does not fit the GPU's free memory (before anything is loaded).
        TriForceConfigError: ``"max"`` without a shape preset on a CUDA device.
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


def _memory_cases(options: LabOptions) -> list[dict[str, Any]]:
    """The :func:`~.memory_fit.check_fits` arguments of each budget and drafter of a shape preset on a CUDA device,
    against the GPU's free memory now; empty otherwise (nothing to check)."""
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
        dict(common, triforce_config=bench_config(options, budget, drafter), draft_config=draft)
        for budget, drafter in itertools.product(options.budgets, options.drafters)
    ]


def _weight_bytes(model) -> int:
    """Bytes of the model's parameters this process holds (tied weights counted once; a rank's shards under
    tensor parallelism): what every forward reads."""
    shards = [local_shard(p) for p in model.parameters()]
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in shards}.values())


def _level1_weight_bytes(model, weights: str | None) -> int:
    """Bytes a level-1 step reads as weights: the model's, with each projection of level 1's int8 or int4 copy
    counted at the copy's size (asked for on a GPU only, where level 1 runs transformers' forward over that copy)."""
    full = _weight_bytes(model)
    make = {"int8": int8_weight_copy, "int4": int4_weight_copy}.get(weights or "")
    if make is None:
        return full
    copy = make(model)
    own = sum(layer.weight.numel() * layer.weight.element_size() for layer in copy)
    return full - own + sum(weight.nbytes() for weight in copy.values())


def load_lab_models(options: LabOptions, longest_prompt: int):
    """``(target, tokenizer or None, assistant or None)``: on the requested device and dtype, sharded under ``--tp``,
    random weights of a ``--preset`` shape sized for ``longest_prompt`` tokens and the new ones (no tokenizer then)."""
    dtype = getattr(torch, options.dtype) if options.dtype else None
    device = rank_device() if options.tp > 1 else options.device or "cpu"
    attn = preferred_attn_implementation(device, options.attn_implementation)
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


def build_parser() -> argparse.ArgumentParser:
    """``hf-triforce bench``'s options and the lab's."""
    p = argparse.ArgumentParser(prog="python -m research.lab_bench", description=__doc__.split("\n\n")[0])
    add_bench_arguments(p)
    p.add_argument("--profile", action="store_true", help="also profile one TriForce call per row (torch.profiler)")
    p.add_argument("--preset", default=None, help=f"random-weights shape instead of --model: one of {sorted(PRESETS)}")
    p.add_argument("--draft-preset", default=None, help="random-weights level-0 draft model shape (e.g. draft-68m)")
    p.add_argument(
        "--real-acceptance", default=None,
        help="level-1 acceptance for the modeled speedup: a rate, or a recorded eval-drafts JSON (default for "
        "--preset: benchmarks/results/eval-drafts.json when present)",
    )  # fmt: skip
    p.add_argument("--plot", default=None, help="write a PNG: speedup and per-level latency vs context length")
    p.add_argument("--batch-size", type=int, default=1, metavar="N", help="N left-padded rows, batched")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallelism over N torchrun ranks")
    p.add_argument(
        "--repeats", type=int, default=1, metavar="N",
        help="N interleaved (plain, TriForce) pairs per configuration, the median pair reported (a shared machine)",
    )  # fmt: skip
    return p


def lab_options(args: argparse.Namespace) -> LabOptions:
    """The :class:`LabOptions` of parsed arguments (``--prompt-tokens`` may name ``max``)."""
    base = bench_options(args, lengths=lambda text: [x if x == "max" else token_counts(x)[0] for x in text.split(",")])
    if args.preset is not None:  # random ids: no answer of their own to penalize
        base["repetition_penalty"] = None
    if args.batch_size < 1 or (args.batch_size > 1 and args.plot):
        raise TriForceConfigError("--batch-size must be >= 1, and --plot (a context sweep) needs --batch-size 1.")
    return LabOptions(**base, profile=args.profile, preset=args.preset,
                      draft_preset=args.draft_preset, real_acceptance=parse_real_acceptance(args.real_acceptance,
                      args.preset), tp=args.tp, batch_size=args.batch_size, repeats=args.repeats)  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    options = lab_options(args)
    command = "python -m research.lab_bench " + shlex.join(args.argv)
    results = run_lab(options, command)
    if is_report_rank():  # tensor parallelism: rank 0 reports for every rank
        print(lab_markdown(results))
        if args.output:
            for path in write_results(results, args.output, markdown=lab_markdown):
                print(f"wrote {path}")
        if args.plot and "rows" in results:
            from .plot import write_plot  # matplotlib, the research extra

            print(f"wrote {write_plot(results, args.plot)}")
    end_ranks()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.lab_bench``: user errors print one line, as ``hf-triforce``'s."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return run_command(_run, args)


if __name__ == "__main__":
    sys.exit(main())
