"""A small synthetic corpus in the shared corpus's JSONL format, for the training tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SNIPPETS = [
    "def add(a, b):\n    return a + b\n\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
    "# caf\u00e9 \u2014 ok\r\nvalue = {'key': [1, 2, 3]}  \n",
]


def write_corpus(path: Path, n_train: int = 40, n_eval: int = 4, snippets=SNIPPETS) -> Path:
    """n_train + n_eval documents, each the snippets in a seeded random order."""
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(n_train + n_eval):
            text = "".join(snippets[j] for j in rng.permutation(len(snippets)))
            f.write(json.dumps({"path": f"m{i}.py", "split": "eval" if i >= n_train else "train", "text": text}) + "\n")
    return path
