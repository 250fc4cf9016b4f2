#!/usr/bin/env bash
# Session 12, second call (~8.5 min). (1) bench.attn_configs: verify-attention tiles alone at
# prefix 512 on DDTree and random trees, T = 257 / 1025 / 65, with and without skipping the
# new-key steps no row of a block sees (KernelConfig.skip_empty, new); writes the fastest T = 257
# config as a table. (2) DDTree-256 rounds: the old kernel (t2 without the skip), today's
# default (t2 + skip), the fastest config's table, and the default with cuBLASLt off (the
# s12_1 profile: a memset before every gate_up GEMM, then a ~4.4 us gap). (3) DDTree-1024 with
# the skip (session 9: 34.0 ms, the attention 7.6 ms of it).
# Usage (device tool): bash bench/sessions/gpu_s12_2.sh -> $OUT/s12_2.tar.xz
source bench/gpu_step.sh
record_commit
C257="table,128x64w8s4n1k0,128x64w8s4n1b64,64x64w4s4n1,64x64w4s4n1b64,64x64w4s3n1b64,64x64w4s4n1b32"
C257="$C257,64x128w4s3n1b64,64x64w4s4n2b64,32x64w4s4n1b64,64x64w8s4n1b64"
C1025="table,128x128w8s3k0,64x64w4s4n1b64,128x64w8s4n1b64,64x64w4s4b128"
step attn 220 python3 -m bench.attn_configs --ts 257,1025,65 --prefix 512 --trees ddtree,random \
  --configs "257=$C257;1025=$C1025;65=table,64x64w4s3b32,64x64w4s3b64" \
  --write-table "$R/best257.json" --out "$R/attn"
ddtree_rounds k0 ddtree 256 DDTREE_ATTENTION_TABLE=bench/tables/t257_noskip.json
ddtree_rounds skip ddtree 256
if [ -f "$R/best257.json" ]; then ddtree_rounds best ddtree 256 DDTREE_ATTENTION_TABLE="$R/best257.json"; fi
ddtree_rounds nolt ddtree 256 XLA_FLAGS=--xla_gpu_enable_cublaslt=false
step b1024 150 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 1024 \
  --rounds 16 --repeats 3 --stage-repeats 0 --out "$R/b1024"
finish s12_2
