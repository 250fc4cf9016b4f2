"""Hugging Face checkpoint -> converted checkpoint (see ddtree_jax/checkpoint/ for the layout).

    python -m convert --target HF_DIR [--draft HF_DIR] --out DIR [--dtype bfloat16|float32|float16]
                      [--force] [--debug]

Every input is validated before the long work: directories, configs, the target/drafter pair, the
output path, and the name, dtype and shape of every tensor (from the safetensors headers). Then
tensors are streamed one at a time (cast, transposed to our [in, out] layout) and written with
orbax into a temporary directory that is renamed into place at the end. The target is written and
released before the drafter is read, so peak host memory is about one model.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ddtree_jax.checkpoint import hf, names
from ddtree_jax.errors import UserError, cli_main
from ddtree_jax.models.config import DrafterConfig, TargetConfig, check_pair

DEFAULT_DTYPE = "bfloat16"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, through cli_main, instead of usage + exit
        raise UserError(f"{message}; see python -m convert --help")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m convert", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, metavar="HF_DIR", help="Hugging Face target model directory")
    p.add_argument("--draft", metavar="HF_DIR", help="z-lab DFlash drafter directory (optional)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (the converted checkpoint)")
    p.add_argument("--dtype", help="bfloat16 | float32 | float16 (default: the checkpoint's own dtype, else bfloat16)")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists (only once the new one is complete)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _default_dtype(hf_config: dict[str, Any]) -> str:
    from ddtree_jax.checkpoint import DTYPES

    d = hf_config.get("torch_dtype") or hf_config.get("dtype")
    return d if d in DTYPES else DEFAULT_DTYPE


class _Source:
    """One HF model to convert: its config, its tensors and the name mapping, all validated."""

    def __init__(self, model_dir: str, what: str, kind: str):
        self.dir = Path(model_dir).absolute()
        self.what = what
        self.raw = hf.read_config(self.dir, what)
        self.cfg: TargetConfig | DrafterConfig = (
            TargetConfig.from_hf(self.raw, where=str(self.dir / "config.json")) if kind == "target"
            else DrafterConfig.from_hf(self.raw, where=str(self.dir / "config.json")))
        self.kind = kind
        self.tensors: dict[str, hf.TensorInfo] = {}
        self.mapping: dict[str, str] = {}
        self.entries = names.entries_for(self.cfg)

    def scan(self) -> None:
        self.tensors = hf.scan(self.dir)
        self.mapping = names.match(
            self.entries, {n: t.shape for n, t in self.tensors.items()}, where=str(self.dir),
            tied=self.kind == "target" and self.cfg.tie_embeddings,
            strip_prefix="model." if self.kind == "drafter" else None)
        for e in self.entries:
            info = self.tensors[self.mapping[e.hf_name]]
            if info.dtype not in hf.SAFETENSORS_DTYPES:
                info.read()  # raises the one-line dtype error

    def convert(self, dt: np.dtype, bar) -> dict[str, Any]:
        """Read, cast and transpose every tensor, one at a time, into our param tree."""
        params = names.empty_tree(self.cfg)
        for e in self.entries:
            src = self.tensors[self.mapping[e.hf_name]].read()
            # one copy from the memory map: cast and transpose together, C-contiguous
            names.set_path(params, e.path, np.array(src.T if e.transpose else src, dtype=dt, order="C"))
            del src
            bar.update(1)
        return params


def _refuse_overlap(out: Path, sources: list[tuple[str, str]]) -> None:
    """An output that is, lies inside or holds a source directory would destroy it (with --force,
    or by renaming over it): refused whatever the flags."""
    o = Path(os.path.realpath(out))
    for src, flag in sources:
        s = Path(os.path.realpath(src))
        if o == s or s in o.parents or o in s.parents:
            where = "is" if o == s else "lies inside" if s in o.parents else "holds"
            raise UserError(f"--out {out} {where} the {flag} directory {src}; write the converted checkpoint "
                            "to a directory of its own")


def convert(target: str | Path, out: str | Path, *, draft: str | Path | None = None, dtype: str | None = None,
            force: bool = False, progress: bool = True) -> Path:
    """Convert a HF target (and optionally a DFlash drafter) into a converted checkpoint at `out`."""
    from tqdm import tqdm

    from ddtree_jax import checkpoint as ck

    if dtype is not None:
        ck.resolve_dtype(dtype)
    tgt = _Source(str(target), "--target", "target")
    drf = _Source(str(draft), "--draft", "drafter") if draft is not None else None
    if drf is not None:
        check_pair(tgt.cfg, drf.cfg)
    _refuse_overlap(Path(out), [(src.dir, src.what) for src in (tgt, drf) if src is not None])
    out = ck.check_writable(out, force)
    tgt.scan()
    if drf is not None:
        drf.scan()
    dtype = dtype or _default_dtype(tgt.raw)
    dt = ck.resolve_dtype(dtype)

    import orbax.checkpoint  # noqa: F401  (slow import; before the progress bar, so its rate means something)

    total = len(tgt.entries) + (len(drf.entries) if drf else 0)
    bar = tqdm(total=total, desc="converting", unit="tensor", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        with ck.atomic_directory(out, force) as tmp, bar:
            params = tgt.convert(dt, bar)
            ck.write_model(tmp / "target", tgt.raw, params)
            del params  # before the drafter is read: peak memory is one model
            if drf is not None:
                params = drf.convert(dt, bar)
                ck.write_model(tmp / "draft", drf.raw, params)
                del params
            files = ck.copy_tokenizer(tgt.dir, tmp / "tokenizer")
            ck.write_meta(tmp, ck.make_meta(
                dtype=dtype, target_cfg=tgt.cfg, target_source=str(tgt.dir),
                drafter_cfg=drf.cfg if drf else None, drafter_source=str(drf.dir) if drf else None,
                tokenizer=files, tokenizer_source=str(tgt.dir)))
    except OSError as e:  # disk full, a file changed under us, ...
        raise UserError(f"conversion failed: {e}; nothing was written to {out}") from e
    return out


def run(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = convert(args.target, args.out, draft=args.draft, dtype=args.dtype, force=args.force)
    what = "target and drafter" if args.draft else "target"
    print(f"wrote {out} ({what})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI entry point: errors become one line on stderr and exit code 2 (see errors.cli_main)."""
    return cli_main(run, argv)
