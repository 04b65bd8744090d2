"""``hf-triforce estimate``: the bandwidth model from a config, its inputs, its JSON, and the GPU records it is checked
against (the modeled figures are floors: every recorded step is slower, by the factors stated here)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from transformers import LlamaConfig, MixtralConfig

from hf_triforce import InvalidInputError, TriForceConfig
from hf_triforce.bench.bandwidth import attended_kv_bytes, kv_bytes_per_token, read_weight_bytes, weight_bytes
from hf_triforce.bench.estimate import (
    RECORDED_ACCEPTANCE,
    RECORDED_STEPS,
    WEIGHT_KINDS,
    estimate,
    estimate_inputs,
    format_estimate,
)
from hf_triforce.bench.gpus import resolve_gpu
from hf_triforce.bench.local_config import load_local_config
from hf_triforce.cli import main
from research.shapes import preset_config

pytestmark = pytest.mark.unit

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
LLAMA_8B = preset_config("llama3.1-8b", 131072)


def test_json_keys():
    data = estimate(LLAMA_8B, 65536, "h100").to_dict()
    for key in (
        "plain_floor_ms_per_token",
        "triforce_ms_per_token",
        "speedup",
        "memory",
        "acceptance",
        "gpu",
        "recommended_config",
        "recommended_config_python",
        "bandwidth_bytes_per_s",
        "context",
        "dtype",
    ):
        assert key in data, key  # fmt: skip
    assert set(data["triforce_ms_per_token"]) == set(WEIGHT_KINDS) == set(data["speedup"])
    assert all(data["acceptance"][kind]["source"] for kind in WEIGHT_KINDS)
    assert data["memory"]["weights_bytes"] == weight_bytes(LLAMA_8B, 2)
    assert data["memory"]["weights_gb"] == pytest.approx(data["memory"]["weights_bytes"] / 1e9)
    assert TriForceConfig.from_dict(data["recommended_config"]) is not None
    json.dumps(data)  # serializable


def test_longer_context_costs_more_and_gains_more():
    fixed = TriForceConfig(retrieval_budget=4096)
    short = estimate(LLAMA_8B, 32768, "h100", triforce_config=fixed)
    long = estimate(LLAMA_8B, 131072, "h100", triforce_config=fixed)
    assert long.plain_floor_ms > short.plain_floor_ms
    assert long.kinds["full"].speedup > short.kinds["full"].speedup
    assert long.kinds["full"].level1_step_ms == short.kinds["full"].level1_step_ms  # the view does not grow
    auto_short, auto_long = estimate(LLAMA_8B, 32768, "h100"), estimate(LLAMA_8B, 131072, "h100")
    assert auto_short.kinds["full"].level1_step_ms < auto_long.kinds["full"].level1_step_ms  # 'auto': 2048 -> 4096
    assert auto_long.kinds["full"].level1_step_ms == long.kinds["full"].level1_step_ms


def test_8b_gqa_at_64k_design_figures():
    """DESIGN.md section 5: Llama-3.1-8B at 64K holds 8.6 GB of KV against 16 GB of bf16 weights, so level 1 on full
    weights saves at most ~1.4x a plain step; int4 level-1 weights are what make the hierarchy pay."""
    result = estimate(LLAMA_8B, 65536, "h100")
    assert result.memory["plain_kv_bytes"] / 1e9 == pytest.approx(8.6, abs=0.05)
    assert result.memory["weights_bytes"] / 1e9 == pytest.approx(16.1, abs=0.05)
    full, int4 = result.kinds["full"], result.kinds["int4"]
    assert full.speedup < 1.5 and full.speedup_range[1] < 1.5
    assert int4.speedup > full.speedup and int4.ms_per_token < full.ms_per_token
    assert result.recommended == TriForceConfig()  # "auto" runs full weights on a GPU; int4, untimed, is a note
    assert any("level1_weights='int4' models" in note and "not recommended" in note for note in result.notes)
    assert result.kinds["int8"].refused and not result.recommended.offload_kv


def test_ranges_bracket_the_central_figure():
    for kind in estimate(LLAMA_8B, 131072, "h200").kinds.values():
        low, high = kind.speedup_range
        fast, slow = kind.ms_per_token_range
        assert low <= kind.speedup <= high and fast <= kind.ms_per_token <= slow


def test_offload_when_plain_decoding_does_not_fit():
    assert estimate(LLAMA_8B, 131072, "4090").recommended.offload_kv  # 16 GB + 17 GB > 24 GB
    assert not estimate(LLAMA_8B, 131072, "h100").recommended.offload_kv
    unknown = estimate(LLAMA_8B, 131072, "3000")
    assert unknown.gpu.memory_bytes is None and not unknown.recommended.offload_kv
    assert any("unknown" in note for note in unknown.notes)


def test_sliding_layers_keep_at_most_their_window():
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256)  # fmt: skip
    hybrid = LlamaConfig(**shape, layer_types=["sliding_attention", "full_attention"] * 2)
    hybrid.sliding_window = 1024
    per_layer = kv_bytes_per_token(hybrid, 2) // 4
    assert attended_kv_bytes(hybrid, 65536, 2) == per_layer * (2 * 1024 + 2 * 65536)
    result = estimate(hybrid, 65536, "h100")
    assert result.memory["plain_kv_bytes"] == per_layer * (2 * 1024 + 2 * 65536)
    tc = TriForceConfig()  # TriForce's sliding layers too keep their window (and one round): it grows by slack only
    slack = 2 * (tc.full_cache_capacity(65536) - 65536) + 2 * (tc.gamma1 + tc.gamma2)
    assert result.memory["triforce_cache_growth_bytes"] == per_layer * slack


def test_moe_stores_every_expert_and_reads_the_routed_ones():
    moe = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256, num_local_experts=8, num_experts_per_tok=2)  # fmt: skip
    dense = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256)  # fmt: skip
    expert = 2 * 2 * 3 * 64 * 128  # layers x bytes x one expert's gate, up and down
    router = 2 * 2 * 64 * 8
    assert weight_bytes(moe, 2) == weight_bytes(dense, 2) + 7 * expert + router
    assert read_weight_bytes(moe, 2) == weight_bytes(dense, 2) + expert + router


def test_config_json_file_and_directory(tmp_path):
    preset_config("llama3.1-8b", 131072).save_pretrained(tmp_path)
    by_dir, by_file = load_local_config(tmp_path), load_local_config(tmp_path / "config.json")
    assert by_dir.to_dict() == by_file.to_dict()
    assert estimate(by_file, 65536, "h100").plain_floor_ms == estimate(LLAMA_8B, 65536, "h100").plain_floor_ms


def test_unknown_model_type_reads_as_a_generic_config(tmp_path):
    values = {**preset_config("tiny", 512).to_dict(), "model_type": "somebody_elses_llama"}
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert estimate(load_local_config(tmp_path), 4096, "h100").plain_floor_ms > 0


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "no/such/dir"])
def test_hub_ids_are_refused(model):
    with pytest.raises(InvalidInputError, match="downloads nothing"):
        load_local_config(model)


@pytest.mark.parametrize(
    "context, gpu, dtype, match",
    [("0", "h100", "bf16", "--context"), ("-5", "h100", "bf16", "--context"), ("many", "h100", "bf16", "--context"),
     ("64k", "b300", "bf16", "--gpu"), ("64k", "-3", "bf16", "--gpu"), ("64k", "h100", "int3", "--dtype")],
)  # fmt: skip
def test_bad_inputs_are_refused(context, gpu, dtype, match):
    with pytest.raises(InvalidInputError, match=match):
        estimate_inputs(context, gpu, dtype)


def test_gpus():
    assert resolve_gpu("L40S").bandwidth == 864e9 and resolve_gpu("l40s").memory_bytes == 48e9
    assert resolve_gpu("4090").name == "RTX 4090" and resolve_gpu("A100").bandwidth == 2.0e12
    assert resolve_gpu("1500").bandwidth == 1.5e12


def _recorded_level1(path: Path) -> tuple[float, float, float]:
    levels = [row["triforce"]["triforce"]["levels"]["level1"] for row in json.loads(path.read_text())["rows"]]
    rates = [level["per_token_acceptance"] for level in levels]
    accepted = sum(level["accepted"] for level in levels)
    pooled = accepted / (accepted + sum(level["rejections"] for level in levels))
    return min(rates), pooled, max(rates)


@pytest.mark.parametrize("kind, record", [("full", "level1-full.json"), ("int4", "level1-int4.json")])
def test_recorded_acceptance_matches_its_file(kind, record):
    figures = _recorded_level1(RESULTS / "level1-int4-acceptance" / record)
    acceptance = RECORDED_ACCEPTANCE[kind]
    assert (acceptance.low, acceptance.central, acceptance.high) == pytest.approx(figures, abs=5e-4)
    assert "SmolLM2-135M-Instruct" in acceptance.source and ".json" not in acceptance.source  # printed: no file


def test_int8_acceptance_is_full_weights_as_recorded():
    records = json.loads((RESULTS / "level1-weights-ab-7k.json").read_text())["records"]
    pooled = {}
    for mode in ("full", "int8"):
        levels = [r["levels"]["level1"] for r in records if r["mode"] == mode]
        accepted = sum(level["accepted"] for level in levels)
        pooled[mode] = accepted / (accepted + sum(level["rejections"] for level in levels))
    assert (round(pooled["int8"], 3), round(pooled["full"], 3)) == (0.949, 0.945)
    assert "0.949 against 0.945" in RECORDED_ACCEPTANCE["int8"].source
    assert RECORDED_ACCEPTANCE["int8"].central == RECORDED_ACCEPTANCE["full"].central


# The Llama-3.1-8B shape (random weights, bf16, budget 4096, no level 0, 128 new tokens) on the lent GPUs. Measured
# / modeled, per step: plain decoding (transformers' default path: DynamicCache, sdpa) 8.3-17.9x its floor; a level-1
# step (full weights, CUDA graphs) 2.5-3.1x; a verification 3.8-11.4x. The bounds below hold those with some room.
GPU_RECORDS = ["h100-llama3.1-8b.json", "h100-rowsum-llama3.1-8b.json", "h200-llama3.1-8b.json",
               "h200-stacked-llama3.1-8b.json"]  # fmt: skip
BOUNDS = {"plain": 20.0, "level1": 3.5, "verification": 12.0}


def _recorded_steps(name: str) -> list[tuple[int, dict[str, float]]]:
    record = json.loads((RESULTS / name).read_text())
    steps = []
    for row in record["rows"]:
        phases = row["triforce"]["triforce"]["phases"]
        measured = {
            "plain": 1e3 * row["plain"]["decode_seconds_per_token"],
            "level1": phases["level1"]["ms_per_call"],
            "verification": phases["level2"]["ms_per_call"],
        }
        steps.append((row, measured))
    return steps


@pytest.mark.parametrize("name", GPU_RECORDS)
def test_floors_against_the_recorded_gpu_steps(name):
    gpu = name.split("-")[0]
    for row, measured in _recorded_steps(name):
        assert (row["shape"], row["model_config"]["dtype"], row["budget"], row["drafter"]) == (
            "llama3.1-8b", "bfloat16", 4096, "none")  # fmt: skip
        result = estimate(LLAMA_8B, row["prompt_tokens"], gpu, triforce_config=TriForceConfig(retrieval_budget=4096))
        modeled = {"plain": result.plain_floor_ms, "level1": result.kinds["full"].level1_step_ms,
                   "verification": result.plain_floor_ms}  # fmt: skip
        for step, ms in measured.items():
            ratio = ms / modeled[step]
            assert 1.0 <= ratio <= BOUNDS[step], (name, row["prompt_tokens"], step, round(ratio, 2))


def test_cli_prints_the_table_and_json(tmp_path, capsys):
    preset_config("llama3.1-8b", 131072).save_pretrained(tmp_path)
    assert main(["estimate", "--model", str(tmp_path), "--context", "64k", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "plain floor" in out and "recommended: TriForceConfig()" in out and "vs default" in out
    assert main(["estimate", "--model", str(tmp_path / "config.json"), "--context", "131072", "--gpu", "h200",
                 "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["context"] == 131072 and data["gpu"] == "H200" and data["plain_floor_ms_per_token"] > 0


def test_cli_refuses_a_hub_id_in_one_line(capsys):
    assert main(["estimate", "--model", "meta-llama/Llama-3.1-8B", "--context", "64k", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-triforce: error:") and "config.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("gpu", sorted(RECORDED_STEPS))
def test_recorded_steps_match_their_files(gpu):
    """Each GPU class's measured/floor ratios (transformers' default generate(), the CUDA-graph level-1 step, the
    verification): the lowest, median and highest row of its records, re-derived here from the files."""
    ratios = {"plain": [], "level1": [], "verification": []}
    for name in GPU_RECORDS:
        if name.startswith(gpu.lower()):
            for row, measured in _recorded_steps(name):
                ran = TriForceConfig(retrieval_budget=row["budget"])  # the view the record ran
                result = estimate(LLAMA_8B, row["prompt_tokens"], gpu.lower(), triforce_config=ran)
                floors = {"plain": result.plain_floor_ms, "level1": result.kinds["full"].level1_step_ms,
                          "verification": result.plain_floor_ms}  # fmt: skip
                for step in ratios:
                    ratios[step].append(measured[step] / floors[step])
    recorded = RECORDED_STEPS[gpu]
    for step, values in ratios.items():
        expected = (min(values), statistics.median(values), max(values))
        assert getattr(recorded, step) == pytest.approx(expected, abs=5e-3), step
    assert f"{len(ratios['plain'])} runs" in recorded.source


def test_two_baselines_labelled():
    """Against the plain floor (the fastest plain decoding could be) and, on a GPU class the project has records of,
    against transformers' default generate() as those records ran it: 1.00x and 3.8x at 64K on an H100."""
    result = estimate(LLAMA_8B, 65536, "h100")
    default = result.default_generate
    assert round(result.kinds["full"].speedup, 2) == 1.0 and round(default.speedup, 1) == 3.8
    low, high = default.speedup_range
    assert low < default.speedup < high and default.plain_ms_per_token[0] > result.plain_floor_ms
    text = format_estimate(result, "llama")
    assert "vs plain floor" in text and "over default generate()" in text and "H100, as the project's records" in text
    assert result.to_dict()["default_generate"]["speedup"] == default.speedup
    assert estimate(LLAMA_8B, 65536, "a100").default_generate is None
    assert "no record of this GPU class" in format_estimate(estimate(LLAMA_8B, 65536, "a100"), "llama")
