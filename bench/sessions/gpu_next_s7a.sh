#!/usr/bin/env bash
# Prepared in session 6, not yet run (~9 min, the first call of the next session). Issues 3 and 6:
# (1) the 8B round table with a VALID stage breakdown: every stage alone in a device loop
#     (bench_round --stage-loop; sessions 4-6's synced stage calls were host-bound: AR's "verify"
#     read 9.2 ms against 4.29 ms in a loop), at the defaults (XLA's dots, the one-kernel cache
#     writes, Pallas attention and norms);
# (2) bench_gemm again, ranked by device time (session 6 ranked by a wall figure that was mostly
#     host dispatch, and its table lost end to end), the plain shapes at 65 and 16 rows, the table
#     written to $R only;
# (3) that table end to end: DDTree-64 and AR with it ($DDTREE_MATMUL_TABLE) against (1)'s rows.
#     Commit it to pallas_kernels/matmul_configs.json only if (3) beats (1).
# Usage (device tool): bash bench/sessions/gpu_next_s7a.sh -> $OUT/s7a.tar.xz
source bench/gpu_step.sh
step stages 330 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256 --rounds 32 --repeats 3 --stage-loop --out "$R/stages"
step gemm 80 python3 -m bench.bench_gemm --out "$R/gemm" --budget-s 75 --rows 65,16 \
  --shapes qkv,o,gate_up,down,lm_head,drafter_kv --variants xla,pallas --write-table "$R/matmul_configs.json"
step table 120 env DDTREE_MATMUL_TABLE="$R/matmul_configs.json" python3 -m bench.bench_round --model qwen3-8b \
  --prompt-len 512 --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --matmul-impl auto \
  --out "$R/table"
finish s7a
