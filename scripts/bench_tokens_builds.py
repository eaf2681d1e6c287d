"""The heuristic against o200k on JavaScript and CSS builds, minified and not.

A coding agent's tool output can hold a bundle it read. Sixteen widely used npm packages
(their published builds, fetched once into ``--cache`` with ``npm pack``) give three
groups: minified scripts (``*.min.js``), minified stylesheets (``*.min.css``) and the
unminified builds beside them (``dist/*.js``). Each file's first 60,000 characters are
counted (files under 2,000 characters are left out). Prints, per group, the median, 10th
percentile and worst error of the estimate (no margin), how many files are under by more
than 10%, and how many stay under after the default margin. Compare two revisions by
running this script from each checkout (it uses only ``estimate_tokens``).

    .venv/bin/python scripts/bench_tokens_builds.py [--data ../shared/data]
        [--cache ~/.cache/context-compaction/builds]
"""

from __future__ import annotations

import statistics
import tarfile
from pathlib import Path

import _timing  # noqa: F401  (puts this checkout first on sys.path)
from bench_tokens_languages import _run, open_truth, real_text_parser

from shared.core.tokens import estimate_tokens
from shared.core.tokens_profiles import DEFAULT_SAFETY_MARGIN

PACKAGES = ("jquery@3.7.1", "lodash@4.17.21", "d3@7.9.0", "three@0.160.0", "vue@3.4.21",
            "bootstrap@5.3.3", "moment@2.30.1", "chart.js@4.4.2", "react-dom@18.2.0",
            "axios@1.6.8", "highlight.js@11.9.0", "katex@0.16.9", "echarts@5.5.0",
            "leaflet@1.9.4", "mathjs@12.4.1", "rxjs@7.8.1")
HEAD, SMALLEST = 60_000, 2_000


def unpacked(cache: Path) -> Path:
    """The packages' files under ``cache/x``, each package in a folder of its own."""
    tree = cache / "x"
    for spec in PACKAGES:
        name = spec.rsplit("@", 1)[0].replace("/", "-")
        if not any(cache.glob(f"{name}-*.tgz")):
            _run(["npm", "pack", "-q", spec], cache)
        for tgz in cache.glob(f"{name}-*.tgz"):
            target = tree / tgz.stem
            if not target.exists():
                with tarfile.open(tgz) as archive:
                    archive.extractall(target, filter="data")
    return tree


def groups(tree: Path) -> dict[str, list[Path]]:
    return {
        "minified scripts": sorted(tree.rglob("*.min.js")),
        "minified stylesheets": sorted(tree.rglob("*.min.css")),
        "unminified builds": sorted(p for p in tree.rglob("dist/*.js")
                                    if not p.name.endswith(".min.js")),
    }


def main() -> None:
    args = real_text_parser(__doc__ or "", "builds").parse_args()
    truth = open_truth(args)
    tree = unpacked(args.cache)
    print("| files | n | median | p10 | worst | under by > 10% | under after the margin | "
          "worst file |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    margin = 1 / (1 + DEFAULT_SAFETY_MARGIN) - 1
    for name, files in groups(tree).items():
        rows = []
        for path in files[:80]:
            text = path.read_text(encoding="utf-8", errors="replace")[:HEAD]
            if len(text) >= SMALLEST:
                rows.append((estimate_tokens(text, safety_margin=0) / truth.text(text) - 1,
                             path.name))
        if not rows:
            print(f"| {name} | 0 | | | | | | (npm pack failed: see above) |")
            continue
        rows.sort()
        errors = [e for e, _ in rows]
        print(f"| {name} | {len(rows)} | {statistics.median(errors):+.1%} | "
              f"{errors[len(errors) // 10]:+.1%} | {errors[0]:+.1%} | "
              f"{sum(e < -0.10 for e in errors)} | {sum(e < margin for e in errors)} | "
              f"{rows[0][1]} |")


if __name__ == "__main__":
    main()
