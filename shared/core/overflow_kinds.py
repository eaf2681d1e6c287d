"""The verdicts on English error texts that are not overflows, as compiled phrase families.

Moved out of ``shared.core.overflow_patterns`` when that module outgrew ~550 lines (batch 15).
``shared.core.overflow`` consults these after the overflow wording and the request-body sizes,
in the order of its docstring: a file over an upload endpoint's own cap, a parameter conflict or
a mode the request must use, a response of the wrong shape (the three name no kind), an output
limit, auth, a content filter, an overloaded server, a server or network fault and, last, a
limit that is not the model's (a chat platform's message cap, an agent's loop: no kind). Their
namesakes in other languages are in ``shared.core.overflow_language_kinds``.
"""

from __future__ import annotations

from shared.core.overflow_patterns import _Q, Gated, _rx

# Two parameters that may not be combined: a malformed request, whatever they are about.
PARAMETER_CONFLICT = Gated(None, (("cannot", "mutually"), _rx(
    r"cannot be (?:set|specified|used) (?:at the same time|together)", r"mutually exclusive",
    r"cannot both be (?:set|specified)")),
    # a mode the request must use ("Streaming is required for operations that may take longer
    # than 10 minutes", "only supports stream mode"): the call's shape, not its size
    (("streaming is", "stream mode is", "use stream", "enable stream", "support stream",
      "supports stream"), _rx(
        r"stream(?:ing)? (?:mode )?is (?:strongly )?(?:recommended|required) for",
        r"(?:must|please) (?:use|enable) stream(?:ing)?\b",
        r"only supports? stream(?:ing)?(?: mode)?\b")))
# A file over an upload endpoint's own cap ("File is too large." from the Files API, "The upload
# exceeds the maximum request size."): one file's size, not a conversation compaction can shrink.
FILE_UPLOAD = Gated(None, (("file", "upload"), _rx(
    r"(?<![\w.-])(?:uploaded )?file (?:is |was )?too (?:large|big)\b",
    r"\b(?:file )?upload (?:exceeds|exceeded|is too (?:large|big)|was too (?:large|big))")))
# A client's check of a response's shape that failed ("expected exactly one compaction output
# item, got 0"): neither a server fault nor a size, whatever the client prefixes it with.
UNEXPECTED_RESPONSE = Gated(None, (("expected",), _rx(
    r"expected (?:exactly |at least |at most )?(?:one|an?|\d+) [\w ]{1,40}?,? (?:but )?(?:got"
    r"|received|found) \d+")))
# A limit that is not the model's (batch 16): a chat platform's own cap on the message a bot
# posts ("Telegram server says - Bad Request: message is too long", Discord's
# "BASE_TYPE_MAX_LENGTH: Must be 2000 or fewer in length"), an agent's loop ("Maximum iterations
# exceeded"), a program's call stack, an app's warning about what it stores locally ("This
# conversation data is too large ... may cause the application to crash or lag").
NOT_THE_MODEL = Gated(None, (("telegram", "discord", "slack", "whatsapp"), _rx(
    r"\b(?:telegram|discord|slack|whatsapp)\b.{0,60}?\b(?:message|text|content|caption|reply"
    r"|answer)s?(?: text)? (?:is |was )?too long\b",
    r"\b(?:message|text|caption)s?(?: is| was)? too long\b.{0,40}?\b(?:for|by) (?:telegram|discord"
    r"|slack|whatsapp)\b")),
    (("max_length", "or fewer in length"), _rx(
        r"base_type_max_length", r"must be \d+ or fewer in length")),
    (("iteration", "call stack", "recursion", "steps", "loops"), _rx(
        r"max(?:imum)? (?:number of )?(?:iterations|steps|loops|turns)\b.{0,20}?"
        r"(?:exceeded|reached)",
        r"(?:iteration|recursion|step) limit\b.{0,20}?(?:exceeded|reached)",
        r"max(?:imum)? (?:call stack|recursion depth)\b.{0,20}?(?:exceeded|reached)")),
    # a web app's abuse check ("Our systems have detected unusual activity from your system")
    (("unusual activity", "suspicious activity"), _rx(
        r"(?:detected|noticed|seen) (?:unusual|suspicious) activity")),
    (("crash", "freeze", "local storage"), _rx(
        r"(?:may|might|could|can|will) (?:cause|make) (?:the )?(?:app(?:lication)?|client|browser"
        r"|ui|page|device)\b.{0,10}?(?:to )?(?:crash|lag|freeze|slow down)",
        r"local ?storage\b.{0,40}?(?:full|exceeded|limit)")))
_OUTPUT_LIMIT = _rx(
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
    r"(?:reached|hit|exceeded|exceeds) (?:its|the) (?:[\d,.]+k? ?)?(?:max(?:imum)? )?output"
    r"(?:[ -]?tokens?)? (?:limit|maximum|max|cap)\b",
    r"for the (?:content )?length reason", r"max_?tokens\W{0,3}(?:is )?invalid\b",
    r"did not \w+ a final (?:response|output)",  # the Agents SDK (JS), its typo included
    r"finish_?reason\W{0,5}(?:max_tokens|max_output_tokens|length)\b",
    r"before any (?:response|output|content|text) was generated",
    r"increase (?:the )?\W?(?:max_tokens|max_output_tokens|max_completion_tokens)\b",
    # "token length('150') exceeded. Increase maximum token to avoid the issue."
    r"increas\w* (?:the |your )?max(?:imum)? ?tokens?\b(?! (?:context|window|input|prompt))",
    rf"{_Q}(?:max_tokens|max_completion_tokens|max_output_tokens|maxoutputtokens|max_new_tokens"
    rf"|num_predict|max(?:imum)? output tokens){_Q}(?: value)?\b.{{0,80}}(?:too large|too big"
    r"|above maximum|exceed|greater than|(?:must|should) be (?:less|<|smaller|at most|under"
    r"|below|lower)|less (?:than )?or equal"
    r"|supported range"
    r"|valid range|out of range|not valid)",
)
# N output tokens asked against the model's maximum ("requested 200000 output tokens, model
# maximum 65536").
OUTPUT_LIMIT = Gated(_OUTPUT_LIMIT, (("output token", "output-token"), _rx(
    r"requested \d[\d,]* output[- ]tokens\b.{0,40}?\b(?:max(?:imum)?|limit)\b")),
    # a reply cut short by its cap ("Tool calls cutoff by max_tokens", "The output is incomplete
    # due to a max_tokens length limit"): what was generated, not what was sent
    (("cut off", "cutoff", "cut short", "incomplete", "stopped", "interrupted"), _rx(
        r"\b(?:response|output|reply|answer|completion|generation|tool[ _]?calls?|result)s?\b"
        r".{0,20}?(?:cut ?off|cut short|incomplete|stopped|interrupted)\b.{0,12}?\b(?:by|at"
        r"|due to|because of) (?:the |a |an |its )?\W?(?:max_tokens|max_output_tokens"
        r"|max_completion_tokens|max_new_tokens|max(?:imum)? (?:output )?tokens|(?:output|length"
        r"|token) limit)")),
)
_AUTH = _rx(
    r"\bunauthori[sz]ed\b", r"\bunauthenticated\b", r"authentication", r"\bnot authori[sz]ed\b",
    r"invalid[_ -]?(?:api[_ -]?)?key", r"incorrect api key", r"api key not valid",
    r"invalid x-api-key", r"permission[_ ]denied", r"\bforbidden\b", r"access ?denied",
    r"unrecognizedclient", r"security token included in the request is invalid",
    r"(?:expired|invalid) (?:access |bearer )?token\b(?! count)", r"token (?:has )?expired",
    r"api key (?:expired|invalid|missing|required)", r"(?:provide|missing|no) an? api key",
    r"you have been blocked",  # a firewall's page
    r"(?:invalid|incorrect|bad|missing|no) (?:api )?credentials\b",  # "... in Authorization header"
)
AUTH = Gated(_AUTH, (("key",), _rx(  # a key the client never set ("ANTHROPIC_API_KEY is not set")
    r"api[_ -]?key\W{0,3}(?:is |was )?(?:not (?:set|configured|provided)|unset|empty)\b")))
_CONTENT_FILTER = _rx(
    r"content[_ ]filter", r"content[_ ]management[_ ]polic", r"content[_ ]polic(?:y|ies)",
    r"responsibleaipolicyviolation", r"safety system", r"flagged as potentially violating",
    r"usage polic(?:y|ies)", r"blocked by (?:the |our )?(?:safety|guardrail|content)",
    r"prohibited content", r"guardrail intervened", r"inappropriate content",
    r"data[_ ]inspection[_ ]failed", r"content exists risk",
    r"blocked (?:due to|because of|for)\W{0,2}(?:\w+\W{1,3})?(?:safety|policy|content)",
)
CONTENT_FILTER = Gated(_CONTENT_FILTER, (
    ("blocked", "feedback", "reason", "injection", "jailbreak", "safety"), _rx(
        # Gemini's verdict on the prompt ("Check the `response.prompt_feedback` to see if the
        # prompt was blocked", "blockReason: SAFETY"); a prompt injection refused
        r"prompt_?feedback", r"safety_?ratings", r"(?:by|for|due to|because of) (?:the )?safety "
        r"reasons?\b", r"\bcontent (?:was |is |has been )?blocked\b",
        r"(?:prompt|message|input|candidate|response|output|reply)s? (?:was |is |has been "
        r"|is being |were |got )blocked\b", r"block_?reason\W{0,5}(?:safety|prohibited|blocklist)",
        r"prompt injection|jailbreak")))
OVERLOADED = _rx(r"\boverloaded", r"model ?not ?ready", r"currently loading", r"high demand",
                  r"too busy", r"loading (?:the )?model\b", r"no (?:available |free )?slots?"
                  r" (?:is |are )?(?:available|found|left)",
                  r"servers? (?:is |are )?busy")  # Ollama: "server busy, please try again"
_SERVER = _rx(
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
SERVER = Gated(_SERVER, (("unstable", "not respond"), _rx(
    r"network (?:is |was )?unstable", r"server (?:is |was )?not responding")),
    # a local runtime that cannot allocate its buffers, its KV cache or its context at load
    # ("failed to allocate buffer for kv cache", "requires more system memory (5.0 GiB) than is
    # available"): memory, not the request
    (("alloc", "memory", "create context", "create llama"), _rx(
        r"failed to allocate\b", r"\bc(?:uda|l)?malloc failed", r"kv_cache_init\W{0,4}failed",
        r"failed to (?:create|initiali[sz]e|init) (?:the )?(?:llama[_ ]?)?context\b",
        r"requires? more (?:\w+ )?(?:memory|v?ram)\b.{0,30}?than (?:is )?available",
        r"not enough (?:\w+ )?(?:memory|v?ram)\b")),
)
