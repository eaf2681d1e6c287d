"""The provider error texts the overflow classifier matches, as compiled patterns.

Written from the providers' real error shapes (OpenAI, Azure, Anthropic,
Bedrock, Gemini/Vertex, Mistral, Groq, xAI, DeepSeek, OpenRouter, Together,
Cohere, vLLM, SGLang, TGI, Ollama, llama.cpp, LM Studio, LiteLLM proxies); the
order in which ``shared.core.overflow`` consults them is documented there.

Self-hosted servers word the same refusal many ways, so the overflow and number
patterns below are phrase families (a stated window, a "longer than / exceeds"
comparison, "N tokens ... (M tokens)" pairs), not one regex per server string;
``tests/data/overflow_errors_selfhosted.json`` holds the texts they were checked on.

English only: the same families in other languages (Chinese, Japanese, Korean, Russian,
German, French...) are in ``shared.core.overflow_languages``, consulted only for texts
that are not ASCII or that nothing here recognised; the shapes in which an overflow states
its numbers are in ``shared.core.overflow_numbers``; the English verdicts that are not
overflows and rank below them (output limit, auth, content filter, overloaded, server) in
``shared.core.overflow_kinds``.
"""

from __future__ import annotations

import re

_Q = r"[`'\"]?"  # optional quoting around parameter names


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)


_LAST: list[tuple[str, str]] = [("", "")]


def _lowered(text: str) -> str:
    """``text.lower()``, computed once for the text being decided (a one-slot cache: the
    families are searched in turn on the same string)."""
    last = _LAST[0]
    if last[0] is text:
        return last[1]
    lowered = text.lower()
    _LAST[0] = (text, lowered)
    return lowered


class Gated:
    """A phrase family whose rarer branches are searched only in texts that hold one of their
    literal words (lower case). Each branch of an alternation costs a step at every position of
    every text it is searched in; a word costs one substring search of the text lower-cased
    once: so branches that cannot match without a rare word ("capacity", "bytes", "max_") wait
    behind it, and texts without it (most of them) never pay for them."""

    __slots__ = ("common", "gates")

    def __init__(self, common: re.Pattern[str] | None,
                 *gates: tuple[tuple[str, ...], re.Pattern[str]]) -> None:
        self.common = common
        self.gates = gates

    def search(self, string: str, /) -> re.Match[str] | None:
        found = self.common.search(string) if self.common is not None else None
        if found is None:
            lowered = _lowered(string)
            for words, pattern in self.gates:
                for word in words:  # a plain loop: a generator costs more than most searches
                    if word in lowered:
                        found = pattern.search(string)
                        if found is not None:
                            return found
                        break
        return found


TOOL_PAIRING = _rx(
    # OpenAI (spelt "preceeding"), DeepSeek, DashScope (double quotes)
    r"role ['\"]?tool['\"]? must be a response to a prece\w*",
    r"must be followed by tool messages responding to each",
    r"tool_call_ids? did not have response messages",
    r"tool_use`? ids were found without `?tool_result",  # Anthropic
    r"unexpected `?tool_use_id`? found in `?\w*tool_result",  # also server tools' result blocks
    r"function response turn comes immediately after a function call turn",  # Gemini
    r"number of function response parts is equal to the number of function call parts",
    r"function call turn comes immediately after a user turn",
    r"number of toolresult blocks .{0,120}exceeds the number of tooluse blocks",  # Bedrock
    r"expected toolresult blocks at",
    r"not the same number of function calls and responses",  # Mistral
    r"no tool (?:output|call) found for function call",  # OpenAI Responses
    # chat templates and tokenizers refusing the order of roles (vLLM's Mistral tokenizer,
    # llama.cpp's Jinja templates)
    r"unexpected role \W?\w+\W? after role \W?tool", r"roles must alternate",
    r"multiturn requests? ends? with a user role",  # Gemini
    r"(?:number|length) of messages must be (?:an )?odd",  # Qianfan: user/assistant pairs
    r"messages do not contain (?:any )?(?:elements?|messages?) with the role",  # DashScope
    r"successive (?:user|assistant)(?: or (?:user|assistant))? messages",  # DeepSeek reasoner
    r"first message\b.{0,80}must be a user message",
)
# Throttling and money: checked before any overflow wording (they mention tokens too).
CAPACITY = Gated(
    _rx(r"too many (?:open |concurrent )?connections", r"high traffic",
        r"reset reason: overflow",  # Envoy: its connection pool, not the context
        r"\bbackpressure\b", r"no (?:free )?space left for (?:only )?one request",
        r"total request limit reached", r"decode out of memory", r"retracted_reqs",
        r"no more data centers"),
    (("capacity",), _rx(r"out of capacity", r"capacity exceeded",
                        r"(?:insufficient|over|at|near)(?: (?:max(?:imum)?|full|peak))? capacity")),
    # a server overloaded or shedding load ("Server is temporarily limiting requests (not your
    # usage limit)"), not a limit of the caller's
    (("overload", "limiting", "shedding", "restricting"),
     _rx(r"servers?(?:[_ ]overload|(?: is| are) (?:currently |temporarily )?(?:limiting"
         r"|shedding|restricting) (?:incoming )?(?:requests|traffic|load))")),
)
QUOTA = Gated(_rx(
    # "quota(?!increase)": Azure's token-rate 429s link aka.ms/oai/quotaincrease; a quota named
    # as advice beside another verdict ("try again later or check your quotas", "quota alerts")
    r"quota(?<!check your quota)(?<!check the quota)(?<!review your quota)"
    r"(?<!monitor your quota)(?!increase|s? alerts?)", r"resource[_ ]exhausted",
    r"resource has been exhausted", r"\bbilling\b",
    r"credit balance", r"insufficient[_ ](?:balance|credits?|funds)", r"more credits",
    r"can only afford", r"exceeded your current", r"payment required", r"spending limit",
    # a usage limit (not one negated: "not your usage limit"), paid extra usage
    r"usage(?:[_ ]?limit(?<!not your usage limit)(?<!not the usage limit)(?<!not a usage limit)"
    r"|\b(?:(?<=extra usage)|(?<=additional usage)))",
    r"\bfor your (?:current )?plan\b", r"upgrade your plan",
    r"arrearage", r"account is (?:not )?in good standing", r"included credits",
    r"free allocation", r"reached the set (?:inference )?limit", r"for higher limits",
    r"hit your (?:usage |plan )?limit",
    r"(?<!token )budget (?:has been |was |is )?(?:exceeded|exhausted|reached)", r"\bkudos\b",
    r"balance is (?:insufficient|not enough|too low)", r"\btop up\b",
    r"(?:exceeded|reached) (?:your |the )?(?:max(?:imum)? )?budget",
    r"\boverdue\b", r"accountoverdue", r"\bmonthly[_ ](?:request|token|usage)",
),  # a run's token budget ("Exceeded the total_tokens_limit of 300", pydantic-ai)
    (("_tokens_limit",), _rx(r"(?:total|request|response)_tokens_limit\b")),
    # an agent's allowance of auto-approved requests ("reached the auto-approved limit of 50 API
    # requests"): reset the count to go on
    (("approv",), _rx(r"auto-?approv\w*\b.{0,40}?\blimit\b|\blimit\b.{0,40}?auto-?approv")),
    # a plan's allowance used up: "hit your session limit", "exceeded your premium request
    # allowance", "weekly limit reached", "overages", "the maximum number of interactions allowed
    # in a single day" (not a window, a rate or a length: "your context limit", "your rate limit")
    (("hit your", "reached your", "exceeded your", "used up your", "exhausted your", "out of your"),
     _rx(r"(?:hit|reached|exceeded|used up|exhausted|run out of) (?:all (?:of )?)?your "
         r"(?:(?!context|tokens?\b|length|input|prompt|output|rate|request size)[\w'-]+ ){0,3}?"
         r"(?:limit|allowance|cap)\b")),
    # a user's own token budget or allowance ("You have exceeded your token limit for this
    # model", bionic-gpt): the account's, said to "you", not the request's window
    (("you have", "you've", "you\u2019ve"), _rx(
        r"\byou(?:'ve|\u2019ve| have) (?:exceeded|used up|reached|hit|exhausted|run out of) (?:all "
        r"(?:of )?)?your (?:daily |weekly |monthly |allotted |allocated )?tokens? "
        r"(?:limit|allowance|budget|quota|cap)\b")),
    (("session", "daily", "week", "month", "-hour", "premium", "overage", "usage cap", "day"),
     _rx(r"\b(?:session|weekly|daily|monthly|\d+-hour|premium[- ]requests?) (?:usage |request )?"
         r"(?:limit|allowance|cap)\b", r"\boverages?\b", r"\busage cap\b",
         r"number of (?:interactions|requests|messages|queries|chats|conversations|prompts"
         r"|generations|questions)\b.{0,30}?\b(?:in|per|for|each) (?:a |one |the |each )?"
         r"(?:single )?(?:day|week|month)\b")),
)
# A quota counted per minute or second is a rate limit ("Quota exceeded for quota metric
# 'Generate Content API requests per minute'"): waiting is the fix, not money.
# So is a quota that names a wait of seconds or minutes ("Please retry in 39.8s").
PER_SHORT_WINDOW = _rx(r"(?:per|/) ?(?:min(?:ute)?|sec(?:ond)?)\b", r"_per_(?:minute|second)",
                       r"rate[_. ]?quota",
                       r"(?:retry|resets?|renews?|try again) (?:in|after) \d+(?:\.\d+)?\s?"
                       r"(?:m?s|secs?|seconds?|m|mins?|minutes?)\b")
RATE = Gated(_rx(
    r"rate[\s_-]?limit", r"too many requests", r"throttl",
    r"\b(?:tokens?|requests?) per (?:min|minute|hour|day|second)\b", r"\bper[- ]minute\b",
    r"\b(?:TPM|RPM|TPD|RPD|ITPM|OTPM)\b", r"\bthis minute\b", r"please wait",
    r"retry (?:after|in) \d", r"try again in \d", r"too many concurrent", r"slow down",
    r"/ ?min(?:ute)?\b", r"trial key",
),  # a batch queue's token limit ("Enqueued token limit reached ... once some in_progress
    # batches have been completed"): waiting for batches to finish is the fix, not a smaller request
    (("queued", "progress"), _rx(r"(?:enqueued|in[_ ]progress) (?:token|request|prompt|batch)")),
)
OVERFLOW_STRONG = Gated(_rx(
    r"context[_ ]?(?:length|window)[_ ]?exceeded", r"contextwindowexceeded",
    r"exceed_context_size", r"max(?:imum)? context (?:length|size|window|limit)",
    r"(?:exceed(?:s|ed|ing)?|surpass(?:es|ed|ing)?|overflow(?:s|ed|ing)?|over|longer than"
    r"|larger than|greater than) (?:the |this |your |its )?"
    r"(?:model'?s? |llm'?s? |endpoint'?s? |provider'?s? |server'?s? |available |loaded "
    r"|configured )?(?:maximum |max )?context(?: (?:length|window|size|limit))?\b",
    r"context (?:length|window|size|limit) (?:of only|exceeds|(?:has been |was |is )?exceeded)",
    r"context overflow", r"exhausted (?:the )?context window", r"prompt (?:is )?too large",
    r"context (?:still )?exceeds (?:the )?model(?:'s)? limits?",
    r"exceeds? (?:the )?model(?:'s)? (?:context )?window",
    r"max_tokens`?\W{0,3}\(?-\d",  # a negative room for the output: the prompt took it all
    r"exceed context limit",
    r"prompt(?: tokens?)? (?:is |are )?too long",
    r"input (?:length |tokens? )?(?:is )?too long",
    r"(?:number of|too many) (?:allowed |permitted |supported )?input tokens",
    r"input tokens exceed",
    r"input token count .{0,40}(?:exceeds|but model only supports)",
    r"exceeds the maximum number of tokens allowed", r"maximum prompt length",
    r"prompt tokens \(\d+\) exceed", r"prompt token count of \d+ exceeds",
    r"exceeded model token limit", r"too large for model with \d+ maximum",
    r"inputs`? tokens \+ `?max_new_tokens", r"inputs`? must have less than \d+ tokens",
    r"requested tokens \(\d+\) exceed",
    r"exceed max message tokens", r"reduce the length of the (?:messages|input|prompt)",
    r"size limit exceeded by \d+ tokens", r"tokens in the prompt cannot exceed",
    r"current length is \d+ while limit is", r"maximum (?:allowed )?input length",
    r"(?:longer than|exceeds?) (?:the )?max(?:imum)? model length",
    r"is too long and exceeds limit of",
    r"prompt has too many tokens",
    r"prompt exceeds (?:the )?max(?:imum)? (?:allowed )?(?:tokens|length)",
    # the window named as the subject of a failed comparison or an exhaustion
    r"context (?:length|window|size|limit)\b[^.;]{0,40}?\bexceeded",
    r"(?:smaller|less|shorter) than (?:the )?(?:model'?s? )?(?:max(?:imum)? )?(?:context|sequence"
    r"|model|input) (?:length|window|size)",
    r"(?:prompt|input)(?: sequence)? (?:length|size) (?:is )?(?:greater|longer|larger|more) than",
    r"(?:greater|longer|larger|more) than the (?:model'?s? )?(?:input|context|prompt) length",
    r"and the context (?:window|length|size) is \d",
    r"out of (?:room|space) in the (?:model'?s? )?context",
    r"available context (?:size|length)? ?(?:is )?-\d",  # a negative room left
    r"exceeds? (?:the )?(?:session )?max(?:imum)? (?:token |context |sequence )?length\b",
    # "Input length (N tokens) exceeds the maximum allowed length (M tokens)" (SGLang)
    # the max length's owner before it too ("exceeds the model max length (8192)")
    r"(?:input|prompt) length\b.{0,40}?(?:exceeds?|is longer than|is greater than) (?:the )?"
    r"(?:(?:model|context|llm|server)(?:'s)? )?max(?:imum)? (?:allowed |supported )?"
    r"(?:length|tokens?(?: size| count| limit)?)\b",
    r"model'?s? max(?:imum)? length (?:is )?exceeded",  # Moonshot
    r"max(?:imum)? (?:supported |allowed )?sequence length",  # SambaNova, transformers
    r"\bcontext (?:is |was |got |has become )?too (?:long|large)\b",
    r"context(?: window)? (?:is|was) (?:already )?full\b",
    r"max(?:imum)? size\W{0,3}\d[\d,]*\s?tokens\b",  # a size counted in tokens is the window
    r"string_above_max_length", r"tokens_limit_reached",
    r"string too long\. expected a string with maximum length",
    # llama.cpp / LM Studio: the kept prompt does not fit the loaded context.
    r"n_keep\W{0,3}[\d,]*\W{0,3}>=?\s*n_ctx",
    # "..., but the configured context size is N tokens" and kin.
    r"but the (?:configured |available |loaded |model'?s? )?context (?:size|length|window) is \d",
    r"exceeds? (?:the )?(?:configured |available )?context (?:size|length|window)",
    r"too (?:large|long|big) for (?:the )?(?:model'?s? )?context",
    r"exceed(?:s|ed)? (?:the )?max(?:imum)? (?:input |prompt )context",
    r"max(?:imum)? (?:text|question|prompt|input|message|context|content) length (?:exceeded|"
    r"reached)",
    r"context exceeds (?:the )?(?:provider|model|endpoint)'?s? limit",
    r"supports only \d[\d.,]*\s*[km]?\b(?: tokens?)? (?:of )?context",
    r"\b\d+ tokens? ?> ?\d+ (?:limit|max(?:imum)?)\b",
    r"exceeds? (?:the )?(?:model'?s? )?[\d,]+[- ]token context (?:window|length|size)",
    r"(?:none|nothing|no messages?) (?:of them )?(?:fit|fits|could fit) (?:in|into|within) "
    r"(?:the )?context",
    r"(?:greater|gather|larger|longer|more) than (?:the )?max(?:imum)? context\b",
    r"prompt[_ ]too[_ ]long",
    r"max(?:imum)? length exceeded", r"exceeds? (?:the )?dimension size",
    r"length of (?:the )?prompt\b.{0,40}(?:longer|larger|greater|more) than",
    r"(?:prompt|input) tokens? (?:are |is )?(?:more|greater|larger) than",
    r"(?:input|prompt) length \d+ (?:is )?(?:longer|larger|greater|more) than",
    r"(?:only|can) (?:process|handle|accept) (?:input|prompts?|inputs)\b[\w ]{0,20}? up to \d",
    r"end of the context window",
    r"context(?: window| length)? (?:has |is )?overflow(?:ed|ing)?\b",
    r"not enough (?:room in the )?context (?:window |length )?(?:is )?(?:available|left|remaining)",
    r"(?:request|conversation|context|history)(?: content)? (?:is|was|has become|got) too large",
    r"tokens? in (?:the )?(?:request|prompt|input|messages?) (?:is |are )?(?:more|greater|larger)"
    r" than",
    r"input (?:tokens? )?(?:length |count |size )?(?:is )?too (?:long|large)\b",
    r"max(?:imum)? length of (?:the )?(?:current )?(?:question|prompt|input|message)s?\b",
    r"but (?:the )?model (?:only )?supports (?:up to )?\d",  # Vertex, any model
    # the room left for the output computed negative: the prompt filled the window (vLLM)
    r"(?:max_tokens|max_new_tokens|max_completion_tokens)\W{0,3} must be "
    r"(?:at least|>=?|greater than(?: or equal to)?) [01]\W{0,3}got -\d",
),
    # rare wordings behind their literal word (batch 17 moved them out of the common alternation):
    # "range of total / input length should be", LM Studio's "when context the overflows", Gemini
    # behind a proxy "cannot truncate to N, required M", llama.cpp's "context shift is disabled"
    # and "cannot truncate prompt", ExLlamaV2's "requires N pages (only M available)" (the cache
    # holds the window), TensorRT-LLM's "couldn't assign past_key_value ... with shape", an error
    # type naming the input's length, "no position embeddings defined", a token budget exhausted
    (("range of", "when context", "truncate", "context shift", "pages", "past_key_value",
      "input_length", "position", "budget"), _rx(
        r"range of (?:total|input) length should be", r"when context the overflows",
        r"cannot truncate to \d[\d,]*,? required \d", r"context shift is disabled",
        r"cannot truncate prompt", r"requires \d+ pages \(only \d+ available\)",
        r"couldn't assign past_key_value\w* with shape", r"\btype\W{1,4}input_length\b",
        r"no position (?:encodings|embeddings) (?:are )?defined for positions?",
        r"token budget (?:was |is |has been )?(?:exceeded|exhausted)")),
    # branches whose rare word waits in front of them: a length outside its range, a server's
    # total of prompt + output against its session length (LMDeploy), a prompt not processed
    (("outside",), _rx(r"(?:text|input|prompt|request)(?: token)? length\b.{0,30}?outside "
                       r"(?:the |of )?(?:allowed |valid )?range")),
    (("sequence length",), _rx(r"(?:total )?sequence length\b.{0,40}?exceeds")),
    (("not be processed",), _rx(r"(?:message|prompt|input) (?:was|is) too long and could not be "
                                r"processed")),
    # "prompt_tokens (N) must be less than max_seq_len (M)" (SiliconFlow), vLLM-style names
    (("max_", "n_ctx", "session_len"),
     _rx(r"(?:less than|<=?|exceeds?|exceeded|greater than|longer than|larger than)(?: or equal "
         r"to)? (?:the )?[`'\"]?(?:max_seq_len|max_model_len|max_position_embeddings"
         r"|max_input_tokens|max_prompt_tokens|max_num_tokens|max_seq(?:uence)?_length"
         r"|n_ctx(?:_per_seq|_seq|_slot)?"
         r"|session_len)\b")),
    # "too long to fit into the model"; "does not / couldn't / can't / won't / unable to / failed
    # to fit in(to) the context"
    (("fit",), _rx(r"too long to fit (?:into|in) the (?:model|context)",
                   r"fit(?<=n't fit|not fit| to fit) (?:in|into|within) (?:the |its |your )?"
                   r"(?:model'?s? |llm'?s? )?(?:context|window)")),
    # LM Studio: "reached the context length"; "has reached its context window limit", "maxed out
    # the context", "context limit reached", "context length is maxed out"
    (("reach", "maxed", "hit", "used up", "filled", "exhausted"),
     _rx(r"(?:reached|maxed out) (?:the |its |your |their |this |a )?(?:model'?s? )?"
         r"(?:max(?:imum)? |full )?context (?:length|window|size|limit)",
         r"context(?: (?:length|window|size))?(?: limit)? (?:has been |was |is |got )?(?:reached"
         r"|hit|maxed(?: out)?|used up|filled up|exhausted)\b")),
    # an error code in one word: "ContextTooLong", "context_too_long", "PromptTooLong"
    (("toolong", "too_long", "toolarge", "too_large"),
     _rx(r"\b(?:context|prompt)_?too_?(?:long|large)\b")),
    # one input's own token cap, as a rule the request broke ("Single text cannot exceed 8194
    # tokens. 8746 tokens given."); not the output's or a tool's
    (("not exceed", "n't exceed", "not be longer", "not be larger", "not be more"),
     _rx(r"(?<!output )(?<!response )(?<!completion )(?<!tool )(?<!function )"
         r"\b(?:text|input|document|prompt|sequence|chunk|passage|message|request|conversation"
         r"|context)s?\W{0,3}(?:cannot|can't|can not|must not|may not|should not|is not allowed to)"
         r" (?:exceed|be (?:longer|larger|more) than) \d[\d,.]*\s?k? ?tokens\b")),
    # a chat that reached its length: "This chat has reached the maximum length", "This one's
    # reached its length limit", "exceeds the length limit for this conversation"
    # and a thread over the model's maximum size ("This thread surpasses the maximum size allowed
    # for this model. 9,120 tokens > 8,192", batch 16)
    (("length limit", "maximum length", "max length", "maximum size", "max size"), _rx(
        r"\b(?:chat|conversation|thread|session|dialog(?:ue)?|history|this one)(?:['\u2019]s| has"
        r"| have| is)? (?:reached|hit|exceeded|at) (?:its|the|their|a) (?:max(?:imum)? )?length"
        r"(?: limit)?\b",
        r"(?:exceeds?|exceeded|over|reached|hit) the (?:max(?:imum)? )?length(?: limit)? (?:for|of)"
        r" (?:this|the|your|a) (?:chat|conversation|thread|session)",
        r"\b(?:chat|conversation|thread|session)(?:'s)? length limit\b",
        r"\b(?:thread|conversation|chat|dialog(?:ue)?|history|request|prompt|input|messages?)s? "
        r"(?:surpass|exceed)(?:es|s|ed)? (?:the )?max(?:imum)? (?:size|length)"
        r"(?: allowed| permitted| supported)? (?:for|by|of) (?:this|the) model\b")),
    # a chat's memory that is full; a window too small for the prompt
    (("full",), _rx(r"\b(?:conversation|chat|dialog(?:ue)?|session|thread)(?:'s)? (?:memory|history"
                    r"|context|buffer) (?:is |was |has become |got )?(?:completely |already |now )?"
                    r"full\b")),
    (("too small",), _rx(r"context(?: window| length| size)?\b.{0,30}?too small (?:for|to (?:fit"
                         r"|hold|contain)) (?:the |your |this |its )?(?:system )?(?:prompt|request"
                         r"|input|messages?|conversation|history|tools)")),
    # batch 16: a conversation that ran out of room ("The conversation ran out of room. Start a
    # new chat"); a failure put down to the context's size ("empty response after all retries
    # due to context size"), not to memory
    (("out of room", "out of space"), _rx(
        r"\b(?:conversation|chat|dialog(?:ue)?|thread|session|history|context(?: window)?)s? "
        r"(?:has |have |had |is |was )?(?:ran|run|runs|running) out of (?:room|space)\b")),
    (("due to", "because of", "caused by"), _rx(
        r"^(?!.*(?:alloc|memory|v?ram\b)).*?\b(?:due to|because of|caused by) (?:the |a |its |an? "
        r"(?:too )?(?:large|long|big) )?(?:context|prompt) (?:size|length|window|overflow)\b")),
    # batch 17: what the model was to read, too large for the task ("This test suite to too large
    # to audit.", "Conversation is too large to process"); not a file, an image, nor llama.cpp's
    # "input (600 tokens) is too large to process. increase the physical batch size" (its config)
    (("too large to", "too long to", "too big to"), _rx(
        r"^(?!.*\bbatch[_ ]size\b).*?(?<!file )(?<!image )(?:\bis|\bare|\bwas|\bwere|\bto|\bbe) "
        r"too (?:large|long|big) to (?:process|audit|analy[sz]e|review|summari[sz]e|handle"
        r"|translate|evaluate|read|answer)\b")),
    # one input's token cap as a rule, singular or plural ("input must have less than 512 tokens.")
    (("less than", "fewer than"), _rx(
        r"\b(?:inputs?|texts?|prompts?|documents?|sequences?|chunks?|passages?)`? must "
        r"(?:have|contain|be) (?:less|fewer) than \d[\d,]* tokens")),
    # a server that truncates the prompt to its window ("msg=\"truncating input prompt\"
    # limit=4096 prompt=10128", Ollama): the request did not fit
    (("truncating",), _rx(r"\btruncating (?:the )?input (?:prompt|messages?)\b")),
)
# The provider's own overflow sentence, the window and the request both stated: it outranks the
# rate-limit or quota words of a retry loop around it ("... your messages resulted in 4452 tokens
# ... WARNING:root:Hit request rate limit; retrying...").
WINDOW_STATED = Gated(None, (("context length is", "too long:", "token count"), _rx(
    r"max(?:imum)? context length is \d[\d,]*\s?tokens\W{1,3}however,? (?:you requested|your "
    r"(?:messages|request|prompt))", r"prompt is too long: \d+ tokens > \d",
    r"input token count \(?\d+\)? exceeds the maximum number of tokens allowed")))
# A server's startup warning that names its context against the model's training context.
# A VCS's or CLI's own cap on a diff ("the diff exceeded the maximum number of files (300)",
# "PullRequest.diff too_large", batch 17): the tool refused before any model saw it.
NOT_A_REQUEST = Gated(None, (("n_ctx_train", "training context"),
                             _rx(r"n_ctx_train", r"training context overflow")),
                      (("diff",), _rx(
                          r"\bdiff\b.{0,20}?\b(?:exceeded|exceeds|is over) (?:the )?max(?:imum)? "
                          r"(?:number of )?(?:files|lines|size|bytes)\b",
                          r"\bdiff\W{0,3}(?:is |was )?too[_ ](?:large|big)\b")))
# An output parameter over the window on its own ("max_completion_tokens=384000 cannot be greater
# than max_model_len=135168"): the request's max_tokens is the fault, not its prompt.
OUTPUT_OVER_WINDOW = re.compile(
    r"(?:max_tokens|max_completion_tokens|max_new_tokens|max_output_tokens)\W{0,3}=?\s*\d+\s*"
    r"(?:cannot|can't|must not|should not|may not) be (?:greater|larger|more) than", re.I)
# The complaint is the room left for the output (the prompt alone may fit).
OUTPUT_RESERVE = _rx(r"tokens? (?:remaining|left|available) for (?:the )?(?:output|completion"
                     r"|response)", r"room for (?:the )?(?:output|completion|response)")
# A request parameter with a size limit of its own as the subject of overflow wording ("stop
# sequence exceeds maximum length of 32 tokens", "logit_bias: too many tokens in logit_bias",
# "tools[2].function.description exceeds ..."): what is too long is that parameter, which no
# compaction of the conversation shortens. Consulted only where it overlaps the overflow wording
# found (shared.core.overflow_read._parameters_own), so a parameter named elsewhere changes nothing.
_PARAMETER = (r"(?:logit[_ ]bias|stop[_ ](?:sequences?|words?|strings?)|[`'\"]stop[`'\"]"
              r"|(?:functions?|tools?)(?:\[\d+\])?(?:\.function)?[._ ](?:description|name"
              r"|parameters|schema)s?"
              r"|(?:json|response|output|input|tool)?[_ ]?schema|response[_ ]format|metadata)")
_TOO_LONG = (r"(?:exceed(?:s|ed)?|(?:is|are|was|were) (?:too long|longer|larger|greater)"
             r"|too (?:long|many|large))")
PARAMETER_OWN_LIMIT = _rx(
    rf"\b{_PARAMETER}{_Q}\W{{0,3}}(?:[^\W\d]\w*\W{{1,2}}){{0,2}}?{_TOO_LONG}",
    rf"too many tokens (?:in|for) (?:the )?{_Q}{_PARAMETER}",
)
# An over-long *parameter* (OpenAI "Invalid 'user': string too long") is not the conversation.
# The conversation is a path that starts at the messages and ends at their content:
# 'messages[3].content' and 'input[12].output' are, 'input[206].id' (an item's id),
# 'tools[0].function.name' and 'session.audio.input.transcription.prompt' are not.
NON_MESSAGE_PARAM = re.compile(
    r"invalid '(?!(?:messages|input|prompt|contents?|instructions)(?:\[\d+\])*(?:(?:\.[\w\[\]]+)*"
    r"\.(?:content|contents|text|output|arguments|input|prompt)(?:\[\d+\])*)?')[\w.\[\]]+'", re.I)
PAYLOAD = Gated(_rx(
    r"request entity too large", r"payload too large", r"request_too_large",
    r"content[_ ]too[_ ]large", r"maximum allowed number of bytes",
    r"request payload size exceeds", r"body (?:is )?too large", r"sent message larger than max",
    r"exceeds the maximum (?:request|payload|body) size",
    r"failed to buffer the request body", r"request body:? length limit exceeded",
    r"exceeds (?:the )?maximum allowed content length", r"message larger than max\b",
    r"content[_ -]length (?:limit )?exceeded",
    r"(?:string|value) length \(?\d+\)? exceeds (?:the )?maximum allowed",
    # a size in bytes over a limit, however worded ("content size limit (N) exceeded",
    # "request size exceeds limit of N bytes", "body exceeded 1mb limit", "limit on max
    # bytes", "files bytes are too large", "fields that are too large")
    r"(?:content|request|body|payload|upload|message|document|attachment) size\b.{0,40}?\bexceed",
    r"body (?:size )?exceed(?:s|ed) (?:the )?(?:\d+(?:\.\d+)? ?[kmg]i?b )?limit",
    r"limit on (?:the )?max(?:imum)? (?:number of )?bytes", r"bytes (?:are|is) too large",
    r"(?:fields?|parts?|items?|attachments?|files?|definitions?) (?:that |which )?(?:are|is) too "
    r"large",
    r"(?:file|image|upload|attachment|body|payload|request) size (?:is )?too (?:large|big)",
    r"oversized? (?:request )?body", r"exceeds? the (?:image )?dimension limit",
    r"too (?:much|many) (?:media|images|documents|attachments|files|pdf pages)",
    r"\d+ (?:images|files|documents|attachments|pdf pages),? exceed", r"image limit exceeded",
    r"number of (?:files|images|attachments|documents) exceeds",
    r"at most \d+ (?:image|file|document|attachment|item)s?(?:\(s\))? (?:may|can) be",
    r"limit[_-]mm[_-]per[_-]prompt",
    r"(?:payload|body|request) (?:reached|exceeded|exceeds|hit) (?:the |its )?(?:max(?:imum)? )?"
    r"size limit",
    r"(?:less|fewer) than \d+ characters", r"files? too large",
    r"body exceeded \d+(?:\.\d+)? ?[kmg]i?b", r"too large \(max(?:imum)? [\d.]+ ?[kmg]i?b\)",
),
    (("exceed",), _rx(
        r"(?:media|attachments?|images?|files?|body|payload)\b.{0,20}exceeds? (?:the |its )?size "
        r"limits?",
        r"exceed(?:s|ed)? (?:the )?max(?:imum)? (?:number|count) of (?:images|files|attachments"
        r"|documents|pdf pages)",
        # a size in MB that may not be exceeded ("cannot exceed 15.00 MB"); one image over its own
        # cap ("image exceeds 5 MB maximum") is not the request's size (tests/test_overflow.py)
        r"(?:cannot|can't|must not|may not) exceed [\d.]+ ?[kmg]i?b\b")),
    # an input's dimensions over a limit in pixels ("input size exceed limit 2048x2048,current
    # input:(2560,1440)"), as the image dimension limits above
    (("size exceed", "size is over", "size over", "resolution", "dimension"), _rx(
        r"(?:size|resolution|dimensions?) (?:exceeds?|exceeded|is over|over) (?:the )?"
        r"(?:max(?:imum)? )?(?:allowed )?(?:limit|maximum|max)?\W{0,3}\d+ ?[x\u00d7*] ?\d+")),
    # an HTTP client's own cap on the body (axios / follow-redirects
    # "ERR_FR_MAX_BODY_LENGTH_EXCEEDED", "Request body larger than maxBodyLength limit"); a file
    # or a document over its maximum size
    (("body_length", "bodylength", "body length", "file size", "document too", "document_too",
      "document is too", "document was too"), _rx(
        r"max[_ ]?body[_ ]?length[_ ]?(?:exceeded|limit)",
        r"max(?:imum)? (?:allowed )?file size (?:has been |was |is )?(?:exceeded|reached)\b",
        r"\bdocument[_ ](?:is |was )?too[_ ](?:large|big)\b")),
    # an image's width or height over its limit in pixels ("exceeds the 10k pixel limit")
    (("width", "height", "pixel"), _rx(
        r"(?:width|height)\b.{0,20}?\bexceeds? (?:the )?(?:max(?:imum)? )?(?:allowed )?"
        r"(?:\d[\d,]*k? ?)?(?:pixels?|px)? ?(?:limit|maximum)\b")),
    # a body whose length fails a constraint (Bedrock: "Value at 'body' failed to satisfy
    # constraint: Member must have length less than or equal to 25000000")
    (("value at",), _rx(r"value at '(?:body|payload|request_?body)'[^.]{0,60}?(?:length|size) "
                        r"(?:less than|at most|<=|smaller than|must not exceed)")),
)
# A lookup that failed (a model or route that does not exist): never a size problem.
NOT_FOUND = _rx(r"\b404\b", r"not[_ ]found", r"does not exist", r"no such (?:model|route)",
                r"not a (?:valid|known|supported) model",
                r"(?:unknown|invalid|unsupported) model", r"no endpoints? found",
                r"model .{0,60}? (?:is )?not (?:found|available|supported)")
# A request that names what is malformed in it (a parameter, a value, a type): a size
# problem would not be worded so.
MALFORMED = _rx(
    r"invalid (?:value|type|parameter|argument|format|base64|image|url|json|schema|enum|role)",
    r"unsupported (?:parameter|value|image|media|file|content|role)", r"must be one of",
    r"must be (?:a valid|an? (?:string|integer|number|boolean|array|object|list))",
    r"is not (?:a )?valid\b", r"(?:unknown|unrecognized|unexpected) (?:parameter|field|argument)",
    r"extra (?:inputs|fields) (?:are )?not permitted", r"field required",
    r"missing required", r"(?:above|below) (?:the )?(?:maximum|minimum) value",
    r"expected an? (?:string|integer|number|value|object|array)", r"must not be empty",
    r"\billegal\b", r"invalid params?\b", r"invalid request:", r"\bare not valid",
    r"must be strictly", r"stop[_ ]?sequences?", r"image dimensions?", r"invalid_param",
    r"\bis invalid\b", r"maximum number of items", r"may not include", r"must be at least",
    r"should be (?:greater|less) than or equal to", r"too many inputs",
    # a minimum not met, a schema's tag, a prompt-caching rule, a mode's unsupported option, a
    # model's malformed tool call
    r"must be >= ?[01]\b", r"is too small\b", r"does not match any of the expected",
    r"cache_control", r"does not support (?:this|the) (?:tool_choice|parameter|value|option"
    r"|feature|setting)", r"produced (?:an )?invalid",
    # a name's own rules, a thinking budget's range, a count of inputs per request
    r"invalid (?:[\w-]+ )?name\b", r"thinking[_ .]?budget|budget_tokens",
    r"\b(?:function|tool|field|parameter|property|model|user|file)[_ ]?names?\b.{0,60}?(?:too "
    r"long|max(?:imum)? length|at most \d|(?:cannot|must not) exceed|longer than)",
    r"supported values (?:are|is)\b",
    # batch 17: a tool's name over a Bedrock constraint ("toolSpec.name' failed to satisfy
    # constraint: Member must have length ..."); a text extractor's cap in characters on a file
    r"(?:tool|function)\w*\.name\W{0,3}failed to satisfy",
    r"\b(?:document|file|page|pdf)s? (?:contains?|contained|has|had) more than \d[\d,]* characters",
    # a named field's own length ("field 'prompt' length 2845 is greater than the maximum length
    # 2048"), an embedding batch's count ("input batch size 473 > maximum allowed batch size 64")
    r"\b(?:field|parameter|property|argument)\W{1,3}[\w.]+\W{1,3}(?:length|size)\b",
    r"\bbatch[_ ]size\b[^.]{0,20}?(?:>|exceeds?|larger than|greater than)\s*(?:the )?"
    r"(?:max(?:imum)? )?(?:allowed )?(?:batch[_ ]size|\d)",
    r"(?:at most|no more than|a maximum of|up to) \d+ (?:requests|inputs|items|texts|strings"
    r"|documents|chunks|embeddings|elements|entries)\b",
)
# Overflow wording stated as a guess ("this often happens when the context is too long") in a
# text that names another cause (a model that does not exist) is not an overflow.
HEDGE = re.compile(r"\b(?:often|usually|typically|sometimes|commonly|generally|possibly|probably"
                   r"|likely|perhaps|may|might|could)\b", re.I)
OVERFLOW_WEAK = _rx(
    r"too many tokens", r"token limit", r"request (?:is )?too large",
    r"too long for (?:this|the) model",
    r"messages? (?:you \w+ )?(?:is|are|was|were) too long", r"total length of all messages",
    r"(?:conversation|dialog(?:ue)?|chat)s? (?:is |are |has become |have become |became |got )?"
    r"too (?:long|large)",
    r"\btext (?:is )?too long\b", r"exceed(?:s|ed)? (?:the )?max(?:imum)? tokens? limit",
    r"max(?:imum)? tokens (?:of \d+ )?(?:exceeded|reached)",
    r"max(?:imum)? number of tokens", r"tokens? exceeds? (?:the )?(?:max|limit|allowed)",
    r"token count exceeds", r"number of tokens .{0,30}exceeds?",
)

PROVIDER_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(p, re.IGNORECASE))
    for name, p in (
        ("litellm", r"litellm"),
        ("openrouter", r"openrouter|middle-out|provider returned error"),
        ("azure", r"azure"),
        ("bedrock", r"bedrock|validationexception|throttlingexception|serviceunavailableexception"),
        ("vertex", r"vertex|aiplatform|unable to submit request because"),
        ("gemini", r"gemini|generativelanguage|invalid_argument|resource_exhausted"
                   r"|input token count"),
        ("anthropic", r"anthropic|tool_use|overloaded_error|prompt is too long: \d+ tokens >"
                      r"|exceed context limit: \d+ \+"),
        ("llama.cpp", r"exceed_context_size|available context size|n_ctx"),
        ("lm-studio", r"when context the overflows|lm studio"),
        ("ollama", r"ollama|exceeded max context length by"),
        ("mistral", r"mistral|too large for model with \d+ maximum context"),
        ("cohere", r"cohere|too many tokens:|prompt_truncation"),
        ("together", r"together|max_new_tokens|is longer than the model's context length"),
        ("groq", r"groq|service tier `?on_demand"),
        ("xai", r"\bx\.?ai\b|grok|maximum prompt length is"),
        ("deepseek", r"deepseek"),
        ("vllm", r"vllm|prompt contains at least \d+ input tokens|your request has \d+ input"),
        ("openai", r"openai|context_length_exceeded|your messages resulted in"),
    )
)
MODULE_PROVIDERS = (("openai", "openai"), ("anthropic", "anthropic"), ("google", "gemini"),
                     ("botocore", "bedrock"), ("litellm", "litellm"), ("groq", "groq"),
                     ("mistralai", "mistral"), ("cohere", "cohere"))

STATUS_IN_TEXT = re.compile(
    r"^\W*(?:error:?\s*)?([1-5]\d\d)\b"
    r"|(?:error code|status(?:[ _]?code)?|http(?: status)?(?: code)?)\W{0,3}([1-5]\d\d)\b"
    r"|error \(([1-5]\d\d)\)",
    re.IGNORECASE,
)
ESCAPES = re.compile(r"\\+([\"'`])|\\u00(?:27|22|3[ce]|26)|\\[nrt]", re.IGNORECASE)
"""Escapes of texts quoted inside JSON strings: quotes, "<", ">" and "&" as JSON encoders write
them (``\\u003e``), and whitespace."""
UNICODE_ESCAPES = {"27": "'", "22": '"', "3c": "<", "3e": ">", "26": "&"}
STATUS_KEYS = frozenset({"status_code", "status", "code", "http_status", "httpstatuscode",
                          "statuscode", "status_int"})
