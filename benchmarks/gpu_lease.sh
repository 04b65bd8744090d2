#!/usr/bin/env bash
# benchmarks/gpu_run.sh cut into pieces that each leave their results behind, for a lent GPU with a hard time
# limit (the device tool: 10 minutes a call, 15 minutes a session). Each piece is one gpu_run.sh step at one
# context length, in priority order; after each, everything so far is packed into $OUT/gpu-results.tar (the
# device returns 8 files at most, and a call killed at its limit still returns $OUT), so a cut-off call
# loses only the piece that was running.
#
#   PIECES="versions tests 8b:32k 8b:64k" bash benchmarks/gpu_lease.sh
#   tar -xf gpu-results.tar -C benchmarks/results/          # here, afterwards
#
# A piece is a gpu_run.sh step (versions, tests, 7b, 8b, 8b-int4, 8b-no-triton, level0, ...),
# optionally ":CONTEXTS" for the 7b/8b ones. Issue 55's measurements, most telling first (the 8B shape at 128K with
# level 1 on its own weights and on the int4 copy, against best plain and the floors, then the shorter contexts):
#
#   PIECES="versions tests 8b:128k 8b-int4:128k best-plain:128k 8b-int4:32k 8b-int4:64k 7b:32k" bash benchmarks/gpu_lease.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PIECES=${PIECES:-versions best-plain tests 8b-rescore0:128k 8b:32k 8b:64k 8b:128k 7b:32k 7b:64k level0}
OUT=${OUT:-/tmp/gpu-out}
WORK=${WORK:-/tmp/gpu-results}
mkdir -p "$OUT" "$WORK"
for piece in $PIECES; do
    step=${piece%%:*}
    contexts=${piece#*:}
    [ "$contexts" = "$piece" ] && contexts=""
    dir="$WORK/$step${contexts:+-$contexts}"
    mkdir -p "$dir"
    start=$(date +%s)
    env OUT="$dir" STEPS="$step" ${contexts:+CONTEXTS_7B=$contexts CONTEXTS_8B=$contexts CONTEXTS_FP32=$contexts \
        CONTEXTS_BEST_7B=$contexts CONTEXTS_BEST_8B=$contexts} \
        bash benchmarks/gpu_run.sh
    echo "piece $piece: rc $? in $(( $(date +%s) - start )) s" | tee -a "$WORK/pieces.log"
    tar -cf "$OUT/gpu-results.tar" -C "$WORK" .
done
