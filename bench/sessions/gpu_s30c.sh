#!/usr/bin/env bash
# Session 30 (~8 min; one call): a call's fixed cost. s30a's graph-mode trace (prof64) shows
# it: the first round of every call runs `command_buffer::update` (8.1 ms under the profiler)
# before its graph launch, because run_rounds' state (donated, from a fresh prefill) and the
# temp allocation get new addresses each call. XLA's xla_gpu_command_buffer_update_mode picks
# VA remapping (NEVER_UPDATE: every allocation the command buffers touch at a fixed virtual
# address; newer XLAs name only temps SKIP_TEMP / VMM_PERSISTENT_TEMP). Which names this
# jaxlib takes, then DDTree-64 and AR rounds at prompt 512, ABAB, default against the mode.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s30c.sh
source bench/gpu_step.sh
record_commit
modes_ok() {
  for m in NEVER_UPDATE CAPTURE_CMD_NEVER_UPDATE SKIP_TEMP VMM_PERSISTENT_TEMP ALWAYS_UPDATE DYNAMIC_ALLOCATE; do
    if XLA_FLAGS=--xla_gpu_command_buffer_update_mode=$m timeout 60 python3 -c \
        "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x + 1)(jnp.ones(3)).sum())" >/dev/null 2>&1; then
      echo "$m"
    fi
  done
}
step versions 100 bash -c 'python3 -c "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)";
  for f in $(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")/*.so; do
    strings $f | grep -x "ALWAYS_UPDATE\|NEVER_UPDATE\|CAPTURE_CMD_NEVER_UPDATE\|SKIP_TEMP\|SKIP_PROFILED\|VMM_PERSISTENT_TEMP\|DYNAMIC_ALLOCATE" | sed "s|^|$(basename $f): |"; done | sort -u'
OK=$(modes_ok | tee "$R/modes_ok.txt")
echo "=== modes parsed: $OK"
BEST=$(echo "$OK" | grep -v "ALWAYS_UPDATE\|DYNAMIC_ALLOCATE" | head -1)
if [ -z "$BEST" ]; then echo "=== no VA remapping mode"; finish s30c; exit 0; fi
V="XLA_FLAGS=--xla_gpu_command_buffer_update_mode=$BEST"
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_default1 ddtree 64
ddtree_rounds d64_va1 ddtree 64 $V
ddtree_rounds d64_default2 ddtree 64
ddtree_rounds d64_va2 ddtree 64 $V
SECS=50 ddtree_rounds ar_default ar 0
SECS=50 ddtree_rounds ar_va ar 0 $V
for m in $(echo "$OK" | grep -v "ALWAYS_UPDATE\|DYNAMIC_ALLOCATE\|^$BEST\$"); do
  ddtree_rounds "d64_$m" ddtree 64 "XLA_FLAGS=--xla_gpu_command_buffer_update_mode=$m"
done
finish s30c
