"""Exact offline replay of tree policies for greedy decoding: record once, score any policy fast.

    python -m ddtree_jax.research record --out rec.npz        # the target's greedy outputs, the drafts
    python -m ddtree_jax.research replay rec.npz --tree-policy ddtree --budget 16,64,256
    python -m ddtree_jax.research plot rec.npz --out acc.png

From Python (a budget may be a function that picks each round's node count, see `replay`):

    from ddtree_jax.research import auto_budget, load_record, replay
    rec = load_record("rec.npz")
    res = replay(rec, "ddtree", 64)                       # res.mean_acceptance, res.prompts[i].acceptance_lengths
    res = replay(rec, "ddtree", lambda path_logp: (path_logp > -6).sum(-1), max_budget=256)
    res = replay(rec, "ddtree", auto_budget(load_cost_model("cost.json")), batch=8)  # --budget auto, batch 8

`record.py` computes a record, `store.py` reads and writes its file, `simulate.py` replays a
policy, `plot.py` sweeps every policy and budget.
"""
from ddtree_jax.research.simulate import (AutoBudget, BatchBudget, PromptReplay, ReplayResult, auto_budget,
                                          ranks_needed, replay)
from ddtree_jax.research.store import Record, load_record, save_record

__all__ = ["AutoBudget", "BatchBudget", "PromptReplay", "Record", "ReplayResult", "auto_budget", "load_record",
           "ranks_needed", "replay", "save_record"]
