#!/usr/bin/env bash
# Issue 5's GPU measurements in one go, for a machine with one NVIDIA GPU, PyTorch and transformers
# installed and no network (nothing is installed: the repo is imported from its checkout).
#
#   bash benchmarks/gpu_run.sh                 # results under $OUT (the device tool) or benchmarks/results/
#   DEVICE=cpu PRESET_7B=tiny PRESET_8B=tiny CONTEXTS_7B=1k CONTEXTS_8B=1k DRAFT_PRESET=tiny \
#     BUDGET=128 DTYPE=float32 bash benchmarks/gpu_run.sh   # a smoke test of this script on a CPU
#
# Steps: versions; best-plain (issue 50: every plain generate() configuration a GPU user can choose -- the default
# DynamicCache, the static cache with torch.compile, the sdpa flash backend, flash_attention_2 where installed,
# generate_batch -- against TriForce, the 8B shape at 32K and 128K and the 7B shape at 32K and the longest that fits,
# each ms/token beside the bandwidth floor, 64 new tokens: its own call of at most ~12 minutes, unmeasured until a
# GPU is lent); the gpu-marked tests (Triton kernels vs references, CUDA-graph capture/replay, bf16
# greedy losslessness); the llama2-7b MHA shape and the llama3.1-8b GQA shape at long context (plain
# generate() vs TriForce, drafter none, T=0, budget 4K; per-level latencies, floors, modeled speedup with
# real-text acceptance), the 8B shape again without Triton kernels; the 68M-class level-0 step with CUDA
# graphs. About 15-20 minutes on an H100: split it over two device calls with STEPS (each call has 10 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
BUDGET=${BUDGET:-4096}
PRESET_7B=${PRESET_7B:-llama2-7b}
PRESET_8B=${PRESET_8B:-llama3.1-8b}
DRAFT_PRESET=${DRAFT_PRESET:-draft-68m}
# The 7B MHA shape at 120K needs more than an H100's 80 GB (research/memory_fit.py): "max" there is the longest
# context that fits this GPU's free memory, checked before anything is loaded.
big=$($PY -c "import torch; print(int(torch.cuda.is_available() and torch.cuda.mem_get_info()[1] > 100 * 2**30))")
CONTEXTS_7B=${CONTEXTS_7B:-$([ "$big" = 1 ] && echo 32k,64k,120000 || echo 32k,64k,max)}
CONTEXTS_8B=${CONTEXTS_8B:-32k,64k,128k}
PREFILL_CHUNK=${PREFILL_CHUNK:-8192}
CUDA_GRAPHS=${CUDA_GRAPHS:-auto}           # TriForceConfig.cuda_graphs: the level-0/1 steps; "false" if capture fails
RESULTS=${OUT:-benchmarks/results}
STEPS=${STEPS:-versions,best-plain,tests,7b,8b,8b-int4,8b-rescore0,8b-no-triton,level0,8b-fp32}
CONTEXTS_FP32=${CONTEXTS_FP32:-32k}
BEST_PLAIN=${BEST_PLAIN:-dynamic,static_compiled,sdpa_flash,flash_attention_2,continuous_batching}
CONTEXTS_BEST_8B=${CONTEXTS_BEST_8B:-32k,128k}
CONTEXTS_BEST_7B=${CONTEXTS_BEST_7B:-$([ "$big" = 1 ] && echo 32k,120000 || echo 32k,max)}
mkdir -p "$RESULTS"
LOG="$RESULTS/gpu-run.log"
tag=$($PY -c "import torch; print(torch.cuda.get_device_name().split()[1].lower() if torch.cuda.is_available() else 'cpu')")

run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
bench() {  # bench NAME ARGS...: one JSON + .md per shape (plain = generate()'s defaults unless ARGS say --plain)
    local name=$1; shift
    run $PY -m research.lab_bench --device "$DEVICE" --dtype "$DTYPE" --temperatures 0 --retrieval-budget "$BUDGET" \
        --new-tokens 128 --prefill-chunk-size "$PREFILL_CHUNK" --output "$RESULTS/$name.json" \
        --cuda-graphs "$CUDA_GRAPHS" --plain dynamic "$@"
}

want versions && run bash -c "nvidia-smi || true; $PY -c 'import torch, transformers, triton; \
print(torch.__version__, transformers.__version__, triton.__version__, torch.cuda.is_available())'"
# Best plain against TriForce with the floors (the static uncompiled cache is left out: on CUDA generate() compiles a
# static cache by itself, and the uncompiled one is the slowest choice there).
want best-plain && bench "$tag-best-plain-$PRESET_8B" --preset "$PRESET_8B" --prompt-tokens "$CONTEXTS_BEST_8B" \
    --drafter none --plain "$BEST_PLAIN" --new-tokens "${BEST_NEW_TOKENS:-64}"
want best-plain && bench "$tag-best-plain-$PRESET_7B" --preset "$PRESET_7B" --prompt-tokens "$CONTEXTS_BEST_7B" \
    --drafter none --plain "$BEST_PLAIN" --new-tokens "${BEST_NEW_TOKENS:-64}"
want tests && run $PY -m pytest -q -p no:cacheprovider -m gpu tests
want 7b && bench "$tag-$PRESET_7B" --preset "$PRESET_7B" --prompt-tokens "$CONTEXTS_7B" --drafter none
want 8b && bench "$tag-$PRESET_8B" --preset "$PRESET_8B" --prompt-tokens "$CONTEXTS_8B" --drafter none
# Level 1 on the int4 copy (issue 55: torch._weight_int4pack_mm, groups of 32, the LM head in bf16), CUDA graphs as
# above: its level-1 step ms against the 8b run's (full bf16 weights) and against its own floor (a quarter of the
# projections' bytes), and the level-1 acceptance the random-weight preset cannot show (use the CPU's, below).
want 8b-int4 && bench "$tag-$PRESET_8B-int4" --preset "$PRESET_8B" --prompt-tokens "$CONTEXTS_8B" --drafter none \
    --level1-weights int4
# rescore_candidates=0 (the chunk-mean ranking alone, TriForce's; the default until 2026-11-28): its refresh ms
# against the 8b run above (the default, rescore_candidates=4) is what ranking the nominees by their keys costs.
want 8b-rescore0 && bench "$tag-$PRESET_8B-rescore0" --preset "$PRESET_8B" --prompt-tokens "$CONTEXTS_8B" \
    --drafter none --rescore-candidates 0
# The same without any Triton kernel (retrieval scoring/gather, split-KV verification): what they are worth.
# Its markdown is dropped (the device returns 8 files at most): research.lab_report.lab_markdown rebuilds it.
want 8b-no-triton && HF_TRIFORCE_DISABLE_TRITON=1 bench "$tag-$PRESET_8B-no-triton" --preset "$PRESET_8B" \
    --prompt-tokens "$CONTEXTS_8B" --drafter none && rm -f "$RESULTS/$tag-$PRESET_8B-no-triton.md"
# Level 0: the 68M-class draft model under the 7B shape with CUDA graphs, short context (its step does not
# depend on it). PNGs are left out (the device returns 8 files at most): research.plot.write_plot draws them
# from the JSON.
want level0 && bench "$tag-level0" --preset "$PRESET_7B" --draft-preset "$DRAFT_PRESET" --drafter model \
    --prompt-tokens 16k
# Lossless at full size: the 8B shape in float32, where greedy output must be identical (in bf16 the bench's
# "identical" column may say "near-tie at N": hf_triforce.bench.divergence).
want 8b-fp32 && bench "$tag-$PRESET_8B-fp32" --preset "$PRESET_8B" --prompt-tokens "$CONTEXTS_FP32" --drafter none \
    --dtype float32
echo "results in $RESULTS" | tee -a "$LOG"
