#!/usr/bin/env bash
# ab_tree.sh COMMIT [DIR]: the code of COMMIT (ddtree_jax, ddtree_jax.kernels, bench) as a base tree in
# DIR (bench/.ab_base unless given; bench/.ab_base and bench/.ab_head are ignored by git) for the
# device scripts' A/B runs (gpu_step.sh's base_rounds, AB_BASE=DIR). Run on this machine, from the
# repository root; pass DIR in the device tool's carry. The results, session scripts and shipped
# model are left out, so the tree stays small under the carry's 64 MiB.
set -euo pipefail
commit=${1:?usage: bench/ab_tree.sh COMMIT [DIR]}
dir=${2:-bench/.ab_base}
git rev-parse --verify --quiet "$commit^{commit}" > /dev/null \
  || { echo "ab_tree.sh: $commit is not a commit of this repository; pass a commit id" >&2; exit 2; }
rm -rf "$dir" && mkdir -p "$dir"
git archive "$commit" ddtree_jax ddtree_jax.kernels bench | tar -x -C "$dir"
rm -rf "$dir/bench/results" "$dir/bench/sessions" "$dir/ddtree_jax/default_model"
echo "$dir: $(git rev-parse --short "$commit"), $(du -sh "$dir" | cut -f1)"
