"""The docs are references and the CHANGELOG is grouped.

A doc under docs/ says how things are now, with the command behind each figure; the
history of re-measurements lives in git, not in the docs. Every entry of every release in
CHANGELOG.md sits under one of Keep a Changelog's groups, as a bullet.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Keep a Changelog's groups (https://keepachangelog.com/).
GROUPS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}

# What a measurement diary says and a reference does not.
DIARY = re.compile(
    r"\b[Ss]ession \d|\b(this|next|third|fourth|fifth) session\b|[Rr]e-measured|"
    r"[Mm]easured again|[Tt]ried and dropped|\bsitting\b|\bearlier run\b|first run found"
)


def releases(text: str) -> list[tuple[str, str]]:
    """The CHANGELOG's `## ` sections: (heading, body) in order."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_every_changelog_entry_is_a_bullet_in_a_group() -> None:
    sections = releases((ROOT / "CHANGELOG.md").read_text())
    assert sections and sections[0][0] == "Unreleased"
    offenders = []
    for heading, body in sections:
        group = None
        for number, line in enumerate(body.splitlines(), 1):
            if line.startswith("### "):
                group = line[4:].strip()
                if group not in GROUPS:
                    offenders.append(f"{heading}:{number}: group {group!r}")
            elif line.startswith("- "):
                if group is None:
                    offenders.append(f"{heading}:{number}: entry outside a group")
                if line.startswith("- **Changed"):
                    offenders.append(f"{heading}:{number}: a **Changed** marker, not a group")
            elif line.strip() and not line.startswith("  "):
                offenders.append(f"{heading}:{number}: text that is no bullet")
    assert offenders == []


def test_every_release_has_at_least_one_group() -> None:
    sections = releases((ROOT / "CHANGELOG.md").read_text())
    assert [h for h, body in sections if not re.search(r"^### ", body, re.MULTILINE)] == []


def test_no_doc_is_a_measurement_diary() -> None:
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert len(docs) > 5
    offenders = [
        f"{path.name}:{number}: {line.strip()[:100]}"
        for path in docs
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DIARY.search(line)
    ]
    assert offenders == []
