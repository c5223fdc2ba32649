"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer` (tokenizer.json), plus its
chat template and its stop ids.

Only byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are rebuilt, with the
pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`:
- "smollm", "starcoder", "refact", "codeshell": every digit split alone, then GPT-2's split (what
  SmolLM2's own tokenizer.json does: Digits(individual) + ByteLevel);
- "gpt2", "default", "mpt", "olmo": GPT-2's split alone.
Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens,
so both are matched whole in text.

No BOS is added when encoding, even when the file sets `tokenizer.ggml.add_bos_token` (SmolLM2's
does, naming `<|im_start|>`): the model's own Hugging Face tokenizer adds none, and neither does
transformers' GGUF loader. llama.cpp does add it; prompts compared with llama.cpp go as token ids.

Stop ids: the file's eos/eot/eom ids plus every control token spelled like an end of turn or of text
(`<|im_end|>`, `<|endoftext|>`, ...), the way llama.cpp collects its end-of-generation set.
The chat template renders in jinja2's immutable sandbox: a template is data, never code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from sol_control.lm.gguf_reader import gguf_field, open_gguf

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell")
GPT2_SPLIT_PRE = ("gpt2", "default", "mpt", "olmo")
END_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>",
             "<|eom_id|>", "</s>", "<EOT>")


@dataclass(frozen=True)
class LMTokenizer:
    tokenizer: Tokenizer
    stop_ids: tuple[int, ...]        # generation ends on any of these
    chat_template: str | None = None  # jinja2, Hugging Face conventions (messages, add_generation_prompt)
    bos_token: str | None = None
    eos_token: str | None = None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it (`<|im_start|>`) become their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation ([{"role": ..., "content": ...}]) by the chat template."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template (tokenizer.chat_template is missing)")
        template = _jinja().from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def to_json(self) -> str:
        """tokenizer.json text (what a bundle stores; `Tokenizer.from_str` reads it back)."""
        return self.tokenizer.to_str()


def _raise(message: str) -> None:
    raise TemplateError(message)


def _jinja() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    return env


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in GPT2_SPLIT_PRE:
        return byte_level
    raise ValueError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported (supported: "
                     f"{DIGIT_SPLIT_PRE + GPT2_SPLIT_PRE})")


def build_bpe(tokens: list[str], token_types: list[int], merges: list[str], pre: str) -> Tokenizer:
    """A byte-level BPE tokenizer: vocabulary in id order, merges by rank, added tokens by type."""
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"GGUF tokenizer.ggml.tokens holds {len(tokens) - len(vocab)} duplicate tokens")
    if len(token_types) != len(tokens):
        raise ValueError(f"GGUF tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens")
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError("GGUF tokenizer.ggml.merges holds an entry without a space between its two parts")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, token_types) if kind == TOKEN_CONTROL]
    user = [t for t, kind in zip(tokens, token_types) if kind == TOKEN_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tokenizer


def stop_ids(reader: gguf.GGUFReader, tokens: list[str], token_types: list[int]) -> tuple[int, ...]:
    """The declared eos/eot/eom ids, plus control tokens spelled like an end of turn or of text."""
    declared = {gguf_field(reader, f"tokenizer.ggml.{key}_token_id", None) for key in ("eos", "eot", "eom")}
    named = {i for i, (t, kind) in enumerate(zip(tokens, token_types)) if kind == TOKEN_CONTROL and t in END_TEXTS}
    ids = sorted(int(i) for i in (declared | named) if i is not None)
    for i in ids:
        if not 0 <= i < len(tokens):
            raise ValueError(f"GGUF stop token id {i} lies outside the vocabulary [0, {len(tokens)})")
    if not ids:
        raise ValueError("GGUF declares no eos/eot token and has no end-of-text control token")
    return tuple(ids)


def _token(tokens: list[str], index: int | None) -> str | None:
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def read_gguf_tokenizer(source: str | Path | gguf.GGUFReader) -> LMTokenizer:
    """The tokenizer, stop ids and chat template of a GGUF file (or an open reader)."""
    reader = source if isinstance(source, gguf.GGUFReader) else open_gguf(source)
    kind = gguf_field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    types = gguf_field(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    tokenizer = build_bpe(tokens, types, gguf_field(reader, "tokenizer.ggml.merges"),
                          gguf_field(reader, "tokenizer.ggml.pre", "default"))
    stops = stop_ids(reader, tokens, types)
    return LMTokenizer(
        tokenizer=tokenizer, stop_ids=stops, chat_template=gguf_field(reader, "tokenizer.chat_template", None),
        bos_token=_token(tokens, gguf_field(reader, "tokenizer.ggml.bos_token_id", None)),
        eos_token=_token(tokens, gguf_field(reader, "tokenizer.ggml.eos_token_id", None)),
    )
