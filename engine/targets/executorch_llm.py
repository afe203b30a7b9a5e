"""ExecuTorch's own LLM runner (`executorch.extension.llm.runner.TextLLMRunner`) on a
generation-ready `.pte` as delivered: the generation check run again by its loop.

The runner takes text and gives text: its tokenizer encodes the prompt, its sampler picks
each token over the tokenizer's vocabulary, and its callback gets each token's text. To
check token ids, the runner is given a *numbered* tokenizer written for the check: a
byte-level BPE `tokenizer.json` (the runner's Hugging Face format) in which id `i` is the
text `" i"`, so a prompt of ids is the text of its numbers and each piece the runner emits
names its id. Eleven ids no prompt uses are the tokenizer's base symbols (`" "` and the ten
digits, from which BPE merges the numbers). The runner stops at the `.pte`'s
`get_eos_ids`, so each run is compared with eager's tokens up to and including the first
of them. `reset()` starts each run again at position 0, as a new conversation does.

The checkpoint's own tokenizer file beside the `.pte` (`tokenizer.json`, else
`tokenizer.model`) is loaded by the runner once, to say whether it can: either way a note.

What runs (for a sandbox profile): the runner's C++ code in this process, reading the
`.pte`, the tokenizer files and a temporary file in `$TMPDIR`; it prints the tokens it
generates on stdout.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.generation.ready import Generation
    from schemas.generation import GenerationCheck

__all__ = ["CHECKPOINT_TOKENIZERS", "Numbered", "numbered", "runtime_generation"]

CHECKPOINT_TOKENIZERS = ("tokenizer.json", "tokenizer.model")
"""The checkpoint's tokenizer files the runner loads, in the order it is given one."""
SPACE = "\u0120"
"""Byte-level BPE's symbol for a space."""
BASE = [SPACE, *"0123456789"]


@dataclass(frozen=True)
class Numbered:
    """A numbered tokenizer over `vocab` ids: id `i` is `" i"`, except `base` (the ids
    that are BPE's base symbols `" "`, `"0"`, …, `"9"`, in that order)."""

    vocab: int
    base: tuple[int, ...]

    def text(self, ids: list[int]) -> str:
        """The prompt text that encodes to `ids` (none of them in `base`)."""
        assert not set(ids) & set(self.base), "a prompt's ids are numbers"
        return "".join(f" {token}" for token in ids)

    def ids(self, pieces: list[str]) -> list[int]:
        """The ids the runner's pieces name (-1 for a piece that names none)."""
        symbols = {
            symbol.replace(SPACE, " "): token for symbol, token in zip(BASE, self.base, strict=True)
        }
        found = []
        for piece in pieces:
            number = piece[1:]
            if piece in symbols:
                found.append(symbols[piece])
            elif piece.startswith(" ") and number.isdigit() and str(int(number)) == number:
                found.append(int(number) if int(number) < self.vocab else -1)
            else:
                found.append(-1)
        return found

    def write(self, path: Path) -> Path:
        """The tokenizer as `tokenizer.json` at `path`."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        numbers = [token for token in range(self.vocab) if token not in self.base]
        vocab = {f"{SPACE}{token}": token for token in numbers}
        vocab.update(zip(BASE, self.base, strict=True))
        merges = [(f"{SPACE}{str(token)[:-1]}", str(token)[-1]) for token in numbers]
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.save(str(path))
        return path


def numbered(vocab: int, prompts: list[list[int]]) -> Numbered | None:
    """A numbered tokenizer for `prompts`: its base symbols are the highest ids no
    prompt uses, each at least a tenth of `vocab` (so no number's prefix is one); None
    when there are not enough."""
    used = {token for prompt in prompts for token in prompt}
    free = [token for token in range(vocab - 1, vocab // 10, -1) if token not in used]
    if len(free) < len(BASE):
        return None
    return Numbered(vocab, tuple(free[: len(BASE)]))


def installed() -> bool:
    """Whether ExecuTorch's LLM runner imports here."""
    try:
        from executorch.extension.llm.runner import TextLLMRunner  # noqa: F401
    except (ImportError, RuntimeError):  # RuntimeError: a build without it
        return False
    return True


def runtime_generation(
    path: Path, generation: Generation, settings: dict[str, Any], notes: list[str]
) -> GenerationCheck | None:
    """The generation check run by `TextLLMRunner` on the `.pte` at `path` (a decoder-only
    LLM's, method `forward`), every prompt on one runner; None, with a note where it
    cannot run (the `.pte` itself was verified)."""
    metadata = settings.get("constant_methods") or {}
    if generation.encoder is not None or settings.get("method", "forward") != "forward":
        return None
    if not metadata or not installed():
        return None
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from engine.generation.checks import checked
    from engine.targets.executorch_attention import load_kernels

    load_kernels()  # a `.pte` attending through ExecuTorch's LLM ops needs their kernels

    _checkpoint_tokenizer(path, notes)
    prompts = generation.prompts()
    made = numbered(
        int(metadata.get("get_vocab_size", 0)), [_ids(prompt.ids) for prompt in prompts]
    )
    if made is None:
        notes.append("ExecuTorch's TextLLMRunner did not run: the vocabulary is too small.")
        return None
    with tempfile.TemporaryDirectory() as folder:
        try:
            runner = TextLLMRunner(str(path), str(made.write(Path(folder) / "tokenizer.json")))

            def generate(prompt: Any, expected: list[int]) -> list[int]:
                runner.reset()
                pieces: list[str] = []
                config = GenerationConfig(
                    echo=False, max_new_tokens=generation.max_new_tokens, temperature=0.0
                )
                runner.generate(made.text(_ids(prompt.ids)), config, pieces.append)
                return made.ids(pieces)

            return checked(generation, generate, stops=metadata.get("get_eos_ids") or ())
        except Exception as exc:  # the runner's own refusal
            notes.append(f"ExecuTorch's TextLLMRunner could not generate with it: {exc}"[:1000])
            return None


def _checkpoint_tokenizer(path: Path, notes: list[str]) -> None:
    """A note on whether the runner loads the checkpoint's tokenizer file beside `path`."""
    from executorch.extension.llm.runner import TextLLMRunner

    found = next(
        (path.with_name(name) for name in CHECKPOINT_TOKENIZERS if path.with_name(name).is_file()),
        None,
    )
    if found is None:
        return
    try:
        TextLLMRunner(str(path), str(found))
    except Exception as exc:
        notes.append(
            f"ExecuTorch's TextLLMRunner cannot load the checkpoint's {found.name} ({exc}); "
            "give it a tokenizer it reads (a Hugging Face tokenizer.json, SentencePiece or "
            "tiktoken file)."[:1000]
        )
        return
    notes.append(
        f"ExecuTorch's TextLLMRunner loads it with the checkpoint's {found.name}: "
        f"TextLLMRunner('{path.name}', '{found.name}')."
    )


def _ids(tokens: Any) -> list[int]:
    return [int(token) for token in tokens.flatten()]
