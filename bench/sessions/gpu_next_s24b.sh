#!/usr/bin/env bash
# Session 24, call b (~9 min).
# (1) The cuBLASLt memset before every gate_up at 264 rows (sessions 21-23: ~0.21 ms a round).
#     s24a's autotune log: gate_up (fingerprint 0916ac73...) took algorithm 1 at 77.4 us against
#     the default algorithm's 78.9. Same start, interleaved, both loading a pinned file: s24a's
#     picks as dumped (A) against the same file with gate_up on the default algorithm (B).
# (2) One wave or two: at T = 256 a row block a CTA (split keys, 64x4w2ks) is 16 blocks x 8 kv
#     heads = 128 CTAs on 132 SMs; at T = 264 (DDTree-256's padded verify) 17 x 8 = 136.
# (3) bench.profile_mgpu (new): the attention kernel's in-kernel profile at T = 72, 256 and 264.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s24b.sh
source bench/gpu_step.sh
record_commit
A=bench/results/session24/s24a/autotune.textproto
B="$R/autotune_gate_up_alg0.textproto"
python3 - "$A" "$B" <<'PY'
import sys
src, dst = sys.argv[1:]
entries = open(src).read().split("entries {")
hit = [i for i, e in enumerate(entries) if '"0916ac7399cda65cae30b7a50e487a6e"' in e]
assert len(hit) == 1 and "algorithm: 1\n" in entries[hit[0]], hit
entries[hit[0]] = entries[hit[0]].replace("          algorithm: 1\n", "")
open(dst, "w").write("entries {".join(entries))
print("gate_up's entry set to the default algorithm")
PY
export SECS=62 ROUNDS=32
ddtree_rounds at_a1 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$A"
ddtree_rounds at_b1 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B"
ddtree_rounds at_a2 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$A"
ddtree_rounds at_b2 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B"
step waves 100 python3 -m bench.bench_mgpu --ts 256,264 --prefixes 512 \
  --configs 64x3w2s,64x4w2ks,64x2w2ks --inner 8 --out "$R/waves"
step prof 100 python3 -m bench.profile_mgpu --ts 72,256,264 --prefixes 512 \
  --configs 64x3w2s,64x4w2ks --out "$R/prof"
finish s24b
