#!/usr/bin/env bash
# Session 31, fifth call (~1 min): how long a request's small inputs (knobs, lengths, max new
# tokens) take to reach the H200 when made with jnp (each a conversion or broadcast launched as
# an executable; generate before session 31) against numpy arrays in one jax.device_put; and a
# PRNGKey. Wall ms to readiness, median of 50.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s31e.sh
source bench/gpu_step.sh
record_commit
step setup 60 python3 - <<'PY'
import statistics, time
import jax, jax.numpy as jnp, numpy as np

def old(i):
    return (jnp.float32(0.5 + i), jnp.float32(1.0), jnp.asarray([-1], jnp.int32),
            jnp.asarray([17], jnp.int32), jnp.full((1,), 96 + i, jnp.int32))

def new(i):
    return jax.device_put((np.float32(0.5 + i), np.float32(1.0), np.asarray([-1], np.int32),
                           np.asarray([17], np.int32), np.full((1,), 96 + i, np.int32)))

def key(i):
    return jax.random.PRNGKey(i)

for name, f in (("jnp", old), ("device_put", new), ("PRNGKey", key), ("jnp", old), ("device_put", new)):
    ts = []
    for i in range(60):
        t0 = time.perf_counter(); jax.block_until_ready(f(i)); ts.append(1e3 * (time.perf_counter() - t0))
    print(f"{name:10s} median {statistics.median(ts[10:]):.3f} ms, min {min(ts[10:]):.3f}", flush=True)
a, b = old(3), new(3)
assert all(x.dtype == y.dtype and x.shape == y.shape and x.weak_type == y.weak_type for x, y in zip(a, b))
print(jax.devices()[0].device_kind, jax.__version__)
PY
finish s31e
