"""Where an overflow error states its numbers: the window, the prompt, the output, the total.

Moved out of ``shared.core.overflow_patterns`` (which decides *what* an error is) when that
module outgrew ~550 lines, and apart because the two are consulted at different times: the
phrase families on every ``classify_error``, these shapes only by ``parse_overflow`` once a
text is known to be an overflow. The shapes are read in order, the specific ones (a
provider's own sentence) before the generic ones (a comparison, a window named then its
figure), and the first value found for a field wins; the shapes of other languages
(``shared.core.overflow_languages.NUMBERS``) follow these.
"""

from __future__ import annotations

import re

# A token count: thousands separators allowed, or a k / M suffix ("128k", "1.5M"; read by
# shared.core.overflow.stated_count as 128,000 and 1,500,000).
_N = r"(\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?[kKmM]\b|\d+)"

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
        # "... maximum sequence length for this model (131072 > 2048)": the count, then the limit
        (rf"\({_N} ?> ?{_N}\)", ("prompt", "limit")),
        (rf"max(?:imum)? (?:context|prompt) length:? (?:is |of )?{_N}", ("limit",)),
        (rf"context length (?:is |of )?only {_N}", ("limit",)),
        (rf"you passed {_N} input tokens and requested {_N} output tokens", ("prompt", "output")),
        (rf"max(?:imum)? (?:supported |allowed )?sequence length(?: for this model)? "
         rf"(?:is )?(?:just |only )?\(?{_N}", ("limit",)),
        (rf"(?:prompt|text|input|request|messages?|conversation) (?:is|was) {_N} tokens long",
         ("prompt",)),
        # "Input length of input_ids is `4498` and exceed max_sequence_length: `4096`"
        (rf"(?:input|prompt) length(?: of [\w`]+)? is\W{{0,2}}{_N}\W{{0,2}},? (?:and|which|but) "
         rf"exceeds? (?:the )?[\w ]{{0,30}}?\W{{0,3}}{_N}", ("prompt", "limit")),
        # a server truncating the prompt to its window ("limit=4096 prompt=10128", Ollama)
        (rf"truncating (?:the )?input\b.{{0,40}}?\blimit\W{{0,3}}{_N}\W{{1,3}}prompt\W{{0,3}}{_N}",
         ("limit", "prompt")),
        (rf"must (?:have|contain|be) (?:less|fewer) than {_N} tokens", ("limit",)),
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
        # input besides the messages ("4729 of tool input", "730 in the functions"): the prompt
        # is then what the total counted but the output
        (rf"{_N} (?:of|in|for) (?:the )?(?:tool|function)s?(?: input| definitions?| schemas?)?\b",
         ("other_input",)),
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
        # a rule the input broke, then its count: "cannot exceed 8194 tokens. 8746 tokens given"
        (rf"(?:cannot|can't|can not|must not|may not|should not) exceed {_N} tokens?\W{{1,4}}{_N}"
         rf" tokens? (?:were |was )?(?:given|provided|received|supplied|passed|sent|found)",
         ("limit", "prompt")),
        (rf"(?:number|count) of (?:input|prompt) tokens\s*[:=]\s*{_N}", ("prompt",)),
        # one input of several over its cap: "input 3 has 9120 tokens" (3 is its index), the cap
        # stated as a rule ("must not exceed 8192 tokens")
        (rf"\b(?:input|text|document|item|chunk|string)\s?(?:#|\[)?\d+\]? (?:has|contains|is) {_N}"
         rf" tokens", ("prompt",)),
        (rf"(?:cannot|can't|can not|must not|may not|should not) exceed {_N} tokens", ("limit",)),
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
        # what the request needs or asked, in the provider's words: "answering your request will
        # take N tokens", "this request needs N tokens", "about N tokens were requested"
        (rf"(?:will|would) (?:take|require|need|use|consume) (?:about |around |approximately "
         rf"|roughly |~)?{_N} tokens", ("total",)),
        (rf"\b(?:requires|needs|required|needed) (?:about |around |approximately |roughly |~"
         rf"|at least )?{_N} tokens", ("total",)),
        (rf"{_N} tokens (?:were|was|have been|are|is) (?:requested|needed|required)", ("total",)),
        (rf"(?:required|requested|needed) tokens\W{{1,3}}{_N}", ("total",)),  # "Required Tokens: N"
        # "prefill 744 tokens exceed n_ctx_per_seq": the prompt, before a verb
        (rf"(?:prefill|prompt|input)(?: of)? {_N} tokens? (?:exceeds?|exceeded|>|is (?:more|larger"
         rf"|greater|longer) than)", ("prompt",)),
        # "~214381 tokens (limit 200000)", "9000 tokens (max 8192)"
        (rf"{_N} tokens?\s*\((?:limit|max(?:imum)?|context(?: window)?|window)\W{{0,3}}{_N}\)",
         ("prompt", "limit")),
        # "exceeds max token count (5910 / 4095)": a count over its limit after a comparison
        (rf"(?:exceed\w*|over|>)[^()]{{0,60}}?\(\s*{_N}\s*/\s*{_N}\s*(?:tokens?)?\)",
         ("prompt", "limit")),
        # the limit, then what was asked in parentheses under any label but another maximum:
        # "limit: 262144 (requested: 269030)", "(actual: N)", "(got N)" (a label broken by a
        # terminal's wrap too: "(re quested: 269030)")
        (rf"\blimit\W{{1,3}}{_N}\s*\((?!max|min|limit)[a-z][a-z ]{{0,15}}\W{{1,3}}{_N}\)",
         ("limit", "total")),
        # "Input too long: 518063 input tokens, limit is 262144": a count of input tokens after a
        # colon or a verb (not "max 8192 input tokens"), and a limit or maximum stated as such
        # ("... were requested but the maximum is 200,000")
        (rf"(?:[:(,]|\b(?:got|has|have|with|contains|sent|submitted|provided|received))\s*~?{_N}"
         rf" (?:input|prompt) tokens\b", ("prompt",)),
        (rf"\b(?:limit|max(?:imum)?)(?: allowed| supported)?(?: is| was|:)\s*{_N}", ("limit",)),
        # a log's field naming the window: "model_context_window_tokens=Some(121600)"
        (rf"context[ _]?(?:length|window|size|limit)(?:[ _](?:tokens|size))?\s*[:=]\s*"
         rf"(?:some\(|optional\[)?{_N}", ("limit",)),
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
        # "9,120 tokens > 8,192." (a count against the window, no word after it)
        (rf"{_N} tokens? ?> ?{_N}(?![\d.,]*\s?(?:tokens? )?(?:per|/|tpm|rpm))",
         ("prompt", "limit")),
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
         rf"| token count)?(?: is| of| has| contains(?: at least)?|:)?\s*\(?~?{_N}", ("prompt",)),
    )
)
