"""A small language-modelling corpus built on the machine, so ``rfwp-rl seq --task lm`` runs
out of the box without downloading anything.

The text is the docstrings of the Python standard library that runs this package (read from
the ``.py`` files with :mod:`ast`, nothing is imported or executed), tokenised like
WikiText (words and punctuation separated by spaces, one paragraph per line) and split by
document into train / valid / test (every 20th docstring to valid, the one after it to
test). With Python 3.11 that is about 1.1 MB of text, about 230k words. It is written once
to the project's cache root (``$RFWP_CACHE/corpus/stdlib-docs-py3.X``, default under
``~/.cache/rfwp_rl``) as ``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens``
(the WikiText-103 file names, so both corpora load the same way) plus ``MANIFEST.json``;
the same Python version gives the same files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import sysconfig
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_text

SPLITS = ("train", "valid", "test")
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "venv",
}
_TOKEN = re.compile(r"\w+|[^\w\s]")
MIN_DOC_CHARS = 200


def default_cache_dir() -> Path:
    """The project's cache root (``$RFWP_CACHE``, default ``~/.cache/rfwp_rl``), ``corpus/``."""
    root = os.environ.get("RFWP_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "rfwp_rl") / "corpus"


def stdlib_docstrings(stdlib: str | os.PathLike | None = None) -> list[str]:
    """Docstrings (modules, classes, functions) of at least ``MIN_DOC_CHARS`` characters,
    in a fixed order (sorted file paths, then source order)."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_DOC_CHARS:
                    docs.append(doc)
    return docs


def tokenise_document(doc: str) -> list[str]:
    """Paragraphs of ``doc`` as lines of space-separated tokens (WikiText style)."""
    lines = []
    for para in re.split(r"\n\s*\n", doc):
        tokens = _TOKEN.findall(para)
        if tokens:
            lines.append(" ".join(tokens))
    return lines


def build_stdlib_corpus(out_dir: str | os.PathLike, stdlib: str | os.PathLike | None = None) -> Path:
    """Write the corpus to ``out_dir`` (if not there yet) and return ``out_dir``."""
    out = Path(out_dir)
    if (out / "MANIFEST.json").is_file():
        return out
    docs = stdlib_docstrings(stdlib)
    split_lines: dict[str, list[str]] = {s: [] for s in SPLITS}
    for i, doc in enumerate(docs):
        split = "valid" if i % 20 == 0 else "test" if i % 20 == 1 else "train"
        split_lines[split] += tokenise_document(doc)
    manifest = {
        "source": "docstrings of the Python standard library",
        "python": sys.version.split()[0],
        "documents": len(docs),
    }
    for split in SPLITS:
        text = "\n".join(split_lines[split]) + "\n"
        atomic_write_text(out / f"wiki.{split}.tokens", text)
        manifest[split] = {
            "lines": len(split_lines[split]),
            "words": len(text.split()),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    atomic_write_text(out / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    return out


def builtin_corpus_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The built-in corpus directory (built on first use)."""
    version = "py" + ".".join(map(str, sys.version_info[:2]))
    return build_stdlib_corpus(Path(cache_dir or default_cache_dir()) / f"stdlib-docs-{version}")
