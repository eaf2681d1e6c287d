"""The heuristic against o200k on real HTML, the tool output of browsing agents.

Held-out pages: Python 3.11's HTML documentation and the Debian Reference (Debian
packages ``python3.11-doc`` and ``debian-reference-en``, fetched once into ``--cache``
with ``apt-get download``; the markup terms were fitted on other HTML and XML). Prints
the median, 10th percentile and worst error of the estimate (no safety margin) and how
many pages are under by more than 5%. Compare two revisions by running this script from
each checkout (it uses only ``estimate_tokens``).

    .venv/bin/python scripts/bench_tokens_markup.py [--data ../shared/data] [--pages 150]
        [--cache ~/.cache/context-compaction/markup]
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import _timing  # noqa: F401  (puts this checkout first on sys.path)
from bench_tokens_languages import _run, open_truth, real_text_parser

from shared.core.tokens import estimate_tokens

PACKAGES = ("python3.11-doc", "debian-reference-en")


def pages(cache: Path, count: int) -> list[str]:
    for package in PACKAGES:
        if not any(cache.glob(f"{package}_*.deb")):
            _run(["apt-get", "download", package], cache)
        deb = next(cache.glob(f"{package}_*.deb"), None)
        tree = cache / package
        if deb is not None and not tree.exists():
            _run(["dpkg-deb", "-x", str(deb), str(tree)], cache)
    files = sorted(p for p in cache.rglob("*.htm*") if p.is_file() and p.stat().st_size > 1500)
    random.Random(3).shuffle(files)
    return [p.read_text(encoding="utf-8", errors="replace")[:50_000] for p in files[:count]]


def main() -> None:
    parser = real_text_parser(__doc__ or "", "markup")
    parser.add_argument("--pages", type=int, default=150)
    args = parser.parse_args()
    truth = open_truth(args)
    texts = pages(args.cache, args.pages)
    if not texts:
        raise SystemExit("no HTML pages: apt-get download failed (see above)")
    errors = sorted(estimate_tokens(t, safety_margin=0) / truth.text(t) - 1 for t in texts)
    print(f"{len(errors)} HTML pages: median {statistics.median(errors):+.1%}, "
          f"p10 {errors[len(errors) // 10]:+.1%}, worst {errors[0]:+.1%}; "
          f"under by more than 5%: {sum(e < -0.05 for e in errors)}")


if __name__ == "__main__":
    main()
