"""The user documentation names only what exists: settings, files, keys, images' contents.

A reader copies names out of the docs (a ``COMPACTION_*`` variable into a deployment, a
path to open, a key pattern to delete); a renamed setting or a moved module leaves the
docs pointing at nothing, and a misspelt variable is only warned about at start-up.
Benchmark pages (BENCHMARKS.md, docs/benchmarks/) are history and not checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from shared.store.commands import ids_key
from shared.store.keys import SessionKeys
from tests.test_deploy import _lock_tool
from workers.server.config import ServerConfig, server_variables
from workers.settings import NOT_SETTINGS, Settings, known_variables

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / name for name in (
    "README.md", "Procfile", "docs/ARCHITECTURE.md", "docs/server.md",
    "docs/observability.md", "docs/upgrading.md", "docs/CONTRIBUTING.md", "docs/guard.md",
    "docs/sentinel.md",
    "docker/README.md", "docker/docker-compose.yml", "docker/docker-compose.metrics.yml",
    "docker/Dockerfile", "examples/README.md")] + sorted((ROOT / "examples").glob("*.py"))
# `COMPACTION_X` or `COMPACTION_X` / `_Y` / `_Z` (a row of the README's settings table)
VARIABLE = re.compile(r"(COMPACTION_[A-Z0-9_]*[A-Z0-9])((?:`? / `?_[A-Z0-9_]*[A-Z0-9])*)")
PATH = re.compile(r"(?<![\w/.{-])((?:shared|workers|tests|scripts|docs|docker|examples)"
                  r"/[\w./*-]*[\w*])(?![\w<]|:\d)(?:::(\w+))?")


def _names(text: str, known: frozenset[str]) -> list[str]:
    """Every variable the text names; a ``/ _SUFFIX`` replaces a tail of the name before it
    (``COMPACTION_TASK_SOFT_TIME_LIMIT / _TIME_LIMIT``: ``COMPACTION_TASK_TIME_LIMIT``)."""
    out = []
    for match in VARIABLE.finditer(text):
        full = match.group(1)
        out.append(full)
        parts = full.split("_")
        for suffix in re.findall(r"_[A-Z0-9_]*[A-Z0-9]", match.group(2)):
            heads = ["_".join(parts[:k]) + suffix for k in range(1, len(parts))]
            out.append(next((h for h in heads if h in known), heads[-1]))
    return out


def test_every_compaction_variable_the_docs_name_is_read() -> None:
    known = known_variables() | server_variables() | NOT_SETTINGS
    unknown = {f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS
               for name in _names(doc.read_text(), known) if name not in known}
    assert not unknown, sorted(unknown)


def _undocumented(texts: list[str], variables: frozenset[str]) -> list[str]:
    """Variables no text names; a ``_FILE`` form counts as named where the README's
    secrets sentence names its variable with the ``<NAME>_FILE`` rule."""
    named = {n for text in texts for n in _names(text, variables)}
    secrets = re.search(r"^Secrets from files: (.*?)\n\n", texts[0], re.S | re.M)
    with_files = set(_names(secrets.group(1), variables)) \
        if secrets and "`<NAME>_FILE=" in secrets.group(1) else set()
    return sorted(v for v in variables if v not in named
                  and v.removesuffix("_FILE") not in with_files)


def test_every_setting_the_code_reads_is_documented() -> None:
    """The other direction: a setting added to the code is named in some user doc (the
    README's table, docs/server.md for ``compaction serve``'s), or a user never finds it."""
    texts = [doc.read_text() for doc in DOCS]
    assert DOCS[0].name == "README.md"
    assert _undocumented(texts, known_variables() | server_variables()) == []
    # the check can fail: a setting no text names is found, a secret's _FILE form is not
    assert _undocumented(["Secrets from files: `COMPACTION_REDIS_URL` may be given as "
                          "`<NAME>_FILE=/run/secrets/...`.\n\n"],
                         frozenset({"COMPACTION_REDIS_URL", "COMPACTION_REDIS_URL_FILE",
                                    "COMPACTION_QUEUE"})) == ["COMPACTION_QUEUE"]


def test_a_misspelt_variable_in_a_doc_is_caught() -> None:
    """The check above can fail: a typo and a suffix naming no setting are both found."""
    known = known_variables()
    text = "`COMPACTION_TRIGER_RATIO`; `COMPACTION_MAX_RETRIES` / `_RETRY_BACKOFF_MAXIMUM`"
    assert [n for n in _names(text, known) if n not in known] == [
        "COMPACTION_TRIGER_RATIO", "COMPACTION_MAX_RETRY_BACKOFF_MAXIMUM"]


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for match in PATH.finditer(doc.read_text()):
            path, test = match.group(1), match.group(2)
            found = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
            if not all(p.exists() for p in found) or not found:
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
            elif test and f"def {test}(" not in (ROOT / path).read_text():
                missing.append(f"{doc.relative_to(ROOT)}: {path}::{test}")
    assert not missing, missing


def test_the_architecture_names_every_key_of_a_session() -> None:
    """docs/ARCHITECTURE.md's key list is what an operator deletes or inspects by hand."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.search(r"`\{prefix\}:\{tenant:session\}:([\w|]+)`", text)
    assert listed, "ARCHITECTURE.md lists no session keys"
    keys = SessionKeys.for_session("cmp", "t", "s")
    actual = {key.rsplit(":", 1)[1] for key in [*keys.all_keys(), ids_key(keys)]}
    assert set(listed.group(1).split("|")) == actual
    assert "`{prefix}:rx:{tenant:session}:*`" in text  # the recall index


def test_the_docker_readme_describes_the_image_and_the_services() -> None:
    readme = (ROOT / "docker" / "README.md").read_text()
    extras = ",".join(_lock_tool().DEFAULT_EXTRAS)
    assert f"`[{extras}]`" in readme  # what requirements.lock pins
    compose = yaml.safe_load((ROOT / "docker" / "docker-compose.yml").read_text())
    row = next(line for line in readme.splitlines() if line.startswith("| `docker-compose.yml`"))
    named = {"redis": "Redis", "worker": "worker", "flower": "Flower", "server": "`server`"}
    assert set(compose["services"]) == set(named)
    assert all(word in row for word in named.values()), row


# a row of the README's settings table: `COMPACTION_X` [/ `_Y` ...] | default [/ default ...] |
ROW = re.compile(r"^\| `(COMPACTION_[A-Z0-9_]+)`((?: / `_[A-Z0-9_]+`)*) \| ([^|]*) \|", re.M)
# defaults the table states in words: what the code computes for them
IN_WORDS = {"provider's cheap model": None, "from the model's name": None,
            "half the pending TTL (300 s with the defaults)": None,
            "twice `_REDIS_SOCKET_TIMEOUT` (1 s)": None}


def _documented_defaults(text: str, known: frozenset[str]) -> dict[str, str]:
    """``{variable: default cell}`` of the settings table (``a / b`` cells split per name)."""
    out = {}
    for match in ROW.finditer(text):
        names = _names(f"`{match.group(1)}`{match.group(2)}", known)
        cell = match.group(3).strip()
        cells = cell.split(" / ") if len(names) > 1 else [cell]
        assert len(cells) == len(names), match.group(0)
        out.update(zip(names, (c.strip().strip("`") for c in cells), strict=True))
    return out


def _shown(value: object) -> str:
    """A default as the table writes it: none, true/false, numbers as given."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _matches(cell: str, value: object) -> bool:
    if cell in IN_WORDS or cell.startswith("lease + "):  # computed: see the next test
        return value is None
    try:
        return float(cell) == float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return cell == _shown(value)


def _drift(text: str) -> list[str]:
    defaults = {f"COMPACTION_{n.upper()}": f.default for n, f in Settings.model_fields.items()}
    defaults |= {f"COMPACTION_SERVER_{n.upper()}": f.default
                 for n, f in ServerConfig.model_fields.items()}
    documented = _documented_defaults(text, frozenset(defaults))
    return [f"{name}: README {cell!r}, code {defaults.get(name, 'no such setting')!r}"
            for name, cell in documented.items()
            if name not in defaults or not _matches(cell, defaults[name])]


def test_the_readme_settings_table_states_the_code_defaults() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(_documented_defaults(text, known_variables() | server_variables())) > 40
    assert _drift(text) == []
    # the defaults stated as a computation: the figure given is the one computed
    settings = Settings()
    assert f"({settings.visibility_timeout} s with the defaults)" in text
    stale = settings.store_config().pending_stale_after
    assert f"| half the pending TTL ({stale} s with the defaults) |" in text
    cheap = [settings.model_copy(update={"summarizer": p}).summarizer_model_name
             for p in ("openai", "gemini")]
    assert f"| provider's cheap model | `{cheap[0]}` / `{cheap[1]}` |" in text


def test_a_wrong_default_in_the_table_is_caught() -> None:
    """The check above can fail: a changed number, word or suffix default is found."""
    text = ("| `COMPACTION_TRIGGER_RATIO` | 0.75 | x |\n"
            "| `COMPACTION_LOG_FORMAT` | `json` | x |\n"
            "| `COMPACTION_MAX_RETRIES` / `_RETRY_BACKOFF_MAX` | 3 / 60 | x |\n"
            "| `COMPACTION_PROACTIVE` | true | x |\n")
    assert [line.split(":")[0] for line in _drift(text)] == [
        "COMPACTION_TRIGGER_RATIO", "COMPACTION_LOG_FORMAT", "COMPACTION_RETRY_BACKOFF_MAX"]


def test_every_knob_of_the_compose_files_is_documented() -> None:
    """A ``${VAR:-default}`` in a compose file is a setting of the deployment: the operator
    finds it in docker/README.md or, for the metrics overlay, docs/observability.md."""
    docs = (ROOT / "docker" / "README.md").read_text() + \
        (ROOT / "docs" / "observability.md").read_text() + (ROOT / "README.md").read_text()
    knobs = {name for compose in ("docker-compose.yml", "docker-compose.metrics.yml")
             for name in re.findall(r"\$\{([A-Z][A-Z0-9_]*)", (ROOT / "docker" / compose)
                                    .read_text())}
    assert "PROMETHEUS_PORT" in knobs and "WORKER_CPUS" in knobs
    assert sorted(k for k in knobs if not re.search(rf"`{k}[`=]", docs)) == []


def _cli_options() -> dict[str, set[str]]:
    """``{command: its option strings}`` of the real parser (every command loaded)."""
    import argparse

    from workers.cli.main import build_parser

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return {name: {o for action in parser._actions for o in action.option_strings}
            for name, parser in sub.choices.items()}


def _cli_drift(text: str, options: dict[str, set[str]]) -> list[str]:
    """Commands and options README's CLI table and its ``--json`` sentence name that the
    parser lacks, and commands it has that the table leaves out."""
    rows = re.findall(r"^\| `compaction (\w+)((?:[^|\\]|\\\|)*)` \|", text, re.M)
    named: dict[str, set[str]] = {}
    for command, rest in rows:
        named.setdefault(command, set()).update(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rest))
        for other in re.findall(r"` / `(\w+)", rest):  # `history ...` / `rewind ...`
            named.setdefault(other, set())
    sentence = re.search(r"^((?:`\w+`, )+`\w+` and `\w+`) take\s+`--json`", text, re.M)
    for command in re.findall(r"`(\w+)`", sentence.group(1) if sentence else ""):
        named.setdefault(command, set()).add("--json")
    wrong = [f"{c} {o}" for c, opts in named.items() for o in sorted(opts)
             if o not in options.get(c, set())]
    wrong += [f"{c}: not in the parser" for c in named if c not in options]
    return wrong + [f"{c}: not in README's table" for c in options if c not in named]


def test_the_readme_cli_table_names_real_commands_and_options() -> None:
    options = _cli_options()
    assert _cli_drift((ROOT / "README.md").read_text(), options) == []
    # the check can fail: an option no command has, a command missing from the table
    text = "| `compaction stats SESSION [--watch]` | x |\n`show` and `stats` take `--json`"
    assert {"stats --watch", "demo: not in README's table"} <= set(_cli_drift(text, options))


def test_the_runbooks_key_patterns_match_the_keys_they_are_for() -> None:
    """An operator deletes what ``redis-cli --scan --pattern`` finds: each documented
    pattern matches the keys its text names, and no session's log or state."""
    from fnmatch import fnmatchcase

    import fakeredis

    from shared.store.recall_index import recall_keys
    from shared.store.sessions import SessionStore

    store = SessionStore(fakeredis.FakeRedis())
    keys = store.keys("s1")
    rx = recall_keys(store, "s1")
    meant = {"cmp:{*}:pending": {keys.pending}, "cmp:rx:{*}:queued": {rx.queued},
             "cmp:rx:{*}*": {rx.meta, rx.queued, rx.term_prefix + "word"},
             "cmp:{*}:req*": {keys.requests, keys.request_order}}
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "upgrading.md").read_text()
    documented = set(re.findall(r"--pattern '([^']+)'", text)) | \
        set(re.findall(r"`'(cmp:[^']+)'`", text))
    assert documented == set(meant), documented
    never = {keys.log, keys.state}
    for pattern, targets in meant.items():
        assert all(fnmatchcase(k, pattern) for k in targets), (pattern, targets)
        assert not any(fnmatchcase(k, pattern) for k in never), pattern


def _blocks(text: str) -> list[str]:
    """The paragraphs, list items and table rows of a Markdown text (code blocks left out),
    each joined into one line; the short ones (a heading's lead-in, ``...``) are skipped."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        starts = not line.strip() or line.startswith(("|", "#")) or \
            re.match(r"\s*(?:[-*]|\d+\.) ", line) is not None
        if not starts:
            current.append(line.strip())
            continue
        if current:
            out.append(" ".join(current))
        current = [line.strip()] if line.strip() and not line.startswith(("|", "#")) else []
        if line.startswith("|"):
            out.append(line)
    if current:
        out.append(" ".join(current))
    return [block for block in out if len(block) >= 60]


def _repeated(text: str) -> list[str]:
    seen: set[str] = set()
    repeated = []
    for block in _blocks(text):
        if block in seen:
            repeated.append(block[:80])
        seen.add(block)
    return repeated


def test_no_doc_says_the_same_paragraph_twice() -> None:
    """A paragraph or bullet pasted twice (an edit applied twice) reads as a mistake and is
    one more copy to keep true."""
    assert {str(d.relative_to(ROOT)): r for d in DOCS if d.suffix == ".md"
            for r in [_repeated(d.read_text())] if r} == {}
    # the check can fail: a bullet given twice in one list is found
    bullet = "- Windows learned from overflow errors are kept per model name, the newest 1,024.\n"
    assert _repeated("## Memory\n\n- one\n" + bullet + bullet + "\nText.\n") == [bullet[:80]]


# the directories whose modules CONTRIBUTING.md's map lists one by one (the others, such as
# workers/cli/ or shared/telemetry/, it describes as a whole)
MAPPED = ("shared/core", "shared/store", "shared/guard", "workers")


def _unmapped(tree: str) -> list[str]:
    """Modules of the :data:`MAPPED` directories the map's text does not name."""
    return [f"{directory}/{module.name}" for directory in MAPPED
            for module in sorted((ROOT / directory).glob("*.py"))
            if module.name != "__init__.py"
            and not re.search(rf"(?<![\w.]){re.escape(module.name)}\b", tree)
            and not any(module.name.startswith(g.removesuffix("*.py")) for g in
                        re.findall(r"\b\w+\*\.py", tree))]


def test_the_module_map_names_every_module() -> None:
    """docs/CONTRIBUTING.md calls its tree the full module map: a module added to a
    directory it lists file by file is named there too."""
    text = (ROOT / "docs" / "CONTRIBUTING.md").read_text()
    tree = text.split("```", 2)[1]
    assert _unmapped(tree) == []
    # the check can fail: a map without the sweep is found out
    assert _unmapped(tree.replace("sweep.py", "")) == ["workers/sweep.py"]



def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (code blocks left out)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, re.M)}


def _broken_links(doc: Path, text: str | None = None) -> list[str]:
    """The relative links of ``doc`` (or of ``text`` read as if it were ``doc``) to a file
    that does not exist, or to a heading that file does not have."""
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text() if text is None else text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = doc.parent / path if path else doc
        if not target.exists() or (anchor and target.suffix == ".md"
                                   and anchor not in _anchors(target)):
            broken.append(f"{doc.relative_to(ROOT)}: {link}")
    return broken


def test_every_relative_link_of_the_docs_leads_somewhere() -> None:
    """A Markdown link is relative to its own file: a path written from the repository's
    root inside docs/ (``docs/benchmarks/guard.md`` in docs/benchmarks/) leads nowhere."""
    docs = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert [b for doc in docs for b in _broken_links(doc)] == []
    # the check can fail: a root-relative path and a heading that is not there are found
    page = ROOT / "docs" / "benchmarks" / "guard.md"
    text = ("[history](docs/benchmarks/guard.md), [memory](../guard.md#memory), "
            "[threads](../guard.md#no-such-heading), [web](https://example.com/x)")
    assert _broken_links(page, text) == ["docs/benchmarks/guard.md: docs/benchmarks/guard.md",
                                         "docs/benchmarks/guard.md: ../guard.md#no-such-heading"]
