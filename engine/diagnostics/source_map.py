"""Mapping between server paths of uploaded code and the names the user uploaded.

Every location the user sees names their file as uploaded (`model.py:12`), never a
server path, and points into their code rather than into torch.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from schemas import LibraryLocation, SourceLocation

_FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@functools.lru_cache(maxsize=4096)
def _relative(filename: str, root: Path) -> str | None:
    # Graphs name the same few files in every node's stack: resolve each once.
    try:
        return Path(filename).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return None


@functools.lru_cache(maxsize=4096)
def _import_path(filename: str) -> str:
    # A library file by the path it is imported under (`transformers/models/…`): the longest
    # sys.path entry holding it is cut off, so no server path is shown; else its name alone.
    path = Path(os.path.abspath(filename))
    best: Path | None = None
    for entry in sys.path:
        root = Path(os.path.abspath(entry)) if entry else None
        if root is None or not path.is_relative_to(root):
            continue
        if best is None or len(root.parts) > len(best.parts):
            best = root
    return path.relative_to(best).as_posix() if best is not None else path.name


def _is_torch(filename: str) -> bool:
    return _import_path(filename).split("/", 1)[0] == "torch"


@dataclass(frozen=True)
class SourceMap:
    """Knows where the upload was unpacked (`root`) and renders paths relative to it."""

    root: Path

    def relative(self, filename: str) -> str | None:
        """The uploaded name of `filename`, or None when it is not user code."""
        return _relative(filename, self.root)

    def location(self, filename: str, line: int) -> SourceLocation | None:
        """A location in user code, with its source line, or None outside user code."""
        rel = self.relative(filename)
        if rel is None:
            return None
        code = linecache.getline(str(Path(filename).resolve()), line).strip() or None
        return SourceLocation(file=rel, line=line, code=code)

    def from_traceback(self, tb: TracebackType | None) -> SourceLocation | None:
        """The innermost frame of `tb` that is in user code."""
        found = None
        for frame in traceback.extract_tb(tb):
            if frame.lineno is not None:
                loc = self.location(frame.filename, frame.lineno)
                if loc is not None:
                    found = loc
        return found

    def from_exception(self, exc: BaseException) -> SourceLocation | None:
        """The innermost user frame of `exc`, following its cause/context chain."""
        seen: set[int] = set()
        current: BaseException | None = exc
        best = None
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            best = best or self.from_traceback(current.__traceback__)
            current = current.__cause__ or current.__context__
        return best

    def from_text(self, text: str) -> SourceLocation | None:
        """The innermost user frame named in a printed stack (`File "...", line N`)."""
        found = None
        for match in _FRAME_LINE.finditer(text):
            loc = self.location(match["file"], int(match["line"]))
            if loc is not None:
                found = loc
        return found

    def library_frame(self, text: str) -> LibraryLocation | None:
        """The deepest frame of a printed stack outside the upload and outside torch (the
        deepest of torch's when there is no other), by its path under its import root."""
        found = deepest = None
        for match in _FRAME_LINE.finditer(text):
            filename = match["file"]
            if self.relative(filename) is not None:
                continue
            deepest = (filename, int(match["line"]))
            if not _is_torch(filename):
                found = deepest
        chosen = found or deepest
        if chosen is None:
            return None
        filename, line = chosen
        code = linecache.getline(filename, line).strip() or None
        return LibraryLocation(file=_import_path(filename), line=line, code=code)

    def scrub(self, text: str) -> str:
        """Replace server paths of the upload in `text` by the uploaded names."""
        root = str(self.root.resolve())
        return text.replace(root + "/", "").replace(root, ".")
