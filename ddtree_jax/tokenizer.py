"""A checkpoint's tokenizer as `transformers` would use it, without importing `transformers`.

`tokenizer.json` is read with the `tokenizers` library and `tokenizer_config.json` for the
special tokens and the chat template, which renders with jinja2 as `transformers` renders it
(sandboxed, `trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`, `tojson`).
Importing `transformers` costs ~3 s of a command's start; a tokenizer without `tokenizer.json`
(sentencepiece or vocab + merges only) still goes through it.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Sequence

from ddtree_jax.errors import UserError, read_json_file

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


class Tokenizer:
    """encode / decode / apply_chat_template / eos_token_id, as `transformers`' fast tokenizers."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        config_file = self.dir / "tokenizer_config.json"
        self.config: dict = {}
        if config_file.is_file():
            self.config = read_json_file(config_file, missing="")
            if not isinstance(self.config, dict):
                raise UserError(f"{config_file} must hold a JSON object; reconvert the checkpoint")
        self.chat_template = self._read_chat_template()
        self._fast = None
        self._slow = None
        if (self.dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as Fast

            try:
                self._fast = Fast.from_file(str(self.dir / "tokenizer.json"))
            except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exceptions
                raise UserError(f"cannot read {self.dir / 'tokenizer.json'}: {str(e).splitlines()[0]}") from None
        else:
            from transformers import AutoTokenizer

            try:
                self._slow = AutoTokenizer.from_pretrained(str(self.dir))
            except Exception as e:  # noqa: BLE001 - transformers raises many types here
                raise UserError(f"cannot load the tokenizer from {self.dir}: {e}".splitlines()[0]) from None
        self.special = {name: _content(self.config.get(name)) for name in SPECIAL_NAMES}
        self._template = None

    # ------------------------------------------------------------------ tokens

    def token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        if self._slow is not None:
            return self._slow.convert_tokens_to_ids(token)
        return self._fast.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        if self._slow is not None:
            return self._slow.eos_token_id
        return self.token_id(self.special["eos_token"])

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the special tokens (the configured ones and those tokenizer.json marks special)."""
        if self._slow is not None:
            return list(self._slow.all_special_ids)
        names = [self.special[n] for n in SPECIAL_NAMES] + [
            _content(t) for t in self.config.get("additional_special_tokens") or []]
        ids = {self.token_id(n) for n in names if n is not None}
        ids |= {i for i, t in self._fast.get_added_tokens_decoder().items() if t.special}
        return sorted(i for i in ids if i is not None)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.special["bos_token"])

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens: the tokenizer's own (a Llama-3 BOS), as
        `transformers` adds them by default."""
        if self._slow is not None:
            return list(self._slow.encode(text, add_special_tokens=add_special_tokens))
        ids = self._fast.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        # a config that asks for a BOS the tokenizer.json's post-processor does not add
        if add_special_tokens and self.config.get("add_bos_token") is True and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._slow is not None:
            return self._slow.decode(list(ids), skip_special_tokens=skip_special_tokens)
        text = self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.config.get("clean_up_tokenization_spaces"):
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text

    # ------------------------------------------------------------------ chat

    def _read_chat_template(self) -> str | None:
        if (self.dir / "chat_template.jinja").is_file():
            return (self.dir / "chat_template.jinja").read_text(encoding="utf-8")
        template = self.config.get("chat_template")
        if template is None and (self.dir / "chat_template.json").is_file():
            template = read_json_file(self.dir / "chat_template.json", missing="").get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise UserError(f"the chat template in {self.dir} is not text; fix tokenizer_config.json")
        return template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as text, rendered as `transformers` renders chat templates."""
        if self.chat_template is None:
            raise UserError("the tokenizer has no chat template; drop --chat / --system")
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if self._template is None:
            def raise_exception(message):
                raise jinja2.exceptions.TemplateError(message)

            def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                  sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.exceptions.TemplateSyntaxError as e:
                raise UserError(f"the chat template of {self.dir} has a syntax error at line {e.lineno}: "
                                f"{e.message}; fix it or drop --chat") from None
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **{k: v for k, v in self.special.items() if v is not None})
        except jinja2.exceptions.TemplateError as e:
            raise UserError(f"the chat template of {self.dir} failed: {e}; fix it or drop --chat") from None


def load_tokenizer(source) -> Tokenizer:
    """The tokenizer of a loaded `Checkpoint`, or of a directory (None: a checkpoint without one)."""
    tokenizer_dir = getattr(source, "tokenizer_dir", source)
    if tokenizer_dir is None:
        raise UserError("the checkpoint has no tokenizer files; reconvert with a target directory that has them")
    return Tokenizer(tokenizer_dir)
