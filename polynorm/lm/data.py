"""Byte-level text from Python's own standard library, built deterministically.

The corpus is the ``*.py`` source of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``): real text that ships on every machine and that nobody
here wrote. Tokens are bytes (vocabulary 256), so there is no tokenizer to download.

Determinism: the file list is sorted by relative path, permuted once with a fixed-seed
``torch.Generator``, then split into validation files (first) and training files (after),
each up to a byte budget. The batch starts come from another fixed-seed generator, drawn
once for the whole run, so every backend trains on exactly the same batches. A different
Python version ships a different standard library, hence a different corpus; its SHA-256 is
recorded with every result.
"""

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["Corpus", "build_corpus", "stdlib_files", "batch_starts", "get_batch"]

# Directories left out: third-party packages and the stdlib's own test suites (long runs of
# generated data, odd encodings, deliberately broken files).
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})


@dataclass
class Corpus:
    """Training and validation bytes, each a 1-D uint8 tensor."""

    train: Tensor  # (N_train,) uint8
    val: Tensor  # (N_val,) uint8
    root: str
    files_train: int
    files_val: int
    sha256: str  # of the validation bytes followed by the training bytes

    def describe(self) -> str:
        return (
            f"{self.train.numel() / 2**20:.2f} MiB train ({self.files_train} files), "
            f"{self.val.numel() / 2**20:.2f} MiB val ({self.files_val} files) "
            f"of {self.root}, sha256 {self.sha256[:12]}"
        )


def stdlib_files(root: Path | str | None = None) -> list[str]:
    """Relative paths (POSIX form, sorted) of the standard library's ``*.py`` files."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        base = Path(dirpath).relative_to(root)
        rels.extend((base / f).as_posix() for f in filenames if f.endswith(".py"))
    return sorted(rels)


def build_corpus(max_bytes: int, val_fraction: float = 0.1, seed: int = 0, root: Path | str | None = None) -> Corpus:
    """The stdlib corpus: up to ``max_bytes`` bytes, ``val_fraction`` of them for validation.

    Files are concatenated whole (the last one of each split is cut at the budget), each
    followed by a blank line.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    if not files:
        raise RuntimeError(f"polynorm.lm.data.build_corpus: expected *.py files under {root}, found none")
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    budgets = {"val": int(max_bytes * val_fraction), "train": max_bytes - int(max_bytes * val_fraction)}
    chunks: dict[str, list[bytes]] = {"val": [], "train": []}
    counts = {"val": 0, "train": 0}
    split, left = "val", budgets["val"]
    for i in order:
        if left <= 0:
            if split == "train":
                break
            split, left = "train", budgets["train"]
        data = (root / files[i]).read_bytes()[:left] + b"\n\n"
        chunks[split].append(data)
        counts[split] += 1
        left -= len(data)
    val, train = b"".join(chunks["val"]), b"".join(chunks["train"])
    return Corpus(
        train=torch.frombuffer(bytearray(train), dtype=torch.uint8),
        val=torch.frombuffer(bytearray(val), dtype=torch.uint8),
        root=str(root),
        files_train=counts["train"],
        files_val=counts["val"],
        sha256=hashlib.sha256(val + train).hexdigest(),
    )


def batch_starts(n_tokens: int, seq_len: int, batch_size: int, steps: int, seed: int) -> Tensor:
    """``(steps, batch_size)`` int64 window starts, drawn once from a fixed-seed generator."""
    if n_tokens < seq_len + 2:
        raise ValueError(f"polynorm.lm.data.batch_starts: expected at least {seq_len + 2} tokens, got {n_tokens}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len, (steps, batch_size), generator=gen)


def get_batch(data: Tensor, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-byte targets, both ``(B, T)`` int64 on ``data``'s device."""
    idx = starts.to(data.device)[:, None] + torch.arange(seq_len + 1, device=data.device)
    window = data[idx].long()  # (B, T + 1)
    return window[:, :-1], window[:, 1:]
