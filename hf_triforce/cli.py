"""``hf-triforce`` / ``python -m hf_triforce``: the demo, the benchmark and the estimate from the command line.

``hf-triforce --help`` loads neither torch nor transformers: the parser reads only light modules, and each command
imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .bench.options import ATTN_CHOICES, DEFAULT_PLAIN, DTYPE_BYTES
from .bench.prompt_set import BENCH_PROMPTS
from .bench.repetition import DEFAULT_REPETITION_PENALTY
from .config import DRAFTERS, LEVEL1_WEIGHTS, TriForceConfig
from .errors import TriForceConfigError

CUDA_GRAPHS: dict[str, bool | str] = {"false": False, "auto": "auto", "true": True, "eager": "eager"}
DEFAULTS = TriForceConfig()
RENAMED = {
    "--budget": "--retrieval-budget",
    "--budgets": "--retrieval-budget (comma-separated for a sweep)",
    "--drafters": "--drafter (comma-separated for a sweep)",
    "--tree-budgets": "--tree-budget (comma-separated for a sweep)",
}
"""Options renamed to TriForceConfig's field names in 0.3, and their new spelling."""
REMOVED = (
    "--preset", "--draft-preset", "--real-acceptance", "--plot", "--profile", "--batch-size", "--tp", "--repeats",
)  # fmt: skip
"""``hf-triforce bench`` options 0.3 removed: the project's own measurements (random-weights shapes, tensor
parallelism, batches, profiles, figures, repeated pairs) left the package for the source repository's research
tools."""
ESTIMATE_EXAMPLE = """example:
  hf-triforce estimate --model ./Llama-3.1-8B-Instruct --context 64k --gpu h100

  --model is a local directory holding config.json, or the file itself (a Hub id is refused: nothing is
  downloaded). The output gives memory, the plain decoding floor, TriForce's modeled ms a token and speedup for
  each kind of level-1 weights, transformers' default generate() as the project's records ran it on that GPU class,
  and the TriForceConfig to start from."""

logger = logging.getLogger("hf_triforce")


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-triforce`` parser: ``demo``, ``bench`` and ``estimate``, built without importing torch.

    Example:
        >>> build_parser().parse_args(["estimate", "--model", "m", "--context", "64k", "--gpu", "h100"]).context
        '64k'
    """
    parser = argparse.ArgumentParser(
        prog="hf-triforce", description="Lossless TriForce speculative decoding for transformers generate()."
    )
    parser.add_argument("--debug", dest="debug_all", action="store_true", help="show tracebacks and debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_demo(commands.add_parser("demo", help="answer a question about a long document, with and without TriForce"))
    bench = commands.add_parser("bench", help="measure plain generate() vs TriForce on a real model")
    add_bench_arguments(bench)
    for old in REMOVED:
        bench.add_argument(old, nargs="?", action=_Removed, help=argparse.SUPPRESS)
    bench.set_defaults(func=_run_bench)
    estimate_help = "will TriForce help? memory and modeled ms/token from a model's config, nothing loaded"
    _add_estimate(
        commands.add_parser(
            "estimate", help=estimate_help, epilog=ESTIMATE_EXAMPLE,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Will TriForce help this model at this context on this GPU? Read from the model's config "
            "alone (nothing is downloaded or loaded): memory, the bandwidth floor of plain decoding, TriForce's "
            "modeled speed against it and against transformers' default generate(), and a TriForceConfig. Every "
            "figure is modeled, not measured.",
        )
    )  # fmt: skip
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local model directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--document", default=None, help="UTF-8 text file (default: the Python language reference)")
    p.add_argument("--question", default=None, help="question asked about the document")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling threshold when temperature > 0")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--debug", action="store_true", help="show full tracebacks and debug logging")


def _add_demo(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--document-tokens", type=int, default=7000, help="tokens of the document to use (default 7000)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length limit (default 128)")
    p.add_argument(
        "--temperatures", "--temperature", default="0,0.6",
        help="comma-separated temperatures, one comparison each: 0 is greedy, > 0 samples (default 0,0.6)",
    )  # fmt: skip
    p.add_argument(
        "--retrieval-budget", type=lambda x: x if x == "auto" else int(x), default="auto",
        help="TriForceConfig.retrieval_budget: auto (the default: a sixteenth of the prompt, 512 to 4096) or tokens",
    )  # fmt: skip
    p.add_argument("--drafter", choices=DRAFTERS, default=DEFAULTS.drafter, help="TriForceConfig.drafter")
    _add_renamed(p, "--budget")
    p.add_argument(
        "--repetition-penalty", type=float, default=DEFAULT_REPETITION_PENALTY,
        help="penalty on the answer's own tokens (the prompt's are free), given to both runs alike; it keeps a small "
        f"model's answer from looping (default {DEFAULT_REPETITION_PENALTY}; 1 for none)",
    )  # fmt: skip
    p.add_argument("--output", default=None, help="also write the figures and answers to this JSON file")
    p.add_argument(
        "--prompt", default=None, choices=[p.name for p in BENCH_PROMPTS],
        help="ask one of the bench's documents its question (default: --document/--question, by default the Python "
        "language reference)",
    )  # fmt: skip
    p.add_argument(
        "--questions",
        type=int,
        default=1,
        help="ask N questions about the document, prefilled once into a cache reused by plain generate() and "
        "TriForce (default 1: one question, no reuse)",
    )
    p.set_defaults(func=_run_demo)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """``hf-triforce bench``'s options on ``p`` (:func:`bench_options` reads them back).

    Example:
        >>> p = argparse.ArgumentParser(); add_bench_arguments(p)
        >>> bench_options(p.parse_args(["--prompt-tokens", "4k,7000"]))["prompt_tokens"]
        [4096, 7000]
    """
    _add_common(p)
    p.add_argument(
        "--prompt-tokens",
        default="7000",
        help="comma-separated prompt lengths, e.g. 7000 or 32k,64k (default 7000)",
    )
    p.add_argument("--temperatures", default="0,0.6", help="comma-separated temperatures (default 0,0.6)")
    p.add_argument(
        "--retrieval-budget", default=str(DEFAULTS.retrieval_budget),
        help=f"TriForceConfig.retrieval_budget; comma-separated for a sweep (default {DEFAULTS.retrieval_budget})",
    )  # fmt: skip
    p.add_argument(
        "--drafter", default=DEFAULTS.drafter,
        help=f"TriForceConfig.drafter among {DRAFTERS}; comma-separated for a sweep (default {DEFAULTS.drafter})",
    )  # fmt: skip
    p.add_argument(
        "--tree-budget", default=str(DEFAULTS.tree_budget),
        help="TriForceConfig.tree_budget: 'auto', 0 (chains) or a node count; comma-separated for a sweep, e.g. 0,16 "
        f"to compare chains with 16-node token trees (default {DEFAULTS.tree_budget})",
    )  # fmt: skip
    for old in ("--budgets", "--drafters", "--tree-budgets"):
        _add_renamed(p, old)
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per run (default 128)")
    p.add_argument("--gamma1", type=int, default=None, help="level-0 draft length (default: TriForceConfig's)")
    p.add_argument("--gamma2", type=int, default=None, help="level-1 draft length (default: TriForceConfig's)")
    p.add_argument("--output", default=None, help="write results as JSON (+ a .md table beside it)")
    p.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"), help="model dtype")
    p.add_argument("--prefill-chunk-size", type=int, default=None, help="chunked prefill (long prompts)")
    p.add_argument(
        "--prompt-lookup", type=int, default=None, metavar="N",
        help="also measure transformers' prompt-lookup decoding (prompt_lookup_num_tokens=N) on the same prompt",
    )  # fmt: skip
    p.add_argument(
        "--no-adaptive", dest="adaptive", action="store_false",
        help="TriForceConfig.adaptive=False: the fixed level 0 -> 1 -> 2 schedule with gamma1/gamma2 every round",
    )  # fmt: skip
    p.add_argument(
        "--rescore-candidates", type=int, default=None, metavar="N",
        help="TriForceConfig.rescore_candidates: rank N x the view's chunks by their keys (default: the config's)",
    )  # fmt: skip
    p.add_argument(
        "--offload-kv", action="store_true",
        help="TriForceConfig.offload_kv=True: the full KV cache in host memory, streamed to the device once per "
        "full-cache forward (the stats report the bytes copied each way: kv_bytes_to_device / kv_bytes_to_host)",
    )  # fmt: skip
    p.add_argument(
        "--level1-weights", default=None, choices=LEVEL1_WEIGHTS,
        help="TriForceConfig.level1_weights: the weights level 1 drafts with (default: the config's, 'auto')",
    )  # fmt: skip
    p.add_argument(
        "--cuda-graphs", default=str(DEFAULTS.cuda_graphs).lower(), choices=tuple(CUDA_GRAPHS),
        help="TriForceConfig.cuda_graphs: auto (default: graphs on CUDA where they run), true, false, eager "
        "(fixed-shape steps without graphs)",
    )  # fmt: skip
    p.add_argument(
        "--attn-implementation", default="auto", choices=ATTN_CHOICES,
        help="attention backend (default auto: flash attention on CUDA when installed, else sdpa)",
    )  # fmt: skip
    p.add_argument(
        "--prompts", default=None,
        help=f"comma-separated prompts of the bench's set (default: all of {','.join(p.name for p in BENCH_PROMPTS)}; "
        "--document/--question measure one prompt of yours instead)",
    )  # fmt: skip
    p.add_argument(
        "--plain", default=",".join(DEFAULT_PLAIN),
        help="comma-separated plain decodings timed beside TriForce; the fastest is 'best plain' (default: all of "
        f"{','.join(DEFAULT_PLAIN)}; the CUDA-only ones are reported as not run elsewhere)",
    )  # fmt: skip
    p.add_argument(
        "--repetition-penalty", type=float, default=DEFAULT_REPETITION_PENALTY,
        help="penalty on the answer's own tokens (the prompt's free), the same for every run, as the demo's "
        f"(default {DEFAULT_REPETITION_PENALTY}; 1 for none)",
    )  # fmt: skip


def _add_estimate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="local model directory or its config.json (nothing is downloaded)")
    p.add_argument("--context", required=True, help="tokens in the cache while decoding, e.g. 65536 or 64k")
    p.add_argument(
        "--gpu", required=True, help="h100, h200, a100 (80 GB), l40s, 4090, or the GPU's memory bandwidth in GB/s"
    )
    p.add_argument(
        "--dtype", default="bfloat16", help=f"weights and KV cache: {', '.join(DTYPE_BYTES)} (default bfloat16)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--debug", action="store_true", help="show full tracebacks and debug logging")
    p.set_defaults(func=_run_estimate)


def _run_estimate(args: argparse.Namespace) -> int:
    """Print the estimate: a table, or one JSON object with ``--json``."""
    from .bench.estimate import estimate, estimate_inputs, format_estimate
    from .bench.local_config import load_local_config

    context, gpu, dtype = estimate_inputs(args.context, args.gpu, args.dtype)  # checked before the config is read
    result = estimate(load_local_config(args.model), context, gpu, dtype)
    if args.json:
        print(json.dumps({"model": args.model, **result.to_dict()}, indent=2))
    else:
        print(format_estimate(result, args.model))
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run_demo

    options = DemoOptions(
        model=args.model,
        document=args.document,
        document_tokens=args.document_tokens,
        max_new_tokens=args.max_new_tokens,
        temperatures=tuple(_temperatures(args.temperatures)),
        top_p=args.top_p,
        budget=args.retrieval_budget,
        drafter=args.drafter,
        seed=args.seed,
        questions=args.questions,
        repetition_penalty=args.repetition_penalty,
        output=args.output,
        prompt=args.prompt,
    )
    if args.question:
        options.question = args.question
    run_demo(options)
    return 0


def _plain_names(text: str) -> list[str]:
    from .bench.plain_decoding import plain_decoding

    names = [n for n in text.split(",") if n]
    for name in names:
        plain_decoding(name)  # ValueError naming the choices, before anything is loaded
    return names


def bench_options(args: argparse.Namespace, lengths: Callable[[str], list] | None = None) -> dict[str, Any]:
    """The :class:`~hf_triforce.bench.run.BenchOptions` fields of parsed ``hf-triforce bench`` arguments, each checked
    before anything is loaded (``lengths`` parses ``--prompt-tokens``: :func:`token_counts` by default)."""
    return dict(
        model=args.model,
        document=args.document,
        prompt_tokens=(lengths or token_counts)(args.prompt_tokens),
        temperatures=_temperatures(args.temperatures),
        budgets=_budgets(args.retrieval_budget),
        drafters=_drafters(args.drafter),
        tree_budgets=_tree_budgets(args.tree_budget),
        new_tokens=args.new_tokens,
        top_p=args.top_p,
        gamma1=args.gamma1,
        gamma2=args.gamma2,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        prefill_chunk_size=args.prefill_chunk_size,
        rescore_candidates=args.rescore_candidates,
        level1_weights=args.level1_weights,
        offload_kv=args.offload_kv,
        attn_implementation=args.attn_implementation,
        cuda_graphs=CUDA_GRAPHS[args.cuda_graphs],
        prompt_lookup=args.prompt_lookup,
        adaptive=args.adaptive,
        question=args.question,
        prompts=args.prompts.split(",") if args.prompts else None,
        plain=_plain_names(args.plain),
        repetition_penalty=args.repetition_penalty,
    )


def _run_bench(args: argparse.Namespace) -> int:
    from .bench.report import markdown_table, write_results
    from .bench.run import BenchOptions, run_benchmark

    results = run_benchmark(BenchOptions(**bench_options(args)), command="hf-triforce " + shlex.join(args.argv))
    print(markdown_table(results))
    if args.output:
        for path in write_results(results, args.output):
            print(f"wrote {path}")
    return 0


def _temperatures(text: str) -> list[float]:
    """``"0,0.6"`` -> ``[0.0, 0.6]``; none, or one that is not a number, is an error.

    Example:
        >>> _temperatures("0, 0.6")
        [0.0, 0.6]
    """
    values = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            values.append(float(item))
        except ValueError:
            raise TriForceConfigError(f"temperature {item!r} is not a number.") from None
    if not values:
        raise TriForceConfigError(f"temperatures {text!r}: give comma-separated numbers, e.g. 0,0.6.")
    return values


def _drafters(text: str) -> list[str]:
    """``"ngram,none"`` -> ``["ngram", "none"]``, each checked as ``TriForceConfig`` checks it."""
    names = text.split(",")
    for name in names:
        TriForceConfig(drafter=name)
    return names


def _tree_budgets(text: str) -> list[int | str]:
    """``"0,16,auto"`` -> ``[0, 16, "auto"]``; each checked as ``TriForceConfig`` checks it (a clear error first).

    Example:
        >>> _tree_budgets("0,16,auto")
        [0, 16, 'auto']
    """
    values: list[int | str] = [item if item == "auto" else int(item) for item in text.split(",")]
    for value in values:
        TriForceConfig(tree_budget=value)
    return values


def _budgets(text: str) -> list[int | str]:
    """``"auto,512"`` -> ``["auto", 512]`` (retrieval budgets: ``auto`` or token counts)."""
    return [x if x == "auto" else token_counts(x)[0] for x in text.split(",")]


def token_counts(text: str) -> list[int]:
    """``"4096,32k,128K"`` -> ``[4096, 32768, 131072]``; a count that is not a whole number is a one-line error.

    Example:
        >>> token_counts("4096,32k,128K")
        [4096, 32768, 131072]
    """
    try:
        return [int(x[:-1]) * 1024 if x[-1:] in "kK" and x[:-1] else int(x) for x in text.split(",")]
    except ValueError:
        raise TriForceConfigError(f"{text!r}: give comma-separated token counts, e.g. 4096 or 32k,64k.") from None


class _Removed(argparse.Action):
    """A ``hf-triforce bench`` option 0.3 removed (:data:`REMOVED`): using it is a usage error saying so."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001, D102
        parser.error(
            f"{option_string} was removed from hf-triforce bench in 0.3: it served the project's own measurements "
            "(random-weights shapes, tensor parallelism, batches, profiles, figures, repeated pairs), which live in "
            "its source repository's research tools, not in the package."
        )


class _Renamed(argparse.Action):
    """An option renamed in 0.3: using it is a usage error naming its new spelling."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001, D102
        parser.error(f"{option_string} was renamed in 0.3: use {RENAMED[option_string]}.")


def _add_renamed(p: argparse.ArgumentParser, old: str) -> None:
    p.add_argument(old, action=_Renamed, help=argparse.SUPPRESS)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hf-triforce``; user errors print one line (``--debug`` for the traceback)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.debug = args.debug or args.debug_all
    return run_command(args.func, args)


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a parsed command: logging at ``--debug``'s level, a user error (``ValueError``, ``OSError``) as one
    ``hf-triforce: error: ...`` line and exit status 2, Ctrl-C as 130."""
    debug = getattr(args, "debug", False)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return command(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as err:
        if debug:
            raise
        message = " ".join(str(err).split())  # one line, even for multi-line library messages
        print(f"hf-triforce: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
