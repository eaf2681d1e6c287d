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
that are not ASCII or that nothing here recognised.
"""

from __future__ import annotations

import re

# A token count: thousands separators allowed, or a k / M suffix ("128k", "1.5M"; read by
# shared.core.overflow.stated_count as 128,000 and 1,500,000).
_N = r"(\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?[kKmM]\b|\d+)"
_Q = r"[`'\"]?"  # optional quoting around parameter names


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)


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
CAPACITY = _rx(r"out of capacity", r"capacity exceeded", r"(?:insufficient|over|at) capacity",
               r"too many (?:open |concurrent )?connections", r"high traffic",
               r"reset reason: overflow",  # Envoy: its connection pool, not the context
               r"\bbackpressure\b", r"no (?:free )?space left for (?:only )?one request",
               r"total request limit reached", r"decode out of memory", r"retracted_reqs",
               r"no more data centers")
QUOTA = _rx(
    # "quota(?!increase)": Azure's token-rate 429s link aka.ms/oai/quotaincrease.
    r"quota(?!increase)", r"resource[_ ]exhausted", r"resource has been exhausted", r"\bbilling\b",
    r"credit balance", r"insufficient[_ ](?:balance|credits?|funds)", r"more credits",
    r"can only afford", r"exceeded your current", r"payment required", r"spending limit",
    r"usage limits?\b", r"\bfor your (?:current )?plan\b", r"upgrade your plan",
    r"arrearage", r"account is (?:not )?in good standing", r"included credits",
    r"free allocation", r"reached the set (?:inference )?limit", r"for higher limits",
    r"hit your (?:usage |plan )?limit",
    r"(?<!token )budget (?:has been |was |is )?(?:exceeded|exhausted|reached)", r"\bkudos\b",
    r"balance is (?:insufficient|not enough|too low)", r"\btop up\b",
    r"(?:exceeded|reached) (?:your |the )?(?:max(?:imum)? )?budget",
    r"\boverdue\b", r"accountoverdue", r"\bmonthly[_ ](?:request|token|usage)",
)
# A quota counted per minute or second is a rate limit ("Quota exceeded for quota metric
# 'Generate Content API requests per minute'"): waiting is the fix, not money.
PER_SHORT_WINDOW = _rx(r"(?:per|/) ?(?:min(?:ute)?|sec(?:ond)?)\b", r"_per_(?:minute|second)",
                       r"rate[_. ]?quota")
RATE = _rx(
    r"rate[\s_-]?limit", r"too many requests", r"throttl",
    r"\b(?:tokens?|requests?) per (?:min|minute|hour|day|second)\b", r"\bper[- ]minute\b",
    r"\b(?:TPM|RPM|TPD|RPD|ITPM|OTPM)\b", r"\bthis minute\b", r"please wait",
    r"retry (?:after|in) \d", r"try again in \d", r"too many concurrent", r"slow down",
    r"/ ?min(?:ute)?\b", r"trial key",
)
OVERFLOW_STRONG = _rx(
    r"context[_ ]?(?:length|window)[_ ]?exceeded", r"contextwindowexceeded",
    r"exceed_context_size", r"max(?:imum)? context (?:length|size|window|limit)",
    r"(?:exceeds?|exceeded|over|longer than|larger than|greater than) (?:the |this |your )?"
    r"(?:model'?s? |llm'?s? |endpoint'?s? |available |loaded |configured )?(?:maximum |max )?"
    r"context(?: (?:length|window|size|limit))?\b",
    r"context (?:length|window|size|limit) (?:of only|exceeds|(?:has been |was |is )?exceeded)",
    r"context overflow", r"exhausted (?:the )?context window", r"prompt (?:is )?too large",
    r"context (?:still )?exceeds (?:the )?model(?:'s)? limits?",
    r"exceeds? (?:the )?model(?:'s)? (?:context )?window", r"range of total length should be",
    r"max_tokens`?\W{0,3}\(?-\d",  # a negative room for the output: the prompt took it all
    r"exceed context limit",
    r"when context the overflows", r"prompt(?: tokens?)? (?:is |are )?too long",
    r"input (?:length |tokens? )?(?:is )?too long", r"(?:number of |too many )input tokens",
    r"input tokens exceed",
    r"input token count .{0,40}(?:exceeds|but model only supports)",
    r"exceeds the maximum number of tokens allowed", r"maximum prompt length",
    r"prompt tokens \(\d+\) exceed", r"prompt token count of \d+ exceeds",
    r"exceeded model token limit", r"too large for model with \d+ maximum",
    r"inputs`? tokens \+ `?max_new_tokens", r"inputs`? must have less than \d+ tokens",
    r"requested tokens \(\d+\) exceed", r"range of input length should be",
    r"exceed max message tokens", r"reduce the length of the (?:messages|input|prompt)",
    r"size limit exceeded by \d+ tokens", r"tokens in the prompt cannot exceed",
    r"current length is \d+ while limit is", r"maximum (?:allowed )?input length",
    r"(?:longer than|exceeds?) (?:the )?max(?:imum)? model length",
    r"is too long and exceeds limit of",
    r"prompt has too many tokens",
    r"prompt exceeds (?:the )?max(?:imum)? (?:allowed )?(?:tokens|length)",
    # "prompt_tokens (N) must be less than max_seq_len (M)" (SiliconFlow), vLLM-style names
    r"(?:less than|<=?|exceeds?|exceeded|greater than|longer than|larger than)(?: or equal to)? "
    r"(?:the )?[`'\"]?(?:max_seq_len|max_model_len|max_position_embeddings|max_input_tokens"
    r"|max_prompt_tokens|max_num_tokens|n_ctx|session_len)\b",
    r"too long to fit (?:into|in) the (?:model|context)",
    r"cannot truncate to \d[\d,]*,? required \d",  # Gemini behind a proxy
    r"context shift is disabled",  # llama.cpp: the reply would outgrow the context
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
    r"(?:message|prompt|input) (?:was|is) too long and could not be processed",
    # "Input length (N tokens) exceeds the maximum allowed length (M tokens)" (SGLang)
    r"(?:input|prompt) length\b.{0,40}?(?:exceeds?|is longer than|is greater than) (?:the )?"
    r"max(?:imum)? (?:allowed |supported )?(?:length|tokens?(?: size| count| limit)?)\b",
    r"model'?s? max(?:imum)? length (?:is )?exceeded",  # Moonshot
    r"max(?:imum)? (?:supported |allowed )?sequence length",  # SambaNova, transformers
    r"reached (?:the )?(?:max(?:imum)? )?context (?:length|window|size|limit)",  # LM Studio
    r"\bcontext (?:is |was |got |has become )?too (?:long|large)\b",
    r"context(?: window)? (?:is|was) (?:already )?full\b",
    r"max(?:imum)? size\W{0,3}\d[\d,]*\s?tokens\b",  # a size counted in tokens is the window
    r"(?:text|input|prompt|request)(?: token)? length\b.{0,30}?outside (?:the |of )?"
    r"(?:allowed |valid )?range",
    r"string_above_max_length", r"tokens_limit_reached",
    r"string too long\. expected a string with maximum length",
    # llama.cpp / LM Studio: the kept prompt does not fit the loaded context.
    r"cannot truncate prompt", r"n_keep\W{0,3}\d*\W{0,3}>=?\s*n_ctx",
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
    r"token budget (?:was |is |has been )?(?:exceeded|exhausted)",
    r"(?:greater|gather|larger|longer|more) than (?:the )?max(?:imum)? context\b",
    r"prompt[_ ]too[_ ]long",
    r"max(?:imum)? length exceeded", r"exceeds? (?:the )?dimension size",
    r"no position (?:encodings|embeddings) (?:are )?defined for positions?",
    r"length of (?:the )?prompt\b.{0,40}(?:longer|larger|greater|more) than",
    r"(?:prompt|input) tokens? (?:are |is )?(?:more|greater|larger) than",
    r"(?:input|prompt) length \d+ (?:is )?(?:longer|larger|greater|more) than",
    r"(?:only|can) (?:process|handle|accept) (?:input|prompts?|inputs)\b[\w ]{0,20}? up to \d",
    r"requires \d+ pages \(only \d+ available\)",  # ExLlamaV2: the cache holds the window
    r"couldn't assign past_key_value\w* with shape",  # TensorRT-LLM: past the engine's maximum
    r"end of the context window",
    r"context(?: window| length)? (?:has |is )?overflow(?:ed|ing)?\b",
    r"not enough (?:room in the )?context (?:window |length )?(?:is )?(?:available|left|remaining)",
    r"(?:request|conversation|context|history)(?: content)? (?:is|was|has become|got) too large",
    r"tokens? in (?:the )?(?:request|prompt|input|messages?) (?:is |are )?(?:more|greater|larger)"
    r" than",
    r"input (?:tokens? )?(?:length |count |size )?(?:is )?too (?:long|large)\b",
    r"max(?:imum)? length of (?:the )?(?:current )?(?:question|prompt|input|message)s?\b",
    r"(?:does not|doesn't|did not|won't|cannot|can't) fit (?:in|into|within) (?:the )?"
    r"(?:model'?s? )?(?:context|window)",
    r"but (?:the )?model (?:only )?supports (?:up to )?\d",  # Vertex, any model
    # a server's total of prompt + output against its session length (LMDeploy)
    r"(?:total )?sequence length\b.{0,40}?exceeds",
    r"\btype\W{1,4}input_length\b",  # an error type naming the input's length
    # the room left for the output computed negative: the prompt filled the window (vLLM)
    r"(?:max_tokens|max_new_tokens|max_completion_tokens)\W{0,3} must be "
    r"(?:at least|>=?|greater than(?: or equal to)?) [01]\W{0,3}got -\d",
)
# A server's startup warning that names its context against the model's training context.
NOT_A_REQUEST = _rx(r"n_ctx_train", r"training context overflow")
# An output parameter over the window on its own ("max_completion_tokens=384000 cannot be greater
# than max_model_len=135168"): the request's max_tokens is the fault, not its prompt.
OUTPUT_OVER_WINDOW = re.compile(
    r"(?:max_tokens|max_completion_tokens|max_new_tokens|max_output_tokens)\W{0,3}=?\s*\d+\s*"
    r"(?:cannot|can't|must not|should not|may not) be (?:greater|larger|more) than", re.I)
# The complaint is the room left for the output (the prompt alone may fit).
OUTPUT_RESERVE = _rx(r"tokens? (?:remaining|left|available) for (?:the )?(?:output|completion"
                     r"|response)", r"room for (?:the )?(?:output|completion|response)")
# An over-long *parameter* (OpenAI "Invalid 'user': string too long") is not the conversation.
NON_MESSAGE_PARAM = re.compile(r"invalid '(?!messages|input|prompt|contents?\b)[\w.\[\]]+'", re.I)
PAYLOAD = _rx(
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
    r"(?:content|request|body|payload|upload|message) size\b.{0,40}?\bexceed",
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
    r"(?:cannot|can't|must not|may not) exceed [\d.]+ ?[kmg]i?b\b",
    r"(?:less|fewer) than \d+ characters", r"files? too large",
    r"body exceeded \d+(?:\.\d+)? ?[kmg]i?b", r"too large \(max(?:imum)? [\d.]+ ?[kmg]i?b\)",
    r"(?:media|attachments?|images?|files?|body|payload)\b.{0,20}exceeds? (?:the |its )?size "
    r"limits?",
)
# A lookup that failed (a model or route that does not exist): never a size problem.
NOT_FOUND = _rx(r"\b404\b", r"not[_ ]found", r"does not exist", r"no such (?:model|route)",
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
)
# Two parameters that may not be combined: a malformed request, whatever they are about.
PARAMETER_CONFLICT = _rx(r"cannot be (?:set|specified|used) (?:at the same time|together)",
                         r"mutually exclusive", r"cannot both be (?:set|specified)")
OUTPUT_LIMIT = _rx(
    r"max_tokens is too large", r"maximum allowed number of output tokens",
    r"supports at most \d+ completion tokens", r"maximum output for this model",
    r"valid range of max_tokens", r"invalid max_tokens value",
    r"max(?:imum)? tokens you requested exceeds", r"max(?:imum)? tokens value that is lower",
    # a client's verdict on a reply cut at max_tokens (AI SDK, openai-python's parse())
    r"(?:finish[_ ])?reason\W{0,3}(?:max_tokens|max_output_tokens|length)\b",
    r"length limit was reached", r"model output limit was reached",
    r"lengthfinishreasonerror", r"range of max_tokens", r"exceeded output limit",
    r"response incomplete\W{0,3}(?:length|max_tokens)",
    r"(?:response|output|reply|completion) (?:was |is )?(?:truncated|cut off)",
    r"(?:response|output|reply|completion) remained truncated",
    r"(?:response|output|reply|answer|completion) (?:hit|reached) the (?:length|token|output) "
    r"limit",
    r"(?:reached|hit|exceeded) (?:its|the) (?:max(?:imum)? )?output(?: token)? limit",
    r"for the (?:content )?length reason", r"max_?tokens\W{0,3}(?:is )?invalid\b",
    r"did not \w+ a final (?:response|output)",  # the Agents SDK (JS), its typo included
    r"finish_?reason\W{0,5}(?:max_tokens|max_output_tokens|length)\b",
    r"before any (?:response|output|content|text) was generated",
    r"increase (?:the )?\W?(?:max_tokens|max_output_tokens|max_completion_tokens)\b",
    rf"{_Q}(?:max_tokens|max_completion_tokens|max_output_tokens|maxoutputtokens|max_new_tokens"
    rf"|num_predict){_Q}(?: value)?\b.{{0,80}}(?:too large|too big|above maximum|exceed"
    r"|greater than|(?:must|should) be (?:less|<|smaller|at most)|less (?:than )?or equal"
    r"|supported range"
    r"|valid range|out of range|not valid)",
)
AUTH = _rx(
    r"\bunauthori[sz]ed\b", r"\bunauthenticated\b", r"authentication", r"\bnot authori[sz]ed\b",
    r"invalid[_ -]?(?:api[_ -]?)?key", r"incorrect api key", r"api key not valid",
    r"invalid x-api-key", r"permission[_ ]denied", r"\bforbidden\b", r"access ?denied",
    r"unrecognizedclient", r"security token included in the request is invalid",
    r"(?:expired|invalid) (?:access |bearer )?token\b(?! count)", r"token (?:has )?expired",
    r"api key (?:expired|invalid|missing|required)", r"(?:provide|missing|no) an? api key",
    r"you have been blocked",  # a firewall's page
)
CONTENT_FILTER = _rx(
    r"content[_ ]filter", r"content[_ ]management[_ ]polic", r"content[_ ]polic(?:y|ies)",
    r"responsibleaipolicyviolation", r"safety system", r"flagged as potentially violating",
    r"usage polic(?:y|ies)", r"blocked by (?:the |our )?(?:safety|guardrail|content)",
    r"prohibited content", r"guardrail intervened", r"inappropriate content",
    r"data[_ ]inspection[_ ]failed", r"content exists risk",
    r"blocked (?:due to|because of|for) \w*\s?(?:safety|policy|content)",
)
OVERLOADED = _rx(r"\boverloaded", r"model ?not ?ready", r"currently loading", r"high demand",
                  r"too busy", r"loading (?:the )?model\b", r"no (?:available |free )?slots?"
                  r" (?:is |are )?(?:available|found|left)",
                  r"servers? (?:is |are )?busy")  # Ollama: "server busy, please try again"
SERVER = _rx(
    r"internal[_ ]server[_ ]error", r"internal[_ ]error", r"service[_ ]?unavailable",
    r"service (?:is )?(?:temporarily )?unavailable",
    r"bad gateway", r"gateway time-?out", r"timed? ?out\b", r"deadline[_ ]exceeded",
    r"connection (?:refused|reset|aborted|error|closed)", r"apiconnectionerror",
    r"server disconnected", r"remote ?protocol ?error", r"crashed", r"upstream (?:connect )?error",
    r"network (?:error|is unreachable)", r"name or service not known",
    r"temporary failure in name resolution", r"econnrefused|econnreset|etimedout",
    r"\bserver_error\b", r"server had an error", r"deadline expired",
    r"error occurred while processing your request", r"out of available cache blocks",
    r"server[- ]side (?:issue|error)",
    r"(?:can be|could be) stored in (?:the )?kv cache",  # an engine configured beyond its memory
    r"available kv cache memory", r"out of memory", r"insufficient memory", r"fatal error",
    r"engine ?dead", r"enginecore encountered",
    r"payload is not completed", r"premature close", r"typeerror: terminated",
    r"web server is (?:returning an unknown error|down)", r"origin (?:is )?unreachable",
    r"(?:iterating over|reading) (?:the |an )?sse stream",
)
OVERFLOW_WEAK = _rx(
    r"too many tokens", r"token limit", r"request (?:is )?too large",
    r"too long for (?:this|the) model",
    r"messages? (?:you \w+ )?(?:is|are|was|were) too long", r"total length of all messages",
    r"conversation (?:is |has become |became |got )?too (?:long|large)",
    r"\btext (?:is )?too long\b", r"exceed(?:s|ed)? (?:the )?max(?:imum)? tokens? limit",
    r"max(?:imum)? tokens (?:of \d+ )?(?:exceeded|reached)",
    r"max(?:imum)? number of tokens", r"tokens? exceeds? (?:the )?(?:max|limit|allowed)",
    r"token count exceeds", r"number of tokens .{0,30}exceeds?",
)

# Numbers: (pattern, field names in group order). First value found per field wins.
NUMBERS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(p, re.IGNORECASE), f)
    for p, f in (
        # "input_ids size (P) + current sequence length (G) exceeds max length (L)"
        (rf"input_ids size \(?{_N}\)?\s*\+[^()]{{0,40}}\(\d+\)\s*exceeds max(?:imum)? length "
         rf"\(?{_N}", ("prompt", "limit")),
        (rf"is too large: {_N}\. this model's maximum context length is {_N} tokens and your "
         rf"request has {_N} input tokens", ("output", "limit", "prompt")),
        # "maximum context length: 130000 > 128000", "too many input tokens: 9000 > 8192":
        # the stated length, then the limit
        (rf"(?:context|prompt|input) (?:length|tokens):? {_N} ?> ?{_N}\b", ("prompt", "limit")),
        (rf"max(?:imum)? (?:context|prompt) length:? (?:is |of )?{_N}", ("limit",)),
        (rf"context length (?:is |of )?only {_N}", ("limit",)),
        (rf"you passed {_N} input tokens and requested {_N} output tokens", ("prompt", "output")),
        (rf"max(?:imum)? (?:supported |allowed )?sequence length(?: for this model)? "
         rf"(?:is )?(?:just |only )?\(?{_N}", ("limit",)),
        (rf"prompt is {_N} tokens long", ("prompt",)),
        # "prompt_tokens (N) must be less than max_seq_len (M)", "max_total_tokens (N) must be
        # less than or equal to max_seq_len (M)"
        (rf"\b\w*tokens\W{{0,3}}\(?{_N}\)? must be less than (?:or equal to )?\w+\W{{0,3}}\(?{_N}",
         ("total", "limit")),
        (rf"total length {_N}\)? is too long to fit into the model \(context length {_N}",
         ("prompt", "limit")),
        (rf"cannot truncate to {_N},? required {_N}", ("limit", "prompt")),
        (rf"you supplied {_N} tokens", ("prompt",)),
        # "Prompt length of N is longer than the maximum model length of M" and kin
        (rf"(?:prompt|input)(?: length)?(?: of)? \(?{_N}(?: tokens)?\)? (?:is )?(?:longer|larger"
         rf"|greater|more) than (?:the )?(?:max(?:imum)? )?(?:model |context )?(?:length|window"
         rf"|size|limit)(?: of| is)? \(?{_N}", ("prompt", "limit")),
        (rf"model'?s? max(?:imum)? length (?:is )?exceeded\W{{0,3}}max(?:imum)? length"
         rf"\s*[:=]?\s*{_N}", ("limit",)),
        (rf"reached (?:the )?context length of {_N}", ("limit",)),
        (rf"context (?:length|window|size|limit) (?:was |has been |is )?exceeded \({_N} tokens?\)",
         ("limit",)),
        (rf"your messages resulted in {_N} tokens", ("prompt",)),
        (rf"you requested (?:about )?{_N} tokens", ("total",)),
        (rf"\({_N} (?:in the messages|of text input|in your prompt)", ("prompt",)),
        (rf"{_N} (?:in|for) the (?:completion|output)", ("output",)),
        (rf"you requested {_N} output tokens and your prompt contains at least {_N} input tokens"
         rf"(?:, for a total of at least {_N})?", ("output", "prompt", "total")),
        (rf"your request has {_N} (?:input|prompt) tokens", ("prompt",)),
        (rf"prompt is too long: {_N} tokens > {_N}", ("prompt", "limit")),
        (rf"prompt is too long: {_N}\b", ("prompt",)),
        (rf"{_N} (?:input|prompt) tokens,? exceeds?", ("prompt",)),
        (rf"exceed context limit: {_N} \+ {_N} > {_N}", ("prompt", "output", "limit")),
        (rf"input token count \(?{_N}\)? exceeds the maximum number of tokens allowed \(?{_N}",
         ("prompt", "limit")),
        (rf"max(?:imum)? number of tokens(?: allowed| for this model)?(?: is)? \(?{_N}",
         ("limit",)),
        (rf"tokens? exceeds? (?:the )?max(?:imum)? length of {_N}", ("limit",)),
        (rf"max size: {_N} tokens", ("limit",)),
        # "the input token count is N but the model supports up to M", "the input has N tokens,
        # but the context length only supports M tokens"
        (rf"{_N}(?: tokens?)?,? but (?:the )?(?:model|context (?:length|window|size))(?: only)? "
         rf"supports (?:up to |only )?{_N}", ("prompt", "limit")),
        # "Max Input Tokens=M, Got=N" (LiteLLM's pre-call check)
        (rf"max(?:imum)? (?:input )?tokens\W{{1,3}}{_N}\W{{1,3}}got\W{{1,3}}{_N}",
         ("limit", "prompt")),
        (rf"prompt contains {_N} tokens(?: and \d+ draft tokens)?, too large for model with {_N}",
         ("prompt", "limit")),
        (rf"maximum prompt length is {_N} but the request contains {_N}", ("limit", "prompt")),
        (rf"max_new_tokens`? must be <= {_N}\. given: {_N} `?inputs`? tokens and {_N}",
         ("limit", "prompt", "output")),
        (rf"inputs`? must have less than {_N} tokens\. given: {_N}", ("limit", "prompt")),
        (rf"requested tokens \({_N}\) exceed context window of {_N}", ("total", "limit")),
        (rf"keep the first {_N} tokens when context the overflows", ("prompt",)),
        (rf"exceeded max context length by {_N} tokens", ("excess",)),
        (rf"input length \(?{_N}\)? exceeds (?:the )?(?:model'?s? )?(?:maximum )?context length"
         rf" \(?{_N}", ("prompt", "limit")),
        (rf"input tokens exceed the configured limit of {_N} tokens", ("limit",)),
        (rf"prompt tokens \({_N}\) exceed model maximum \({_N}", ("prompt", "limit")),
        (rf"input length {_N} exceeds the maximum allowed input length of {_N}",
         ("prompt", "limit")),
        (rf"exceeded model token limit: {_N}(?: \(requested: {_N})?", ("limit", "total")),
        (rf"prompt token count of {_N} exceeds (?:the )?(?:limit|max(?:imum)? token count) of {_N}",
         ("prompt", "limit")),
        (rf"range of input length should be \[1, ?{_N}\]", ("limit",)),
        (rf"exceeds the model's maximum context length of {_N}", ("limit",)),
        (rf"size limit exceeded by {_N} tokens", ("excess",)),
        (rf"the limit for this model is {_N} tokens", ("limit",)),
        (rf"tokens in the prompt cannot exceed {_N} - received {_N}", ("limit", "prompt")),
        # "number of input tokens must be no more than 8192, got 28498" (YandexGPT)
        (rf"(?:input|prompt) tokens\b[^.]{{0,30}}?must (?:be )?(?:no more than|at most|not exceed"
         rf"|less than or equal to|<=?) {_N}\W{{1,4}}(?:got|received|given|but got) {_N}",
         ("limit", "prompt")),
        # "text length is 349354, which is outside the range (0, 100000]"
        (rf"length is {_N},? which is outside (?:of )?the (?:allowed |valid )?range "
         rf"[\[(]\d+, ?{_N}\]", ("prompt", "limit")),
        # "total number of tokens (prompt and prediction) cannot exceed N - received M"
        (rf"tokens\b[^.]{{0,60}}?cannot exceed {_N}(?: tokens)?\W{{1,4}}(?:received|got|but got"
         rf"|requested) {_N}", ("limit", "total")),
        (rf"current length is {_N} while limit is {_N}", ("total", "limit")),
        (rf"max(?:imum)? input length is {_N}", ("limit",)),
        (rf"input token limit (?:is|of) {_N}", ("limit",)),
        (rf"max input tokens: {_N}, request input token count: {_N}", ("limit", "prompt")),
        (rf"is too long and exceeds limit of {_N}", ("limit",)),
        (rf"n_ctx[\"']?\s*[:=]\s*{_N}(?![\d,.]|\s*>)", ("limit",)),
        (rf"n_prompt_tokens[\"']?\s*[:=]\s*{_N}", ("prompt",)),
        (rf"prompt \((?:length )?{_N}(?: tokens)?\) is (?:too long|longer than the maximum model "
         rf"length of {_N})", ("prompt", "limit")),
        # Families shared by several servers (SGLang, llama.cpp, Ollama, LM Studio, TGI forks):
        # "(N tokens) is longer than / exceeds / is larger than ... (M tokens)".
        (rf"\({_N}(?: tokens?)?\) (?:is )?(?:longer|larger|greater|more) than[^()]{{0,60}}?"
         rf"\({_N}(?: tokens?)?\)", ("prompt", "limit")),
        (rf"\({_N}(?: tokens?)?\) exceeds?[^()]{{0,60}}?\({_N}(?: tokens?)?\)",
         ("prompt", "limit")),
        # "a total of N tokens: P tokens from the input messages and O tokens for the completion"
        (rf"total of {_N} tokens:? {_N} tokens? (?:from|in) the (?:input|prompt|messages)"
         rf"[\w ]{{0,20}}? and {_N} tokens? (?:for|in) the (?:completion|output)",
         ("total", "prompt", "output")),
        # LM Studio / llama.cpp: "n_keep (P) >= n_ctx (L)", "(n_keep: P >= n_ctx: L)"
        (rf"n_keep\W{{0,3}}{_N}\W{{0,3}}>=?\s*n_ctx\W{{0,3}}{_N}", ("prompt", "limit")),
        (rf"{_N} tokens?,? but the (?:configured |available |loaded |model'?s? )?context "
         rf"(?:size|length|window) is {_N}", ("prompt", "limit")),
        (rf"truncation length:\s*{_N}", ("limit",)),
        (rf"input tokens length is {_N}\. output tokens length is {_N}\. range of total length "
         rf"should be less than or equal to {_N}", ("prompt", "output", "limit")),
        (rf"max(?:imum)? context length of [\w.:/-]+ is {_N}", ("limit",)),
        (rf"resulted in (?:over |about |at least )?{_N}", ("prompt",)),
        (rf"prompt length {_N} plus \w+ length {_N}", ("prompt", "output")),
        (rf"\w*prompt_len(?:gth)?`?\W{{0,3}}\(?{_N}", ("prompt",)),
        (rf"\({_N}/{_N} (?:prompt )?tokens\)", ("prompt", "limit")),
        (rf"\blimit={_N}", ("limit",)), (rf"\bprompt={_N}", ("prompt",)),
        (rf"(?:service|context|token|model|the) limit of {_N}", ("limit",)),
        (rf"\({_N} tokens?,? max(?:imum)?:? {_N}\)", ("prompt", "limit")),
        (rf"too long \({_N} tokens?\)", ("prompt",)),
        (rf"(?:length|size|tokens?) (?:is )?(?:greater|longer|larger|more) than {_N}", ("limit",)),
        # Generic shapes, consulted last. "P + O (= T) > L", "P plus max_tokens O cannot
        # exceed ... L": the prompt, the output, the total and the window.
        (rf"{_N}\)?\s*(?:\+|plus)\s*(?:max_tokens|max_new_tokens|max_completion_tokens|output"
         rf"|completion)?\W{{0,4}}{_N}\)?\s*(?:=\s*{_N}\s*)?(?:>|cannot exceed|exceeds?)"
         rf"[^\d]{{0,50}}?{_N}", ("prompt", "output", "total", "limit")),
        # "length P + O is greater than max_seq_len L", "(P + O) exceeds `session_len` (L)"
        (rf"{_N} ?\+ ?{_N}\)? (?:is (?:greater|larger|longer|more) than|exceeds?)\W{{0,3}}"
         rf"[a-z_ ]{{0,30}}?\W{{0,3}}\(?{_N}", ("prompt", "output", "limit")),
        (rf"max(?:imum)? tokens of {_N} (?:exceeded|reached)", ("limit",)),
        (rf"max(?:imum)? input context length \(?{_N}", ("limit",)),
        (rf"{_N} tokens? ?> ?{_N} (?:limit|max(?:imum)?)\b", ("prompt", "limit")),
        (rf"you requested ~{_N} tokens \({_N} input \+ {_N} output\)",
         ("total", "prompt", "output")),
        # "exceed the 60000 token context window ... (projected 72534 tokens ... a 65536 token
        # completion budget)", "the prompt's 430 tokens plus the 8192-token reply budget"
        (rf"{_N}[- ]token context (?:window|length|size)", ("limit",)),
        (rf"projected {_N} tokens", ("total",)),
        (rf"{_N}[- ]token (?:completion|reply|output|response) budget", ("output",)),
        (rf"{_N} tokens? plus (?:the |a )?{_N}[- ]token", ("prompt", "output")),
        (rf"has {_N} tokens?,? max\b[^.\d]{{0,30}}? is {_N}", ("prompt", "limit")),
        (rf"positions? >= ?{_N},? but got position {_N}", ("limit", "prompt")),
        (rf"up to {_N} tokens\. {_N} is passed", ("limit", "prompt")),
        (rf"max(?:imum)? context\W{{1,3}}{_N}", ("limit",)),
        (rf"dimension size \(?{_N}", ("limit",)),
        (rf"total cache allocated is [\d *]+= ?{_N}", ("limit",)),
        # TensorRT-LLM: the cache's length dimension against the engine profile's maximum
        (rf"past_key_value\w* with shape torch\.size\(\[(?:\d+, ){{3}}{_N}, \d+\]\), engine "
         rf"supports \[min, opt, max\] = \[.*?\((?:\d+, ){{3}}{_N}, \d+\)\]\)?$",
         ("prompt", "limit")),
        # a client's own report: "contextLength: 8192 ... max output tokens: 4096"
        (rf"\bcontextlength\W{{1,3}}{_N}", ("limit",)),
        (rf"max(?:imum)? output tokens\W{{1,3}}{_N}", ("output",)),
        # "info: N / M", "More info: N / M" (a count over its limit, in a client's own error)
        (rf"info\W{{1,4}}{_N} ?/ ?{_N}", ("prompt", "limit")),
        # "N (input tokens|cache tokens|tokens in total)? (>|exceeds|larger than|must be
        # smaller than) (the ... window|limit)? (of|is)? M": what was asked, then the window
        (rf"{_N}(?:\s+[a-z]+)?(?:\s+tokens?)?(?:\s+in total)?\)?,?(?:\s*which)?\s*(?:>=?|exceeds?"
         rf"|exceeded|(?:has|have) exceeded|is (?:larger|greater|more|longer) than"
         rf"|(?:larger|greater|more|longer) than"
         rf"|must be (?:smaller|less) than(?: or equal to)?)\s*(?:the\s+)?(?:[a-z_'-]+\s+){{0,5}}?"
         rf"(?:of\s+|is\s+|:\s*)?\(?{_N}", ("prompt", "limit")),
        # a window named, then its figure: "context window is 2048", "max token limit (16384"
        # (a "maximum length" alone is not one: "a string with maximum length 10485760")
        (rf"(?:context[ _](?:length|window|size|limit)|max(?:imum)? (?:token|input|sequence"
         rf"|context|model) (?:length|limit|size|window)(?: limit)?|input length limit"
         rf"|max_seq_len|max_model_len|max_num_tokens|max_prompt_tokens)(?: of| is"
         rf"| for this model)?\s*[:=]?\s*\(?{_N}",
         ("limit",)),
        # what was asked: "the prompt is 3000 tokens", "Prompt length 40000", "input (33000)"
        (rf"(?:prompt|input|request(?:ed)?(?: input| prompt)?)(?: sequence)?(?: length| size"
         rf"| token count)?(?: is| of| has| contains(?: at least)?|:)?\s*\(?{_N}", ("prompt",)),
    )
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
    r"^\W*(?:error:?\s*)?([1-5]\d\d)\b|(?:error code|status(?:[ _]?code)?|http)\W{0,3}([1-5]\d\d)\b"
    r"|error \(([1-5]\d\d)\)",
    re.IGNORECASE,
)
ESCAPES = re.compile(r"\\+([\"'`])|\\u00(?:27|22|3[ce]|26)|\\[nrt]", re.IGNORECASE)
"""Escapes of texts quoted inside JSON strings: quotes, "<", ">" and "&" as JSON encoders write
them (``\\u003e``), and whitespace."""
UNICODE_ESCAPES = {"27": "'", "22": '"', "3c": "<", "3e": ">", "26": "&"}
STATUS_KEYS = frozenset({"status_code", "status", "code", "http_status", "httpstatuscode",
                          "statuscode", "status_int"})
