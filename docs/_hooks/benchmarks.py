"""mkdocs hook: publish ``benchmarks/README.md`` and its plots as the site's benchmarks page.

The README lives next to the harness that rewrites its tables and ``results/*.png``; serving it
from there (rather than a copy under ``docs/``) keeps one text, and its relative image links
resolve because the files keep their paths (``benchmarks/results/...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Files, config: Any) -> Files:
    sources = [ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "results").glob("*.png"))]
    for source in sources:
        files.append(
            File(
                source.relative_to(ROOT).as_posix(),
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
