"""Converted checkpoints: one directory holding the target, the drafter, their configs and the tokenizer.

    DIR/ddtree.json                {"format": 2, "dtype": ..., "target": {...}, "drafter": {...} | null,
                                    "tokenizer": [files] | null, ...}
    DIR/target/config.json         the Hugging Face config, as found
    DIR/target/params.safetensors  the target's params by dotted name ("layers.3.q"), in the layout of
                                   ddtree_jax/checkpoint/names.py
    DIR/draft/config.json          (only with a drafter)
    DIR/draft/params.safetensors
    DIR/tokenizer/                 tokenizer files copied from the target directory (only when present)

Params are stored as safetensors, not orbax: a safetensors file is written one tensor at a time
(orbax saves a whole tree held in memory) and any tensor reads alone, so converting and loading
hold one tensor at a time (ddtree_jax/checkpoint/tensors.py). Format 1 (orbax, DIR/*/params/)
still loads. Nothing is pinned to a device or a sharding. `load_checkpoint` also takes a Hugging
Face model directory (config.json and safetensors) and reads it through the same name table.
Directories are written atomically (`atomic_directory`): into a temporary sibling, renamed into
place only when complete, so an error or an interrupt never leaves a half-written checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np

from ddtree_jax.drafters.dflash2 import drafter_config_from_hf
from ddtree_jax.errors import UserError, read_json_file
from ddtree_jax.models.config import DrafterConfig, TargetConfig, check_pair
from ddtree_jax.models.family import target_config_from_hf
from ddtree_jax.models.hybrid import HybridConfig

FORMAT = 2
READABLE_FORMATS = (1, 2)  # 1: orbax params directories
PARAMS_FILE = "params.safetensors"
# The small pair that ships with the package (default_model/README.md says how it was trained).
DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "default_model"
META_FILE = "ddtree.json"
DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "generation_config.json",
    "chat_template.jinja", "chat_template.json",
)
TOKENIZER_DIRS = ("additional_chat_templates",)
# A tokenizer directory is usable when it has one of these.
_TOKENIZER_CORE = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclasses.dataclass
class Checkpoint:
    target_cfg: TargetConfig | HybridConfig
    target_params: dict[str, Any]
    drafter_cfg: DrafterConfig | None
    drafter_params: dict[str, Any] | None
    tokenizer_dir: Path | None
    meta: dict[str, Any]
    path: Path | None = None


def resolve_dtype(dtype: Any) -> np.dtype:
    """"bfloat16" | "float32" | "float16" (or a numpy/jax dtype) -> numpy dtype; UserError otherwise."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        return DTYPES[dtype]
    dt = np.dtype(dtype)
    if dt not in DTYPES.values():
        raise UserError(f"unsupported dtype {dt}; valid: {', '.join(DTYPES)}")
    return dt


def dtype_name(dt: Any) -> str:
    return np.dtype(dt).name


# ---------------------------------------------------------------------------------------------
# Atomic directories


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so cleanup handlers run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class InterruptsDeferred:
    """SIGINT/SIGTERM inside the block are held and raised as KeyboardInterrupt when it ends.

    For checkpoint writes and renames: an interrupt in the middle of an orbax save would leave its background
    threads writing into a directory that the cleanup has just removed, and blocking the signals
    with pthread_sigmask in the main thread does not stop them (another thread takes the signal
    and Python still raises in the main thread). Python-level handlers always run in the main
    thread, so holding the signal here works. Nested blocks hold it until the outermost ends.
    """

    _depth = 0
    _pending: int | None = None
    _old: dict = {}
    _note: str | None = None

    def __init__(self, note: str | None = None):
        self.note = note  # printed when a signal is held, so a waiting user knows why

    def __enter__(self):
        cls = type(self)
        if not on_main_thread():
            return self
        if cls._depth == 0:
            cls._pending = None
            cls._note = self.note
            cls._old = {s: signal.signal(s, cls._hold) for s in (signal.SIGINT, signal.SIGTERM)}
        cls._depth += 1
        return self

    @classmethod
    def _hold(cls, signum, frame):
        if cls._pending is None and cls._note:
            print(f"interrupted: {cls._note}", file=sys.stderr, flush=True)
        cls._pending = signum

    def __exit__(self, exc_type, exc, tb):
        cls = type(self)
        if not on_main_thread():
            return False
        cls._depth -= 1
        if cls._depth == 0:
            for s, h in cls._old.items():
                signal.signal(s, h)
            if cls._pending is not None and exc_type is None:
                cls._pending = None
                raise KeyboardInterrupt
        return False


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()


def check_writable(path: str | Path, force: bool) -> Path:
    """Refuse an existing output unless `force`; call it before long work to fail early."""
    path = Path(path).absolute()
    if (path.exists() or path.is_symlink()) and not force:
        raise UserError(f"{path} already exists; pass --force to replace it, or choose another output directory")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write to {parent}; choose another output directory")
    return path


@contextlib.contextmanager
def atomic_directory(path: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory that becomes `path` when the block completes.

    It is a sibling `PATH.tmp-<pid>` (same filesystem, so the final rename is atomic). On any
    exception, KeyboardInterrupt or SIGTERM it is removed and `path` is untouched. An existing
    `path` is refused unless `force`; then it is replaced only once the new directory is complete.
    """
    path = check_writable(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    tmp = path.with_name(f"{path.name}.tmp-{pid}")
    old = path.with_name(f"{path.name}.old-{pid}")
    _remove(tmp)  # a leftover of a killed process that had our pid
    with _sigterm_as_interrupt():
        try:
            tmp.mkdir()
            yield tmp
            with InterruptsDeferred():  # the renames complete, then the interrupt is raised
                if path.exists() or path.is_symlink():
                    _remove(old)
                    path.rename(old)
                    tmp.rename(path)
                    _remove(old)
                else:
                    tmp.rename(path)
        except BaseException:
            if old.exists() and not path.exists():
                old.rename(path)
            _remove(tmp)
            raise


# ---------------------------------------------------------------------------------------------
# Param trees


def _to_host(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_to_host(v) for v in tree]
    return np.asarray(tree)  # a jax.Array is fetched to the host here


def _lists_back(tree: Any) -> Any:
    """Undo a dict with keys "0".."n-1" that some orbax versions make of a list."""
    if isinstance(tree, dict):
        tree = {k: _lists_back(v) for k, v in tree.items()}
        if tree and all(isinstance(k, str) and k.isdigit() for k in tree):
            keys = sorted(tree, key=int)
            if [int(k) for k in keys] == list(range(len(keys))):
                return [tree[k] for k in keys]
        return tree
    if isinstance(tree, (list, tuple)):
        return [_lists_back(v) for v in tree]
    return tree


def _cast_in_place(tree: Any, dt: np.dtype | None) -> None:
    """Make every leaf a host numpy array (of dtype `dt`), one leaf at a time to bound memory."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in list(items):
        if isinstance(v, (dict, list)):
            _cast_in_place(v, dt)
        else:
            a = np.asarray(v)
            tree[k] = a if dt is None or a.dtype == dt else a.astype(dt)


def save_params(path: str | Path, params: Any) -> None:
    """Write a param tree (dicts, lists, arrays) with orbax. `path` must not exist yet."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    tree = _to_host(params)
    # orbax's writer threads outlive an interrupt of the main thread and would write into the
    # directory the cleanup removes: the save runs to its end, then the interrupt is raised
    with InterruptsDeferred("finishing the write in progress, then removing it"):
        ckptr = ocp.PyTreeCheckpointer()
        ckptr.save(path, tree)
        if hasattr(ckptr, "close"):
            ckptr.close()


_SILENCED = False


def _silence_closed_loop_callbacks() -> None:
    """Around a restore: when it fails, tensorstore callbacks of the aborted reads still arrive
    on other threads and hit orbax's closed event loop; their 'Event loop is closed' tracebacks
    (printed through sys.excepthook by the C++ callback, or through threading.excepthook /
    sys.unraisablehook) would come with the one-line error. Drop exactly those. Installed before
    the restore (a callback may fire before the failure reaches us), once per process."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    import threading

    def closed_loop(exc) -> bool:
        return isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc)

    def quiet_thread(args, _previous=threading.excepthook):
        if not closed_loop(args.exc_value):
            _previous(args)

    def quiet_unraisable(u, _previous=sys.unraisablehook):
        if not closed_loop(u.exc_value):
            _previous(u)

    def quiet_excepthook(typ, value, tb, _previous=sys.excepthook):
        if not closed_loop(value):
            _previous(typ, value, tb)

    threading.excepthook = quiet_thread
    sys.unraisablehook = quiet_unraisable
    sys.excepthook = quiet_excepthook


def _quiet_aborted_reads() -> None:
    """After a failed restore: the restore's other reads fail too, and when their asyncio tasks
    are collected (often at exit) asyncio logs each as "Task exception was never retrieved" with
    its traceback, after the one-line error (seen once in CI). Their errors are the
    one already reported: drop exactly those records from the asyncio logger."""
    import logging

    logging.getLogger("asyncio").addFilter(
        lambda record: not record.getMessage().startswith("Task exception was never retrieved"))


def load_params(path: str | Path, dtype: Any = None) -> Any:
    """Restore a param tree written by `save_params` as host numpy arrays (lists stay lists)."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    if not path.is_dir():
        raise UserError(f"{path} not found; the checkpoint is incomplete, convert it again")
    dt = resolve_dtype(dtype) if dtype is not None else None
    ckptr = ocp.PyTreeCheckpointer()
    _silence_closed_loop_callbacks()
    try:
        tree = ckptr.restore(path)
    except (FileNotFoundError, ValueError) as e:
        why = (str(e).splitlines() or [""])[0][:200]
        _quiet_aborted_reads()
        raise UserError(f"cannot restore {path} ({type(e).__name__}: {why}); convert it again") from None
    finally:
        if hasattr(ckptr, "close"):
            ckptr.close()
    tree = _lists_back(tree)
    _cast_in_place(tree, dt)
    return tree


def params_dtype(params: Any) -> str:
    """The dtype name of the matrices of a param tree (norms may be kept wider by some callers)."""
    leaves = list(_leaves(params))
    mats = [a for a in leaves if a.ndim == 2] or leaves
    return dtype_name(mats[0].dtype) if mats else "float32"


def _leaves(tree: Any) -> Iterator[Any]:
    for v in (tree.values() if isinstance(tree, dict) else tree):
        if isinstance(v, (dict, list, tuple)):
            yield from _leaves(v)
        else:
            yield v


# ---------------------------------------------------------------------------------------------
# Checkpoint directories


def write_params(path: Path, cfg: TargetConfig | DrafterConfig, params: Any, *, dtype: Any = None,
                 on_tensor: Callable[[], None] | None = None) -> None:
    """Write a param tree (names.py's layout; arrays or LazyTensors) to one safetensors file, one
    tensor at a time in the name table's order: each is read (a LazyTensor), cast to `dtype`,
    written and released before the next, so the host holds one tensor. `path` must not exist.

    An MoE layer's experts are stored stacked, [E, in, out] per param (a StackedTensor fills it
    one expert at a time): the file keeps one tensor per param, which loads with one read and one
    device copy, at the price of holding one such array (one layer's gate, up or down experts)."""
    from ddtree_jax.checkpoint import names
    from ddtree_jax.checkpoint.tensors import StreamWriter

    dt = None if dtype is None else resolve_dtype(dtype)
    leaves = [(e, names.get_path(params, e.path)) for e in names.entries_for(cfg)]
    specs = [(e.key, e.shape, dt or leaf.dtype) for e, leaf in leaves]
    with StreamWriter(path, specs, metadata={"format": "ddtree_jax", "layout": "names.py"}) as w:
        for e, leaf in leaves:
            w.write(e.key, np.asarray(leaf) if dt is None else np.asarray(leaf).astype(dt, copy=False))
            if on_tensor is not None:
                on_tensor()


def write_model(model_dir: Path, hf_config: dict[str, Any], cfg: TargetConfig | DrafterConfig, params: Any, *,
                dtype: Any = None, on_tensor: Callable[[], None] | None = None) -> None:
    """model_dir/config.json (the HF config) and model_dir/params.safetensors (write_params)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    write_params(model_dir / PARAMS_FILE, cfg, params, dtype=dtype, on_tensor=on_tensor)


def copy_tokenizer(src: Path | None, dst: Path) -> list[str] | None:
    """Copy the tokenizer files of `src` to `dst`; the copied names, or None when `src` has no tokenizer
    (none of tokenizer.json, tokenizer.model, vocab.json)."""
    if src is None or _tokenizer_in(src) is None:
        return None
    names = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    dirs = [n for n in TOKENIZER_DIRS if (src / n).is_dir()]
    dst.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copy2(src / n, dst / n)
    for n in dirs:
        shutil.copytree(src / n, dst / n)
    return names + [n + "/" for n in dirs]


def make_meta(*, dtype: str, target_cfg: TargetConfig, target_source: str | None,
              drafter_cfg: DrafterConfig | None, drafter_source: str | None,
              tokenizer: list[str] | None, tokenizer_source: str | None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "format": FORMAT,
        "dtype": dtype,
        "target": {"architecture": target_cfg.architecture, "family": target_cfg.family,
                   "source": target_source, "num_layers": target_cfg.num_layers},
        "drafter": None if drafter_cfg is None else {
            "architecture": getattr(drafter_cfg, "architecture", "DFlashDraftModel"), "source": drafter_source,
            "num_layers": drafter_cfg.num_layers, "block_size": drafter_cfg.block_size,
            "target_layer_ids": list(drafter_cfg.target_layer_ids), "mask_token_id": drafter_cfg.mask_token_id},
        "tokenizer": tokenizer,
    }
    if tokenizer is None:
        meta["tokenizer_note"] = (f"no tokenizer (tokenizer.json, tokenizer.model or vocab.json) in {tokenizer_source}"
                                  if tokenizer_source else "no tokenizer given")
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(meta.get(k), dict):
            meta[k] = {**meta[k], **v}
        else:
            meta[k] = v
    return meta


def write_meta(ckpt_dir: Path, meta: dict[str, Any]) -> None:
    (ckpt_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def save_checkpoint(path: str | Path, target_cfg_hf: dict[str, Any], target_params: Any,
                    drafter_cfg_hf: dict[str, Any] | None, drafter_params: Any,
                    tokenizer_src: str | Path | None, *, force: bool = False,
                    meta: dict[str, Any] | None = None) -> Path:
    """Write a converted checkpoint atomically; validates configs, the pair and every param shape.

    `meta` entries are merged into ddtree.json (dict values one level deep, e.g. {"target":
    {"source": ...}} or {"training": {...}}).
    """
    from ddtree_jax.checkpoint.names import check_params

    target_cfg = target_config_from_hf(target_cfg_hf)
    check_params(target_cfg, target_params, where="target params")
    drafter_cfg = None
    if drafter_cfg_hf is not None:
        drafter_cfg = drafter_config_from_hf(drafter_cfg_hf)
        check_pair(target_cfg, drafter_cfg)
        check_params(drafter_cfg, drafter_params, where="drafter params")
    src = Path(tokenizer_src) if tokenizer_src is not None else None
    with atomic_directory(path, force) as tmp:
        write_model(tmp / "target", target_cfg_hf, target_cfg, target_params)
        if drafter_cfg is not None:
            write_model(tmp / "draft", drafter_cfg_hf, drafter_cfg, drafter_params)
        files = copy_tokenizer(src, tmp / "tokenizer")
        write_meta(tmp, make_meta(
            dtype=params_dtype(target_params), target_cfg=target_cfg, target_source=None,
            drafter_cfg=drafter_cfg, drafter_source=None, tokenizer=files,
            tokenizer_source=str(src) if src else None, extra=meta))
    return Path(path).absolute()


def _not_converted(path: Path, why: str) -> UserError:
    return UserError(f"{path} is not a converted checkpoint or a Hugging Face model directory: {why}; run "
                     f"python -m convert --target HF_DIR [--draft HF_DIR] --out {path} first")


def is_hf_model(path: str | Path) -> bool:
    """A Hugging Face model directory rather than a converted checkpoint (no ddtree.json)."""
    from ddtree_jax.checkpoint.hf import is_hf_dir

    return not (Path(path) / META_FILE).exists() and is_hf_dir(path)


def read_meta(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint {path} not found; run python -m convert --target HF_DIR [--draft HF_DIR] "
                        f"--out {path} first")
    if not path.is_dir():
        raise _not_converted(path, "not a directory")
    mf = path / META_FILE
    if not mf.is_file():
        why = "config.json but no model.safetensors[.index.json]" if (path / "config.json").is_file() else f"no {META_FILE}"
        raise _not_converted(path, why)
    try:
        meta = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _not_converted(path, f"{META_FILE} is not valid JSON") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt not in READABLE_FORMATS:
        raise UserError(f"{path} has checkpoint format {fmt!r}, this version reads formats "
                        f"{', '.join(map(str, READABLE_FORMATS))}; convert the model again with this version "
                        "(python -m convert ...)")
    return meta


def _read_json(p: Path) -> dict[str, Any]:
    return read_json_file(p, missing="the checkpoint is incomplete, convert it again", invalid="; convert it again")


def read_target_config(path: str | Path) -> TargetConfig | HybridConfig:
    """A checkpoint's (or a Hugging Face directory's) target config alone, no weights read: cheap checks first."""
    path = Path(path).absolute()
    if is_hf_model(path):
        from ddtree_jax.checkpoint.hf import read_config

        return target_config_from_hf(read_config(path, "--target"), where=str(path / "config.json"))
    read_meta(path)
    return target_config_from_hf(_read_json(path / "target" / "config.json"),
                                 where=str(path / "target" / "config.json"))


def has_drafter(path: str | Path) -> bool:
    """Whether a checkpoint holds a drafter (a Hugging Face directory is a target alone)."""
    path = Path(path).absolute()
    return not is_hf_model(path) and read_meta(path).get("drafter") is not None


def tokenizer_dir(path: str | Path) -> Path | None:
    """A checkpoint's tokenizer folder (a Hugging Face directory's own files), or None where it has none."""
    path = Path(path).absolute()
    return _tokenizer_in(path if is_hf_model(path) else path / "tokenizer")


def _tokenizer_in(d: Path) -> Path | None:
    return d if any((d / n).is_file() for n in _TOKENIZER_CORE) else None


def default_dtype(hf_config: dict[str, Any]) -> str:
    """The dtype a Hugging Face model is read in unless told: its config's, else bfloat16."""
    d = hf_config.get("torch_dtype") or hf_config.get("dtype")
    return d if d in DTYPES else "bfloat16"


def read_params(path: Path, cfg: TargetConfig | DrafterConfig, *, dtype: Any = None, lazy: bool = False,
                where: str) -> dict[str, Any]:
    """A params.safetensors file (write_params) as a param tree, every name and shape checked
    against `cfg` from the header before any data is read. lazy: LazyTensor leaves, read when a
    loader asks (the Generator, one at a time to the device); else host numpy arrays."""
    from ddtree_jax.checkpoint import names
    from ddtree_jax.checkpoint.tensors import LazyTensor, read_header

    if not path.is_file():
        raise UserError(f"{path} not found; the checkpoint is incomplete, convert it again")
    dt = None if dtype is None else resolve_dtype(dtype)
    params: dict[str, Any] = {"layers": []}
    for key, info in read_header(path, fix="convert it again").items():
        parts = key.split(".")
        leaf = LazyTensor(info, dt)
        if len(parts) >= 3 and parts[0] == "layers" and parts[1].isdigit() and all(parts[2:]):
            layers = params["layers"]
            layers.extend({} for _ in range(int(parts[1]) + 1 - len(layers)))
            names.set_path(params, ("layers", int(parts[1]), *parts[2:]), leaf)
        elif len(parts) == 1 and key != "layers":
            params[key] = leaf
        else:
            raise UserError(f"{where}: unexpected param {key!r} in {path}; convert it again")
    names.check_params(cfg, params, where=where)
    for leaf in _leaves(params):
        leaf.src.check_dtype()
    return params if lazy else _materialize(params)


def _materialize(tree: Any) -> Any:
    """LazyTensor leaves read into host numpy arrays, one at a time."""
    if isinstance(tree, dict):
        return {k: _materialize(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_materialize(v) for v in tree]
    return np.asarray(tree)


def load_hf(target: str | Path, draft: str | Path | None = None, *, dtype: Any = None,
            lazy: bool = False) -> Checkpoint:
    """A Hugging Face target (and z-lab DFlash drafter) directory read straight, without a converted
    copy: the same name table and checks as python -m convert, every tensor cast to `dtype`
    (default: the target config's, else bfloat16) and put in our layout as it is read."""
    from ddtree_jax.checkpoint.hf import HFModel

    if dtype is not None:
        resolve_dtype(dtype)
    tgt = HFModel(target, "--target", "target")
    drf = HFModel(draft, "--draft", "drafter") if draft is not None else None
    if drf is not None:
        check_pair(tgt.cfg, drf.cfg)
    tgt.scan()
    if drf is not None:
        drf.scan()
    dtype = dtype or default_dtype(tgt.raw)
    dt = resolve_dtype(dtype)
    target_params = tgt.lazy_params(dt)
    drafter_params = drf.lazy_params(dt) if drf is not None else None
    if not lazy:
        target_params = _materialize(target_params)
        drafter_params = None if drafter_params is None else _materialize(drafter_params)
    tok = _tokenizer_in(tgt.dir)
    meta = make_meta(dtype=dtype_name(dt), target_cfg=tgt.cfg, target_source=str(tgt.dir),
                     drafter_cfg=drf.cfg if drf else None, drafter_source=str(drf.dir) if drf else None,
                     tokenizer=None if tok is None else [n for n in TOKENIZER_FILES if (tok / n).is_file()],
                     tokenizer_source=str(tgt.dir))
    return Checkpoint(tgt.cfg, target_params, drf.cfg if drf else None, drafter_params, tok, meta, tgt.dir)


def load_checkpoint(path: str | Path, *, dtype: Any = None, with_drafter: bool = True,
                    lazy: bool = False) -> Checkpoint:
    """Load a converted checkpoint (or a Hugging Face target directory, `load_hf`); `dtype` casts
    every param. Host numpy param trees, or with `lazy` trees of LazyTensors that a loader reads
    one at a time (the Generator: the host never holds the whole model)."""
    from ddtree_jax.checkpoint.names import check_params

    path = Path(path).absolute()
    if is_hf_model(path):
        return load_hf(path, dtype=dtype, lazy=lazy)
    meta = read_meta(path)
    if dtype is not None:
        resolve_dtype(dtype)  # fail before the long read
    target_cfg = target_config_from_hf(_read_json(path / "target" / "config.json"),
                                       where=str(path / "target" / "config.json"))
    drafter_cfg = None
    if with_drafter and meta.get("drafter") is not None and (path / "draft").is_dir():
        drafter_cfg = drafter_config_from_hf(_read_json(path / "draft" / "config.json"),
                                             where=str(path / "draft" / "config.json"))
        check_pair(target_cfg, drafter_cfg)

    def params(model: str, cfg: TargetConfig | DrafterConfig, what: str) -> Any:
        if meta["format"] == 1:  # orbax: the whole tree at once
            tree = load_params(path / model / "params", dtype)
            check_params(cfg, tree, where=f"{path} {what}")
            return tree
        return read_params(path / model / PARAMS_FILE, cfg, dtype=dtype, lazy=lazy, where=f"{path} {what}")

    target_params = params("target", target_cfg, "target")
    drafter_params = params("draft", drafter_cfg, "drafter") if drafter_cfg is not None else None
    return Checkpoint(target_cfg, target_params, drafter_cfg, drafter_params, tokenizer_dir(path), meta, path)
