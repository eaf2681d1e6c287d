"""Provider usage read as the prompt tokens of one request, from every format a caller holds."""

from __future__ import annotations

from typing import Any

import pytest
from google.genai import types as genai_types
from openai.types import CompletionUsage
from openai.types.responses import ResponseUsage

from shared.core.errors import InvalidInput
from shared.core.usage import reported_prompt_tokens, validate_usage


@pytest.mark.parametrize(("usage", "prompt"), [
    (CompletionUsage(prompt_tokens=1200, completion_tokens=30, total_tokens=1230), 1200),
    ({"prompt_tokens": 1200, "completion_tokens": 30}, 1200),
    # the Responses API: input_tokens already counts the cached ones (a detail of it)
    (ResponseUsage(input_tokens=1200, output_tokens=30, total_tokens=1230,
                   input_tokens_details={"cached_tokens": 1000, "cache_write_tokens": 0},
                   output_tokens_details={"reasoning_tokens": 0}), 1200),
    # Anthropic: cache writes and reads are reported beside input_tokens, all were sent
    ({"input_tokens": 200, "cache_creation_input_tokens": 300,
      "cache_read_input_tokens": 700, "output_tokens": 30}, 1200),
    # Bedrock Converse: the same split in camelCase
    ({"inputTokens": 200, "cacheWriteInputTokens": 300, "cacheReadInputTokens": 700,
      "outputTokens": 30, "totalTokens": 1230}, 1200),
    ({"inputTokens": 1200, "outputTokens": 30, "totalTokens": 1230}, 1200),
    (genai_types.GenerateContentResponseUsageMetadata(prompt_token_count=1200,
                                                      candidates_token_count=30), 1200),
    ({"promptTokenCount": 1200, "candidatesTokenCount": 30}, 1200),
    (1200, 1200),
])
def test_the_prompt_tokens_of_each_format(usage: Any, prompt: int) -> None:
    assert reported_prompt_tokens(usage) == prompt


@pytest.mark.parametrize("usage", [None, 0, {}, {"completion_tokens": 5}, {"prompt_tokens": 0},
                                   {"inputTokens": 0}, object()])
def test_no_prompt_figure_is_none(usage: Any) -> None:
    assert reported_prompt_tokens(usage) is None


@pytest.mark.parametrize(("usage", "field"), [
    ({"prompt_tokens": "1200"}, "usage.prompt_tokens"),
    ({"input_tokens": 10, "cache_read_input_tokens": -1}, "usage.cache_read_input_tokens"),
    ({"inputTokens": 10, "cacheReadInputTokens": 2.5}, "usage.cacheReadInputTokens"),
    ({"totalTokens": True}, "usage.totalTokens"),
    (-3, "usage"),
    ("1200", "usage"),
])
def test_a_count_that_is_not_one_is_refused_naming_its_field(usage: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        validate_usage(usage)
    with pytest.raises(InvalidInput, match=field.replace(".", r"\.")):
        reported_prompt_tokens(usage)
