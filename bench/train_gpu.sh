#!/usr/bin/env bash
# Train the default pair (ddtree_jax/default_model) on one GPU: the Qwen3 target, then its DFlash
# drafter, within one 10-minute device call. Run from the repo root:
#
#   bash bench/train_gpu.sh                      # on the device: writes into $OUT
#   OUT=out/train T_BUDGET=20 D_BUDGET=20 BATCH=4 SEQ=128 bash bench/train_gpu.sh   # CPU dry run
#
# The tokenizer is the committed one (ddtree_jax/default_model/hf/tokenizer), so it does not travel
# back. What comes back under $OUT (8 files at most, none over 16 MB, 2 folders deep at most):
#   target/{model.safetensors,config.json,generation_config.json}  draft/{model.safetensors,config.json}
#   target_metrics.json  draft_metrics.json  train_log.txt
# The data file is carried in carry/train_data/ (ignored by git); ../shared/data is the fallback.
set -uo pipefail
export PYTHONUNBUFFERED=1

OUT=${OUT:-out/train_gpu}
WORK=${WORK:-/tmp/ddtree_train}
DATA=${DATA:-carry/train_data/pystdlib-3.11.7.jsonl.xz}
[ -f "$DATA" ] || DATA=../shared/data/pystdlib-3.11.7.jsonl.xz
TOK=ddtree_jax/default_model/hf/tokenizer
T_BUDGET=${T_BUDGET:-250}   # seconds of target training (compilation and evals included)
D_BUDGET=${D_BUDGET:-230}   # at most this for the drafter; less if the target stage ran long
DEADLINE=${DEADLINE:-585}   # the whole script must end before the device call's 600 s
BATCH=${BATCH:-64}
SEQ=${SEQ:-512}
PY=${PY:-python3}
FINAL_EVAL=${FINAL_EVAL:-0}  # held-out sequences for the final evals (0: all of the eval split)

START=$(date +%s)
mkdir -p "$OUT" "$WORK"
LOG="$OUT/train_log.txt"
elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[train_gpu +$(elapsed)s] $*" | tee -a "$LOG"; }

say "date $(date -u +%Y-%m-%dT%H:%M:%SZ); commit $(git rev-parse --short HEAD 2>/dev/null || echo none); data $DATA"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true; } | tee -a "$LOG"
$PY -c "import sys, jax, optax; print('python', sys.version.split()[0], 'jax', jax.__version__, 'optax', optax.__version__, jax.devices())" 2>&1 | tee -a "$LOG"
CKPT_EVERY=1000
if ! $PY -c "import orbax.checkpoint" 2>/dev/null; then
    CKPT_EVERY=0
    say "orbax is missing here: training checkpoints are off (the exports do not need it)"
fi

say "stage 1: target, budget ${T_BUDGET}s"
timeout -s TERM $((T_BUDGET + 150)) $PY -m ddtree_jax.train target \
    --data "$DATA" --tokenizer "$TOK" --out "$WORK/target" --force \
    --time-budget "$T_BUDGET" --steps 100000 --batch-size "$BATCH" --seq-len "$SEQ" \
    --lr 2e-3 --warmup 200 --min-lr-ratio 0.1 --weight-decay 0.1 \
    --log-every 50 --eval-every 250 --eval-sequences 128 --final-eval-sequences "$FINAL_EVAL" \
    --token-cache "$WORK/tokens" --ckpt-every "$CKPT_EVERY" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] || [ ! -f "$WORK/target/hf/model.safetensors" ]; then
    say "target training failed (exit $rc)"; exit 1
fi
mkdir -p "$OUT/target"
cp "$WORK/target/hf/"{model.safetensors,config.json,generation_config.json} "$OUT/target/"
cp "$WORK/target/metrics.json" "$OUT/target_metrics.json"

BUDGET=$(( DEADLINE - $(elapsed) - 70 ))
[ "$BUDGET" -gt "$D_BUDGET" ] && BUDGET=$D_BUDGET
if [ "$BUDGET" -lt 30 ]; then say "no time left for the drafter"; exit 1; fi
say "stage 2: drafter, budget ${BUDGET}s"
timeout -s TERM $((BUDGET + 120)) $PY -m ddtree_jax.train drafter \
    --target "$WORK/target/hf" --data "$DATA" --out "$WORK/draft" --force \
    --time-budget "$BUDGET" --steps 100000 --batch-size "$BATCH" --seq-len "$SEQ" \
    --layers 2 --block-size 16 --anchors 32 --gamma 7 --labels distill \
    --lr 2e-3 --warmup 200 --min-lr-ratio 0.1 --weight-decay 0.1 \
    --log-every 50 --eval-every 250 --eval-sequences 64 --eval-anchors 8 --final-eval-sequences "$FINAL_EVAL" \
    --token-cache "$WORK/tokens" --ckpt-every "$CKPT_EVERY" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] || [ ! -f "$WORK/draft/hf/model.safetensors" ]; then
    say "drafter training failed (exit $rc)"; exit 1
fi
mkdir -p "$OUT/draft"
cp "$WORK/draft/hf/"{model.safetensors,config.json} "$OUT/draft/"
cp "$WORK/draft/metrics.json" "$OUT/draft_metrics.json"
ls -la "$OUT" "$OUT/target" "$OUT/draft" | tee -a "$LOG"
say "done"
