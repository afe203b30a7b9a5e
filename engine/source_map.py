"""Mapping between server paths of uploaded code and the names the user uploaded.

Every location the user sees names their file as uploaded (`model.py:12`), never a
server path, and points into their code rather than into torch.
"""

from __future__ import annotations

import functools
import linecache
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from schemas import SourceLocation

_FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@functools.lru_cache(maxsize=4096)
def _relative(filename: str, root: Path) -> str | None:
    # Graphs name the same few files in every node's stack: resolve each once.
    try:
        return Path(filename).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return None


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

    def scrub(self, text: str) -> str:
        """Replace server paths of the upload in `text` by the uploaded names."""
        root = str(self.root.resolve())
        return text.replace(root + "/", "").replace(root, ".")
