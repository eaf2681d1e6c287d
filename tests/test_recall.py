"""The pure recall core: tokenization, passages, ranking, validation, the tool."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import InvalidInput
from shared.core.messages import Message, ToolCall
from shared.core.recall import (
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    NOTICE,
    PASSAGE_CHARS,
    Posting,
    RecallHit,
    analyze,
    best_per_message,
    bm25,
    index_text,
    notice,
    parse_tool_arguments,
    recall_tool,
    render_hits,
    search_text,
    split_passages,
    tokenize,
    validate_query,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("src/app/main.py", ["src/app/main.py", "main.py", "main", "src", "app", "py"]),
    ("ERR_CONN_RESET", ["err_conn_reset", "err", "conn", "reset"]),
    ("0x1f", ["0x1f"]),
    ("3.14", ["3.14", "3", "14"]),
    ("user_id", ["user_id", "user", "id"]),
    ("getUserName()", ["getusername", "get", "user", "name"]),
    ("Errno 104.", ["errno", "104"]),
])
def test_identifiers_paths_numbers_stay_matchable_whole_and_in_parts(
        text: str, expected: list[str]) -> None:
    assert set(tokenize(text)) == set(expected)
    assert tokenize(text)[0] == expected[0]  # the whole comes first


def test_stopwords_and_punctuation_are_not_terms() -> None:
    assert tokenize("the and, of to ... !!") == []
    assert tokenize("The Value") == ["value"]


def test_huge_words_are_indexed_by_parts_only() -> None:
    blob = "a" * 100 + "_tail"
    assert tokenize(blob) == ["tail"]


@pytest.mark.parametrize(("text", "expected"), [
    ("接続がリセットされました", ["接続がリセットされました", "接続", "続が", "がリ",
                                "リセ", "セッ", "ット", "トさ", "され", "れま", "まし", "した"]),
    ("数据库连接失败", ["数据库连接失败", "数据", "据库", "库连", "连接", "接失", "失败"]),
    ("연결이", ["연결이", "연결", "결이"]),
    ("表", ["表"]),
    ("MARKER_3の値", ["marker_3の値", "marker_3", "marker", "3", "の値"]),
    ("config_ファイル.json", ["config_ファイル.json", "config", "ファ", "ァイ", "イル", "json"]),
])
def test_cjk_runs_yield_their_whole_then_character_bigrams(
        text: str, expected: list[str]) -> None:
    """Unspaced scripts: the whole run (what an older index holds) and its bigrams, so a
    word inside a sentence is found; Latin words around it are tokenized as before."""
    assert tokenize(text) == expected
    assert set(tokenize("接続")) <= set(tokenize("エラー: 接続がリセットされました"))
    assert tokenize("café src/app/main.py") == tokenize("café") + tokenize("src/app/main.py")


def test_a_long_question_keeps_its_most_specific_terms() -> None:
    """Over MAX_QUERY_TERMS, identifiers and the longest words are kept (the first 16
    used to be, dropping the identifier a question names last)."""
    q = validate_query("earlier we looked into some failing unit tests, an assertion about "
                       "amounts during checkout went wrong; what was the exact output of "
                       "test_refund_rounding")
    assert len(q.terms) == MAX_QUERY_TERMS and "test_refund_rounding" in q.terms
    assert q.terms.index("test_refund_rounding") > q.terms.index("assertion")  # query order
    words = " ".join(f"word{chr(97 + i)}xyz" for i in range(20))
    kept = validate_query(f"{words} ERR_CONN_RESET 10.01 src/app/main.py").terms
    assert {"err_conn_reset", "10.01", "src/app/main.py"} <= set(kept)
    assert validate_query("alpha beta gamma").terms == ("alpha", "beta", "gamma")


def _idx(role: str, text: str, calls: list[ToolCall] | None = None) -> Message:
    return Message(role=role, content=text, tool_calls=calls or [])  # type: ignore[arg-type]


def test_tool_calls_are_indexed_with_their_arguments() -> None:
    m = _idx("assistant", "running it", [ToolCall(id="c1", name="bash",
                                                   arguments='{"cmd": "pytest -x tests/a.py"}')])
    assert "tests/a.py" in tokenize(index_text(m))
    assert "bash" in index_text(m)


def test_tool_call_arguments_are_tokenized_with_their_json_escapes_decoded() -> None:
    """Audit F8: ``__init__.py\nsed`` (JSON-escaped) was one term and ``nsed`` a part,
    so ``sed`` after an escaped newline was not found as itself. The hit text stays the
    raw ``name arguments``; the message's own text is not decoded (a Windows path)."""
    command = ("sed -n 1p sphinx/ext/autodoc/__init__.py\nsed -i s/x/y/ a.txt\n"
               'cd tmp && cat tmp/directive.log\ncd .. "quoted" C:\\new\\t.txt')
    call = ToolCall(id="c1", name="bash",  # json.dumps escapes non-ASCII too
                    arguments=json.dumps({"command": command, "note": "接続 ok"}))
    assert "\\u63a5" in call.arguments and "\\n" in call.arguments
    m = _idx("assistant", "see C:\\new\\table.txt", [call])
    [passage] = split_passages(0, m)
    assert passage.text == index_text(m) and passage.calls_at == len(m.text()) + 1
    terms = tokenize(search_text(passage))
    assert {"sed", "cd", "sphinx/ext/autodoc/__init__.py", "tmp/directive.log", "quoted",
            "c:\\new\\t.txt", "接続"} <= set(terms)
    assert "c:\\new\\table.txt" in terms  # the content: no JSON, nothing decoded
    assert not [t for t in terms if t.endswith(("\\nsed", "\\ncd", "\\n"))
                or t in ("nsed", "ncd", "u63a5")]
    assert set(analyze(passage).terms) == set(terms)
    # a passage that starts inside the arguments decodes all of its text
    parts = split_passages(0, m, max_chars=40)
    later = [p for p in parts if p.start > len(m.text())]
    assert later and all(p.calls_at == 0 for p in later)
    assert all(p.calls_at is None for p in parts if p.end <= len(m.text()) + 1)
    assert "cd" in {t for p in later for t in tokenize(search_text(p))}


@given(st.text(min_size=0, max_size=20_000), st.integers(min_value=16, max_value=3000),
       st.integers(min_value=0, max_value=10**6))
@settings(max_examples=60, deadline=None)
def test_passages_are_bounded_keep_the_index_and_cover_the_text(
        text: str, limit: int, index: int) -> None:
    message = _idx("user", text)
    passages = split_passages(index, message, max_chars=limit)
    assert all(p.index == index and p.role == "user" for p in passages)
    assert all(0 < len(p.text) <= limit and p.text.strip() for p in passages)
    assert all(p.text == text[p.start:p.end] for p in passages)
    assert [p.start for p in passages] == sorted(p.start for p in passages)
    if len(text) <= limit * 8:  # under the per-message cap: nothing with words is lost
        covered = "".join(text[p.start:p.end] for p in passages)
        assert covered.split() == text.split()


def test_long_messages_split_on_lines() -> None:
    text = "\n".join(f"line {i} ERR_{i}" for i in range(500))
    passages = split_passages(3, _idx("user", text))
    assert len(passages) > 1
    assert all(len(p.text) <= PASSAGE_CHARS for p in passages)
    assert all(p.text.endswith("\n") for p in passages[:-1])


def _rank(messages: list[str], query: str, limit: int = 5) -> list[int]:
    """The pure ranking over an in-memory index (what the store does, minus Redis)."""
    postings: dict[str, list[Posting]] = {}
    df: dict[str, int] = {}
    total = pid = 0
    for i, text in enumerate(messages):
        for passage in split_passages(i, _idx("user", text)):
            a = analyze(passage)
            total += a.length
            for term, tf in a.terms.items():
                postings.setdefault(term, []).append((pid, i, tf, a.length))
                df[term] = df.get(term, 0) + 1
            pid += 1
    q = validate_query(query)
    n = max(pid, 1)
    scores = bm25({t: postings[t] for t in q.terms if t in postings}, df, n_docs=n,
                  avg_length=total / n, required=q.required)
    return [index for _, _, index in best_per_message(scores)][:limit]


def test_one_character_terms_make_no_hit_alone() -> None:
    """Audit F7: an identifier absent from the session came back as ``ok 9``, matched on
    the one-digit parts of ``cust_7Hq2LmP9``. One character scores but is no hit alone
    when the query names something longer; a query of just a number works as before."""
    texts = ["ok 7", "ok 9", "step 9 of the plan", "opened ABC-12 for the login bug",
             "listening on 8080", "fixed #42 in the parser", "deploy id_9 done"]
    for absent in ("cust_7Hq2LmP9", "ticket 9", "ZZZ-9", "v7.9", "ticket 9 x"):
        assert _rank(texts, absent) == [], absent
    assert _rank(texts, "ABC-9") == [3]  # its meaningful part, ABC, still matches
    assert set(_rank(texts, "9")) == {1, 2, 6}  # a number alone: whole and in parts
    assert set(_rank(texts, "#9")) == {1, 2, 6}
    assert _rank(texts, "port 8080") == [4]
    assert _rank(texts, "issue 42") == [5]
    assert _rank(texts, "step 9")[0] == 2  # the one character still ranks
    assert validate_query("cust_7Hq2LmP9").required == ("cust_7hq2lmp9", "cust", "hq2", "lm")
    assert validate_query("port 8080").required == ()  # nothing weak: no filter


def test_a_long_question_drops_one_character_terms_first() -> None:
    words = " ".join(f"word{chr(97 + i)}xyz" for i in range(15))
    kept = validate_query(f"{words} 7 ERR_CONN_RESET").terms
    assert "7" not in kept and "err_conn_reset" in kept and "wordoxyz" in kept


_FILLER = st.lists(st.sampled_from(
    ["error", "value", "config", "session", "src/app/util.py", "ERR_TIMEOUT", "42", "3.5",
     "user_id", "run", "tests", "fixed", "the", "deploy", "\n", "retry", "main.py"]),
    min_size=1, max_size=60).map(" ".join)


@given(st.lists(_FILLER, min_size=2, max_size=40), st.data(),
       st.sampled_from(["src/{x}/handler.py", "ERR_{X}_RESET", "0x{x}", "{x}_id",
                        "job-{x}", "v9.{n}.1", "{n}.{n}"]))
@settings(max_examples=80, deadline=None)
def test_a_messages_distinctive_token_finds_it_in_the_top_results(
        texts: list[str], data: st.DataObject, shape: str) -> None:
    target = data.draw(st.integers(min_value=0, max_value=len(texts) - 1))
    tag = data.draw(st.text(alphabet="abcdef", min_size=6, max_size=8))
    number = str(data.draw(st.integers(min_value=10**6, max_value=10**9)))
    token = shape.format(x=tag, X=tag.upper(), n=number)
    texts = list(texts)
    texts[target] = f"{texts[target]} {token} {texts[target]}"
    assert target in _rank(texts, token, limit=3)


def test_exact_identifier_beats_a_message_sharing_only_its_parts() -> None:
    texts = ["user id of the conn was reset", "got ERR_CONN_RESET from upstream", "user said hi"]
    assert _rank(texts, "ERR_CONN_RESET")[0] == 1


def test_range_filters_postings() -> None:
    postings: dict[str, list[Posting]] = {"x": [(0, 1, 1, 5), (1, 7, 1, 5), (2, 9, 1, 5)]}
    scores = bm25(postings, {"x": 3}, n_docs=3, avg_length=5, start=2, end=9)
    assert [index for _, index in scores.values()] == [7]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"query": ""}, "query"),
    ({"query": "   ...  "}, "query"),
    ({"query": "the of and"}, "query"),
    ({"query": "x" * (MAX_QUERY_CHARS + 1)}, "query"),
    ({"query": 5}, "query"),
    ({"query": "ok", "limit": 0}, "limit"),
    ({"query": "ok", "limit": True}, "limit"),
    ({"query": "ok", "limit": 10_000}, "limit"),
    ({"query": "ok", "start": -1}, "start"),
    ({"query": "ok", "end": "3"}, "end"),
    ({"query": "ok", "start": 5, "end": 5}, "end"),
    ({"query": "ok", "start": 9, "end": 2}, "end"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    query = kwargs.pop("query")
    with pytest.raises(InvalidInput) as info:
        validate_query(query, **kwargs)
    assert info.value.field == field


def test_tool_arguments_are_validated_like_a_query() -> None:
    q = parse_tool_arguments('{"query": "main.py", "limit": 2, "start": 0, "end": 10}')
    assert (q.terms[0], q.limit, q.start, q.end) == ("main.py", 2, 0, 10)
    for bad, field in (("{", "arguments"), ("[]", "arguments"), ('{"q": 1}', "arguments"),
                       ('{"limit": 2}', "query")):
        with pytest.raises(InvalidInput) as info:
            parse_tool_arguments(bad)
        assert info.value.field == field


def test_one_tool_rendered_for_three_providers() -> None:
    openai = recall_tool("openai")
    anthropic = recall_tool("anthropic")
    gemini = recall_tool("gemini")
    assert openai["type"] == "function" and openai["function"]["name"] == "recall"
    assert openai["function"]["parameters"]["required"] == ["query"]
    assert anthropic["name"] == "recall" and anthropic["input_schema"]["type"] == "object"
    assert gemini["name"] == "recall" and "additionalProperties" not in gemini["parameters"]
    descriptions = {openai["function"]["description"], anthropic["description"],
                    gemini["description"]}
    assert len(descriptions) == 1
    json.dumps([openai, anthropic, gemini])  # plain JSON
    with pytest.raises(InvalidInput):
        recall_tool("cohere")  # type: ignore[arg-type]


def test_notice_and_rendering() -> None:
    assert "`recall` tool" in NOTICE and NOTICE.startswith("Earlier details can be recalled")
    assert "Messages 0-41" in notice(42)
    hits = [RecallHit(index=3, role="tool", text="boom ERR_X", score=2.5)]
    assert "[message 3, tool" in render_hits(hits)
    assert "No earlier message" in render_hits([])
    with pytest.raises(Exception):  # frozen  # noqa: B017
        hits[0].index = 4  # type: ignore[misc]


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_terms_are_lowercase_bounded_and_trimmed(text: str) -> None:
    for term in tokenize(text):
        assert term and term == term.lower() and len(term) <= 64
        assert not term.endswith((".", ":", "/", "-", "\\"))
    # every whole word of the text is a term of it (a query of that word matches it)
    for word in text.split():
        whole = tokenize(word)
        assert not whole or whole[0] in tokenize(text)
