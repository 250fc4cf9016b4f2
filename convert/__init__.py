"""Hugging Face checkpoint -> converted checkpoint (see ddtree_jax/checkpoint/ for the layout).

    python -m convert --target HF_DIR [--draft HF_DIR] --out DIR [--dtype bfloat16|float32|float16]
                      [--force] [--debug]

Every input is validated before the long work: directories, configs, the target/drafter pair, the
output path, and the name, dtype and shape of every tensor (from the safetensors headers). Then
tensors stream one at a time: read, cast, transposed to our [in, out] layout, written to the
output's safetensors file and released, so the host holds about one tensor (its raw bytes and its
converted copy; for a mixture-of-experts layer, one [E, in, out] expert param filled one expert at
a time). The output is written into a temporary directory renamed into place at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from ddtree_jax.checkpoint import hf
from ddtree_jax.errors import UserError, cli_main
from ddtree_jax.models.config import check_pair


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
    tgt = hf.HFModel(target, "--target", "target")
    drf = hf.HFModel(draft, "--draft", "drafter") if draft is not None else None
    if drf is not None:
        check_pair(tgt.cfg, drf.cfg)
    _refuse_overlap(Path(out), [(src.dir, src.what) for src in (tgt, drf) if src is not None])
    out = ck.check_writable(out, force)
    tgt.scan()
    if drf is not None:
        drf.scan()
    dtype = dtype or ck.default_dtype(tgt.raw)
    dt = ck.resolve_dtype(dtype)

    models = [(tgt, "target")] + ([(drf, "draft")] if drf is not None else [])
    total = sum(len(src.entries) for src, _ in models)
    bar = tqdm(total=total, desc="converting", unit="tensor", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        with ck.atomic_directory(out, force) as tmp, bar:
            for src, name in models:
                ck.write_model(tmp / name, src.raw, src.cfg, src.lazy_params(dt), on_tensor=lambda: bar.update(1))
            files = ck.copy_tokenizer(tgt.dir, tmp / "tokenizer")
            ck.write_meta(tmp, ck.make_meta(
                dtype=dtype, target_cfg=tgt.cfg, target_source=str(tgt.dir),
                drafter_cfg=drf.cfg if drf else None, drafter_source=str(drf.dir) if drf else None,
                tokenizer=files, tokenizer_source=str(tgt.dir)))
    except OSError as e:  # disk full, a file changed under us, ...
        raise UserError(f"conversion failed: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}; "
                        f"nothing was written to {out}") from e
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
