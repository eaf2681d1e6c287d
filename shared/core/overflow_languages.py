"""Provider and app error texts in languages other than English, as compiled phrase families.

Chat apps, gateways and regional providers show the same refusals translated (LobeChat,
Chatbox, Jan, LibreChat and Roo Code locales, Chinese and Korean gateways): the context
window exceeded, a file over its size limit, a quota, a rate limit. They live apart from the
English families of ``shared.core.overflow_patterns`` so that English errors, most of what
the classifier reads, never pay for them: ``shared.core.overflow`` reads a text that has
letters beyond ASCII with each English family and then this family's part written in those
letters' scripts (CJK, Cyrillic, Arabic, Latin with accents), and an ASCII text only when no
English wording recognised it and it names a word of these languages (``maybe_accentless``:
Italian, Indonesian or Dutch need no accents). The decisions keep the English order: tool
pairing, capacity, quota, rate, a setting's own cap, overflow, payload, the rest, then
generic wording.

Each family names a concept, not a sentence: a subject (context, conversation, input, tokens,
file size) with a verb (exceed, too long, full, reach) per language, in either order.
Chinese (traditional read through a map to the simplified forms), Japanese, Korean, Russian,
Ukrainian, German, French, Italian, Spanish, Portuguese, Dutch, Indonesian, Vietnamese, Turkish,
Polish, Arabic, Persian (batch 16), Hebrew and Thai are covered. The verdicts that are not
overflows (quota, rate, auth...) are in ``shared.core.overflow_language_kinds``.
"""

# Words of other scripts look like Latin letters to ruff (Cyrillic "о", Turkish "ı"): they are
# the point of this module.
# ruff: noqa: RUF001, RUF003
from __future__ import annotations

import re

from shared.core.overflow_numbers import _N

_C = r"[:\uff1a]"  # a colon, ASCII or full-width
# The letters of each script a family is written in. "latin" is any Latin letter beyond ASCII
# (accents, Vietnamese, Turkish, Polish); the Latin-script wording of a family is also read on
# an ASCII text that nothing English recognised (Italian or Indonesian need no accents).
_LETTERS = {
    "cjk": re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]"),
    "cyrillic": re.compile(r"[\u0400-\u04ff]"),
    "arabic": re.compile(r"[\u0600-\u06ff]"),
    "latin": re.compile(r"[\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]"),
    "hebrew": re.compile(r"[\u05d0-\u05ea]"),
    "thai": re.compile(r"[\u0e01-\u0e5b]"),
}
SCRIPTS = frozenset(_LETTERS)
_ANY_LETTER = re.compile("|".join(p.pattern for p in _LETTERS.values()))

# Traditional Chinese read by the simplified families: the characters their words use, mapped
# to their simplified forms (a text with kana is Japanese, whose kanji keep the older forms).
_TRADITIONAL = str.maketrans(
    "長過額請頻餘內對話輸體圖數個試錯誤載負務權證驗審違規費記錄應單滿處詞傳積歷會僅納範圍達經"
    "憶庫儲刪舊於並發時調顯網絡異連敗斷鑒鑑認絕訪問無確鑰斷響參稱標題預給為當實際檔訊視窗額"
    "區間總節點風險檢測攔遮蔽濾違礙擁擠過載負荷啟動",
    "长过额请频余内对话输体图数个试错误载负务权证验审违规费记录应单满处词传积历会仅纳范围达经"
    "忆库储删旧于并发时调显网络异连败断鉴鉴认绝访问无确钥断响参称标题预给为当实际档讯视窗额"
    "区间总节点风险检测拦遮蔽滤违碍拥挤过载负荷启动")
_KANA = re.compile(r"[\u3040-\u30ff]")


def simplified(text: str) -> str:
    """``text`` with the traditional Chinese characters the families use in their simplified
    forms; a text without CJK letters, or with kana (Japanese), unchanged."""
    if _KANA.search(text) or not _LETTERS["cjk"].search(text):
        return text
    return text.translate(_TRADITIONAL)


Family = dict[str, re.Pattern[str]]
"""A phrase family split by script: a text is searched only with its own scripts' parts."""


def scripts(text: str) -> frozenset[str]:
    """The scripts of the letters in ``text`` that the families here are written in (none for
    English, even with curly quotes, dashes or emoji)."""
    return frozenset(name for name, letters in _LETTERS.items() if letters.search(text))


def _script_of(part: str) -> str:
    letter = _ANY_LETTER.search(part)  # the first letter beyond ASCII names the script
    return next((name for name, letters in _LETTERS.items() if letter and letters.match(
        letter.group(0))), "latin")


# Every overflow and payload wording of the "latin" parts below names one of these words
# (tests/test_overflow_languages.py keeps it so), and so do the commonest allowances: an ASCII
# text with none of them cannot be an overflow in those languages, and is not read again.
ACCENTLESS_WORDS = ("contest", "contexto", "contextvenster", "konteks", "supera", "eccede",
                    "oltrepass", "excede", "excedi", "sobrepasa", "ultrapass", "troppo", "troppi",
                    "demasiad", "muito", "demais", "overschr", "te lang", "te groot", "te veel",
                    "melebihi", "terlalu", "zu viele", "zu lang", "kontext", "erreicht",
                    "przekr", "trop ", "kontingent", "guthaben", "cuota", "kuota", "saldo",
                    "tegoed", "quotum", "credito", "kredit", "melampaui", "dlug", "kontekst",
                    "miesci", "filtr", "contexte", "waktu", "esgotad", "scadut")
# English words no other language written in Latin letters here uses.
_ENGLISH_WORD = re.compile(r"\b(?:the|and|your|please|with|this|that)\b", re.IGNORECASE)


def maybe_accentless(text: str) -> bool:
    """Whether an ASCII ``text`` may state an overflow in a Latin-script language written
    without accents (Italian, Indonesian, Dutch...): it names one of ``ACCENTLESS_WORDS`` and
    none of a few common English words."""
    lowered = text.lower()
    return any(word in lowered for word in ACCENTLESS_WORDS) \
        and _ENGLISH_WORD.search(text) is None


def _rx(*parts: str) -> Family:
    groups: dict[str, list[str]] = {}
    for part in parts:
        groups.setdefault(_script_of(part), []).append(f"(?:{part})")
    return {name: re.compile("|".join(alts), re.IGNORECASE) for name, alts in groups.items()}


def _whole(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)


# A setting's own cap stated as a rule with no measured count ("コンテキストの長さは10000000を
# 超えることはできません": a settings form), not a refused request.
_NO_COUNT_AFTER = (r"(?![^.。!]{0,40}?(?:当前|实际|現在|현재|текущ|сейчас|aktuell|actuel|actual"
                   r"|atual))")
NOT_A_REQUEST = _rx(
    r"(?:上下文|コンテキスト|컨텍스트)\S{0,6}?(?:不能|不可|不得)(?:超过|大于|高于)\s?\d+"
    + _NO_COUNT_AFTER,
    r"(?:コンテキスト|最大トークン)\S{0,10}?(?:は|が)\s?[\d,]+\s?(?:トークン)?を?超えることはできません",
    r"(?:컨텍스트|최대 토큰)\s?(?:길이|크기|창)?\S{0,2}\s?[\d,]+\s?(?:토큰)?\S{0,2}\s?초과할 수 없"
    + _NO_COUNT_AFTER,
    r"(?:длин\w*|размер\w*|окн\w*) контекста\b.{0,10}?не (?:может|должн\w*) превышать"
    + _NO_COUNT_AFTER,
    r"Kontext(?:länge|größe|fenster)\b.{0,30}?(?:darf|kann)\b.{0,20}?nicht (?:überschreiten|größer)"
    + _NO_COUNT_AFTER,
    r"(?:longueur|taille|fenêtre) (?:du|de) contexte\b.{0,20}?ne (?:peut|doit) pas"
    + _NO_COUNT_AFTER,
    r"(?:longitud|tamaño|ventana) (?:del|de) contexto\b.{0,20}?no (?:puede|debe)"
    + _NO_COUNT_AFTER,
    r"(?:comprimento|tamanho|janela) (?:do|de) contexto\b.{0,20}?não (?:pode|deve)"
    + _NO_COUNT_AFTER,
    r"(?:lunghezza|dimensione|finestra) (?:del|di) contesto\b.{0,20}?non (?:può|deve)"
    + _NO_COUNT_AFTER,
)
# The conversation over the model's window: a subject (context, conversation, input, tokens)
# and a verb (exceed, too long, full, reach a limit), language by language.
OVERFLOW_STRONG = _rx(
    # Chinese: "输入内容过长", "上下文长度超出模型限制", "对话历史过长导致上下文溢出",
    # "上下文窗口已满", "模型的上下文窗口仅能容纳 8192"
    r"(?:输入|提示词?|上下文|请求|消息)(?:内容|文本)?(?:长度)?(?:过长|太长|超长|超过|超出|超限)",
    r"超(?:过|出)了?(?:模型|可用)?(?:的)?(?:最大)?(?:上下文|长度|token)", r"超过了?(?:上下文)?窗口",
    r"内容(?:长度)?(?:过长|太长|超长)", r"(?:请求|内容|消息|输入)(?:内容)?(?:过大|太大)",
    r"\b(?:prompt|input|context|tokens?|text)\s*(?:过长|太长|超长)",
    r"(?:token|词元)s? ?(?:数量|数|长度)?\s?(?:[(\uff08]\s?[\d,]+\s?[)\uff09])?\s?(?:超过|超出)了?"
    r"(?:模型|可用)?(?:的)?(?:上限|限制|最大)",
    r"(?:对话|会话|聊天)(?:历史|记录|内容)?(?:已经?)?(?:过长|太长|超长)",
    r"上下文(?:窗口)?(?:已经?)?(?:溢出|已满|满了)",
    r"(?:上下文|窗口)\S{0,6}?(?:仅|只)(?:能|可)?(?:容纳|支持|处理|接受)",
    r"(?:超出|超过)了?\S{0,6}?可(?:处理|容纳|支持|接受)的(?:最大)?(?:长度|上限|范围)",
    # Japanese: "コンテキスト制限を超えました", "処理できる長さを超えています"
    r"(?:コンテキスト|文脈)(?:ウィンドウ|長|の長さ|サイズ)?の?(?:制限|上限|最大(?:長|値)?)?"
    r"(?:を|が)?(?:超え|超過|オーバー)",
    r"(?:コンテキスト|文脈)\S{0,10}?(?:いっぱい|満杯|溢れ|あふれ|オーバーフロー|に収まりません)",
    r"処理できる\S{0,6}?(?:長さ|トークン数|サイズ|上限|量|範囲)を(?:超え|超過)",
    r"(?:入力|プロンプト|リクエスト|メッセージ|会話|内容|テキスト)\S{0,4}?(?:が|は)?長すぎ",
    r"トークン数?[^。]{0,30}?(?:上限|制限|最大(?:数|値)?)[^。]{0,15}?(?:超え|超過|達し)",
    # Korean: "컨텍스트 크기 제한을 초과했습니다", "처리할 수 있는 길이를 초과했습니다"
    r"컨텍스트\s?(?:창|윈도우|길이|크기)?\S{0,2}\s?(?:(?:제한|한도|한계|최대치?)\S{0,2}\s?)?"
    r"(?:초과|넘었|넘어)",
    r"컨텍스트\s?(?:창|윈도우)?\S{0,2}\s?(?:가득|꽉)",
    r"처리할 수 있는\s?(?:최대\s?)?(?:길이|토큰\s?수|크기|범위|양)\S{0,2}\s?(?:초과|넘)",
    r"(?:입력|프롬프트|요청|메시지|대화|내용|텍스트)\S{0,2}\s?너무 (?:깁니다|길어|길)",
    r"(?:최대\s?)?토큰\s?(?:수|한도|제한)\S{0,2}\s?(?:(?:제한|한도)\S{0,2}\s?)?(?:초과|넘)",
    # Russian: "превышает длину, которую модель может обработать", "превышает ограничение по
    # токенам", "количество токенов ... слишком велико"
    r"превыш\w*\s(?:(?:максимальн|допустим|установленн)\w*\s)?(?:длин\w*|контекст\w*"
    r"|(?:лимит|ограничени|предел)\w*\s(?:(?:по|на|в)\s)?(?:(?:количеств|числ)\w*\s)?"
    r"(?:токен|контекст|длин)\w*|(?:размер|окн)\w*\sконтекст\w*|(?:количеств|числ)\w*\sтокен\w*)",
    r"(?:количеств|числ)\w*\sтокенов\b.{0,60}?(?:слишком велик|превыша)",
    r"(?:контекст\w*|окн\w* контекста)\b.{0,30}?(?:переполн|превыш|заполнен|исчерпан|слишком"
    r" (?:длинн|велик|мал\w* для))", r"исчерпа\w*\s(?:\w+\s)?(?:окн\w* )?контекст",
    r"(?:запрос|сообщени|ввод|промпт|диалог|разговор|бесед|текст)\w*\b.{0,20}?слишком длинн\w*",
    r"не (?:помещается|вмещается|умещается|влезает) в (?:контекст|окно)",
    r"(?:контекст|запрос|диалог|промпт|истори|разговор|бесед)\w*\b.{0,20}?не (?:помещается"
    r"|вмещается|умещается|влезает)",
    r"больше\s(?:чем\s)?(?:максимальн\w*\s)?(?:(?:размер|длин|окн)\w*\s)?контекст",
    # German: "Kontextfenster überschritten", "überschreitet die maximale Kontextlänge",
    # "Dieser Chat erreicht das KI Speicher Limit"
    r"(?:Kontext|Token)\w*\b.{0,40}?(?:überschritten|überschreitet|übersteigt|ist voll|zu lang"
    r"|zu groß)",
    r"(?:überschreitet|überschritten|übersteigt|überstiegen)\b.{0,30}?(?:Kontext|Token)",
    r"(?:Chat|Konversation|Unterhaltung|Gespräch|Verlauf)\w*\s(?:erreicht|überschreitet|hat)\b"
    r".{0,30}?(?:Limit|Grenze)", r"(?:Eingabe|Anfrage|Nachricht|Prompt|Konversation|Unterhaltung"
    r"|Gespräch|Text)\w*\b.{0,20}?\bzu lang\b", r"passt nicht (?:mehr )?in (?:das |den )?Kontext",
    # French, Italian, Spanish, Portuguese: exceed + context / length / tokens; context + too
    # long / full; input / request / conversation + too long
    r"(?:dépasse|dépassé|excède|dépassement)\w*\b.{0,30}?(?:contexte|longueur|tokens?|jetons?)\b",
    r"(?:contexte|tokens?|jetons?)\b.{0,40}?(?:dépasse|excède)",
    r"contexte\b.{0,30}?(?:trop long|dépass|plein|saturé)",
    r"(?:requête|message|entrée|invite|prompt|conversation|contenu|texte)s?\b.{0,20}?"
    r"trop longu?e?s?\b",
    r"(?:superat|supera|eccede|ecceduto|oltrepassa)\w*\b.{0,30}?(?:contesto|lunghezza|token)",
    r"(?:contesto|token)\b.{0,40}?(?:superat|supera|eccede|oltrepassa)",
    r"contesto\b.{0,30}?(?:troppo lung|superat|pieno)",
    r"(?:richiesta|messaggio|input|conversazione|prompt|testo|contenuto)\b.{0,20}?troppo lung",
    r"(?:contexto|tokens?)\b.{0,40}?(?:excede|supera|sobrepasa|ultrapass)",
    r"(?:excede|supera|sobrepasa|excedi|ultrapass)\w*\b.{0,30}?(?:contexto|longitud|comprimento"
    r"|tokens?)\b",
    r"contexto\b.{0,30}?(?:demasiado larg|muito long|excedid|superad|ultrapassad|llen|chei)",
    r"(?:solicitud|petición|mensaje|entrada|conversación|solicitação|requisição|mensagem|conversa"
    r"|prompt|contenido|conteúdo|texto)\b.{0,20}?(?:demasiado larg|muito long)",
    # Dutch, Indonesian (often plain ASCII: reached through the fallback)
    r"(?:overschrijdt|overschreden|overschrijding)\b.{0,30}?(?:context|tokens?|lengte)",
    r"(?:context\w*|tokens?)\b.{0,40}?(?:overschrijdt|overschreden)",
    r"context\w*\b.{0,30}?(?:overschreden|te lang)", r"contextvenster\b.{0,30}?\bvol\b",
    r"(?:invoer|verzoek|aanvraag|bericht|prompt|gesprek|tekst)\b.{0,20}?\bte lang\b",
    r"melebihi\b.{0,30}?(?:konteks|token|panjang)", r"(?:konteks|token)\w*\b.{0,30}?melebihi",
    r"konteks\b.{0,30}?(?:terlalu panjang|penuh)",
    r"(?:permintaan|pesan|masukan|input|prompt|percakapan|teks)\b.{0,20}?terlalu panjang",
    # Vietnamese, Turkish, Polish, Arabic
    r"vượt quá\b.{0,20}?(?:ngữ cảnh|token|độ dài)", r"(?:ngữ cảnh|token)\b.{0,40}?vượt quá",
    r"(?:ngữ cảnh|cuộc trò chuyện|cuộc hội thoại|đầu vào|yêu cầu|tin nhắn|lời nhắc)\b.{0,30}?"
    r"(?:quá dài|vượt quá giới hạn|đạt đến giới hạn|đã đầy)",
    r"(?:bağlam|token|belirteç)\w*\b.{0,30}?(?:aşıldı|aşıyor|aştı|aşmakta|çok uzun)",
    r"(?:istek|mesaj|girdi|istem|konuşma|sohbet|metin)\w*\b.{0,20}?çok uzun",
    r"(?:przekracza|przekroczon|przekroczył|przekroczeni)\w*\b.{0,30}?(?:kontekst|token|długoś)",
    r"(?:kontekst|token|długoś)\w*\b.{0,40}?(?:przekracza|przekroczon|przekroczył)",
    r"kontekst\w*\b.{0,30}?(?:przekroczon|(?:za|zbyt) dług|pełn)",
    r"(?:żądanie|wiadomość|wejście|prompt|rozmowa|tekst|zapytanie)\w*\b.{0,20}?(?:za|zbyt) dług",
    r"(?:تجاوز|يتجاوز|تتجاوز|تخطى|يتخطى|تتخطى)\S*\s.{0,30}?(?:سياق|الرموز|رموز|الطول)",
    r"(?:سياق|الرموز|رموز|طول)\S*\s.{0,40}?(?:يتجاوز|تتجاوز|تجاوز|يتخطى|تتخطى)",
    r"سياق\S*\s.{0,20}?(?:طويل|ممتلئ)", r"(?:الطلب|الرسالة|الإدخال|المحادثة|النص)\S*\s.{0,10}?طويل",
    # The same concepts, added with batch 14: a request that does not fit, a count greater than
    # the window ("所需的 Token 数超过了可用的最大上下文大小", "최대 토큰보다 큽니다"), and
    # Ukrainian, Thai and Hebrew.
    r"(?:上下文|窗口)\S{0,6}?(?:放不下|装不下|无法容纳|容纳不下)", r"大于\S{0,4}?上下文",
    r"(?:コンテキスト|文脈)(?:ウィンドウ|長|の長さ|サイズ)?\S{0,6}?を上回",
    r"(?:최대\s?(?:토큰|컨텍스트)|컨텍스트\s?(?:창|윈도우|길이|크기)?)\S{0,2}보다 (?:큽|많|깁|길)",
    r"컨텍스트\S{0,6}\s?(?:들어가지 않|맞지 않)",
    r"größer als (?:die |das |der )?(?:maximale[nr]? )?Kontext",
    r"ne (?:tient|rentre) (?:pas|plus) dans (?:la fenêtre de |le )?contexte",
    r"supérieure? à (?:la |le )?(?:taille |fenêtre |longueur )?(?:maximale )?(?:de |du )?contexte",
    r"no cabe en (?:la ventana de |el )?contexto", r"não cabe (?:na janela de |no )?contexto",
    r"non (?:entra|rientra|sta) (?:più )?(?:nella finestra di |nel )contesto",
    r"(?:melampaui|melebihi)\b.{0,30}?(?:konteks|token|panjang)",
    r"(?:konteks|token)\w*\b.{0,30}?melampaui", r"tidak muat (?:dalam|di) (?:jendela )?konteks",
    r"(?:lớn hơn|nhiều hơn)\b.{0,30}?ngữ cảnh", r"không vừa (?:với |trong )?(?:cửa sổ )?ngữ cảnh",
    r"bağlam\w*\b.{0,20}?sığmı",
    r"nie mieści się w (?:oknie )?kontek", r"(?:wiadomosc|zadanie|wejscie|rozmowa|zapytanie)\w*\b"
    r".{0,20}?(?:za|zbyt) dlug", r"(?:przekracza|przekroczon)\w*\b.{0,30}?(?:kontekst|dlugos)",
    r"nie miesci sie w (?:oknie )?kontek",
    r"أكبر من\s.{0,20}?(?:سياق|نافذة)",
    r"перевищ\w*\s(?:(?:максимальн|допустим|встановлен)\w*\s)?(?:довжин\w*|контекст\w*"
    r"|(?:ліміт|обмеженн|меж)\w*\s(?:(?:на|за|по|у)\s)?(?:кількост\w*\s)?(?:токен|контекст|довжин)\w*"
    r"|(?:розмір|вікн)\w*\sконтекст\w*|(?:кількість|число)\w*\sтокен\w*)",
    r"(?:кількість|число)\w*\sтокенів\b.{0,60}?(?:(?:занадто|надто) велик|перевищу)",
    r"(?:контекст\w*|вікн\w* контексту)\b.{0,30}?(?:переповн|перевищ|заповнен|вичерпан|(?:занадто"
    r"|надто) (?:довг|велик|мал\w* для))", r"вичерпа\w*\s(?:\w+\s)?(?:вікн\w* )?контекст",
    r"(?:запит|ввід|промпт|діалог|розмов|бесід|текст)\w*\b.{0,20}?(?:занадто|надто) довг",
    r"не (?:вміщується|поміщається|влазить) в (?:контекст|вікно)",
    r"(?:контекст|запит|діалог|промпт|розмов)\w*\b.{0,20}?не (?:вміщується|поміщається)",
    r"(?:บริบท|โทเค็น).{0,30}?เกิน", r"เกิน.{0,30}?(?:บริบท|โทเค็น)",
    r"(?:ข้อความ|คำขอ|การสนทนา|อินพุต|พรอมต์|บริบท).{0,10}?ยาวเกินไป",
    r"(?:הקשר|טוקנים|אסימונים)\S*\s.{0,40}?(?:חורג|חורגת|חרג|חרגה|עולה על|עולים על)",
    r"(?:חורג|חורגת|חרג|חרגה|חריגה|עולה על|עולים על)\S*\s?.{0,30}?(?:הקשר|טוקנים|אסימונים)",
    r"(?:השיחה|ההקשר|הפרומפט|הקלט)\s.{0,10}?ארוכ\S* מדי",
    # Persian (batch 16): the conversation's room used up or full ("فضای مکالمه تمام شد"), a
    # conversation or input too long, the context or tokens over the limit
    r"(?:فضای|ظرفیت|حافظه)\s(?:مکالمه|گفتگو|گفت‌وگو|چت|زمینه|متن|context)\S*\s.{0,10}?"
    r"(?:تمام شد|پر شد|پر است|به پایان رسید)",
    r"(?:مکالمه|گفتگو|گفت‌وگو|درخواست|ورودی|پیام|متن)\S*\s.{0,20}?(?:بیش از حد|خیلی) طولانی",
    r"(?:زمینه|توکن|پنجره)\S*\s.{0,30}?(?:از حد|از سقف)\S*\s.{0,20}?(?:بیشتر|فراتر|گذشت|عبور)",
)
# Generic wording ("too many tokens"): an overflow unless the HTTP status says otherwise.
OVERFLOW_WEAK = _rx(
    r"token(?:数)?(?:过多|太多)", r"トークン数?が多すぎ", r"토큰\S{0,2}\s?(?:수가 )?너무 많",
    r"слишком много токенов", r"запрос\w*\b.{0,12}?слишком (?:велик|больш)",
    r"Anfrage\b.{0,12}?zu groß",
    r"solicitud\b.{0,12}?demasiado grande", r"(?:requisição|solicitação)\b.{0,12}?muito grande",
    r"zu viele Token", r"trop de (?:tokens|jetons)", r"demasiados tokens",
    r"(?:tokens demais|muitos tokens)", r"troppi token", r"te veel tokens",
    r"terlalu banyak token", r"quá nhiều token", r"çok fazla (?:token|belirteç)",
    r"(?:zbyt|za) (?:wiele|dużo) tokenów", r"عدد كبير جد\S* من الرموز",
    r"(?:забагато|занадто багато) токенів", r"запит\w*\b.{0,12}?(?:занадто|надто) велик",
    r"повідомленн\w*\b.{0,12}?(?:занадто|надто) довг", r"โทเค็นมากเกินไป", r"คำขอ.{0,10}?ใหญ่เกินไป",
    r"יותר מדי (?:טוקנים|אסימונים)", r"(?:ההודעה|הבקשה)\s.{0,10}?(?:ארוכ|גדול)\S* מדי",
)
# Whether generic wording under HTTP 413 counts tokens (the window) or bytes.
TOKEN_WORD = _whole(r"token|トークン|토큰|токен|词元|jeton|belirteç|الرموز|โทเค็น|טוקנ|אסימונ")
# Request bodies, files and images over a size limit ("ファイルサイズが50MBの制限を超えています",
# "请求体过大", "本轮图片总大小超过限制").
PAYLOAD = _rx(
    r"(?:图像|图片|文件)过多|(?:图像|图片|文件)(?:数量)?超过",
    r"请求体\S{0,6}?(?:过大|太大|超过|超出)",
    r"(?:文件|图片|图像|附件|上传)\S{0,6}?(?:大小|体积|尺寸)\S{0,4}?(?:超过|超出|过大|太大)",
    r"(?:文件|图片|图像|附件)(?:过大|太大)",
    r"(?:ファイル|画像|添付|アップロード|リクエスト(?:ボディ|本文|データ)?)\s?の?\s?(?:サイズ|容量)"
    r"\S{0,12}?(?:(?:制限|上限)\S{0,3}?)?(?:を|が)?(?:超え|超過|大きすぎ)",
    r"(?:ファイル|画像|リクエスト(?:データ|ボディ)?|データ|添付)\S{0,3}?が?大きすぎ",
    r"(?:파일|이미지|첨부(?:\s?파일)?|업로드|요청(?:\s?본문)?)\s?(?:크기|용량)\S{0,2}\s?.{0,12}?"
    r"(?:초과|너무 큽)", r"(?:파일|이미지|요청 본문|첨부 파일)\S{0,2}\s?너무 (?:큽니다|커)",
    r"(?:размер|объ[её]м)\w*\s(?:файл|запрос|тел\w* запрос|изображени|вложени|загрузк)\w*\b"
    r".{0,30}?(?:превыша|слишком велик|больше)",
    r"(?:файл|изображени|вложени|тело запроса)\w*\b.{0,12}?слишком (?:велик|больш)\w*",
    r"(?:Datei|Bild|Anhang|Upload|Anfrage|Nutzlast)\w*größe\b.{0,30}?(?:überschreitet"
    r"|überschritten|zu groß)", r"(?:Datei|Bild|Anhang|Upload|Nutzlast)\w*\b.{0,12}?\bzu groß\b",
    r"taille (?:du |de la |de l'|des )?(?:fichier|requête|image|pièce jointe|corps)\w*\b.{0,30}?"
    r"(?:dépasse|trop |excède)", r"(?:fichier|requête|image|pièce jointe)s?\b.{0,12}?"
    r"trop (?:volumineu|lourd|grand)\w*",
    r"tamaño (?:del |de la |de los |de las )?(?:archivo|solicitud|imagen|adjunto|cuerpo|petición)"
    r"\w*\b.{0,30}?(?:excede|supera|demasiado)",
    r"(?:archivo|imagen|adjunto)s?\b.{0,12}?demasiado grande",
    r"tamanho (?:do |da |dos |das )?(?:arquivo|ficheiro|solicitação|requisição|imagem|anexo"
    r"|corpo)\w*\b.{0,30}?(?:excede|ultrapass|muito grande)",
    r"(?:arquivo|ficheiro|imagem|anexo)s?\b.{0,12}?muito grande",
    r"dimension[ei] (?:del |della |dei |delle |dell')?(?:file|richiesta|immagine|allegato|corpo)"
    r"\w*\b.{0,30}?(?:supera|eccede|troppo)", r"(?:file|richiesta|immagine|allegato)\b.{0,12}?"
    r"troppo grande",
    r"(?:bestand|verzoek|afbeelding|bijlage|upload)\w*\b.{0,20}?(?:te groot|overschrijdt"
    r"|overschreden)",
    r"ukuran (?:file|berkas|permintaan|gambar|lampiran|unggahan)\b.{0,30}?(?:melebihi|terlalu "
    r"besar)", r"(?:file|berkas|permintaan|gambar|lampiran)\b.{0,12}?terlalu besar",
    r"kích thước (?:tệp|tập tin|yêu cầu|hình ảnh|ảnh)\b.{0,30}?(?:vượt quá|quá lớn)",
    r"(?:tệp|tập tin|yêu cầu|hình ảnh)\b.{0,12}?quá lớn",
    r"(?:dosya|istek|görsel|resim|ek|yükleme) boyutu\b.{0,30}?(?:aş|çok büyük)",
    r"(?:dosya|istek|görsel|resim)\w*\b.{0,12}?çok büyük",
    r"rozmiar (?:pliku|żądania|obrazu|załącznika|treści)\w*\b.{0,30}?(?:przekracza|przekroczon"
    r"|(?:zbyt|za) duż)", r"(?:plik|żądanie|obraz|załącznik)\w*\b.{0,12}?(?:zbyt|za) duż",
    r"حجم (?:الملف|الطلب|الصورة|المرفق)\S*.{0,30}?(?:يتجاوز|تجاوز|كبير)",
    r"(?:الملف|الطلب|الصورة|المرفق)\S*\s(?:كبير|كبيرة) جد",
    r"розмір\w*\s(?:файл|запит|зображенн|вкладенн)\w*\b.{0,30}?(?:перевищу|(?:занадто|надто) велик"
    r"|більше)", r"(?:файл|зображенн|вкладенн)\w*\b.{0,12}?(?:занадто|надто) велик\w*",
    r"(?:ไฟล์|รูปภาพ|ภาพ).{0,10}?(?:ใหญ่เกินไป|มีขนาดใหญ่เกิน)", r"ขนาด(?:ไฟล์|คำขอ|รูปภาพ).{0,20}?เกิน",
    r"(?:הקובץ|התמונה|הקבצים|התמונות)\s.{0,10}?גדול\S* מדי",
    r"גודל (?:הקובץ|הבקשה|התמונה)\S*\s.{0,30}?(?:חורג|עולה על)",
)
# The complaint is the room left for the output.
OUTPUT_RESERVE = _rx(
    r"(?:留给|预留给?|保留给)(?:输出|回复|回答|生成)", r"出力(?:用|のため)の(?:余地|トークン|領域)",
    r"출력(?:을 위한|용) (?:공간|토큰)", r"мест\w* для (?:ответа|вывода)",
    r"Platz für die (?:Ausgabe|Antwort)", r"place pour la réponse",
    r"espacio para la (?:respuesta|salida)", r"espaço para a (?:resposta|saída)",
    r"резерв\w* (?:для )?(?:ответа|вывода)", r"резерв\w* (?:для )?відповіді|місц\w* для відповіді",
)

# Numbers: (pattern, field names in group order), consulted after the English shapes (which
# read "(9120 > 8191)" in any language). First value found per field wins.
NUMBERS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(p, re.IGNORECASE), f)
    for p, f in (
        # "此请求需要 9216 tokens，但模型的上下文窗口仅能容纳 8192"
        (rf"需要\s*{_N}\s*个?\s*(?:tokens?|词元)", ("total",)),
        (rf"(?:仅|只|最多)(?:能|可)?(?:容纳|支持|处理|接受)\s*{_N}", ("limit",)),
        (rf"(?:上下文(?:窗口|长度)?|最大(?:上下文)?(?:长度|token数?)|限制|上限)\s*(?:为|是|{_C})"
         rf"\s*{_N}", ("limit",)),
        (rf"(?:输入|请求|提示词?|当前)的?\s*(?:长度|token\s?数?量?)\s*(?:为|是|{_C})?\s*{_N}",
         ("prompt",)),
        # "对话中的tokens数量（5120）超过了最大限制4096"
        (rf"(?:tokens?|词元)\s?(?:数量|数|长度)?\s?[(\uff08]\s?{_N}\s?[)\uff09]\s?(?:超过|超出|大于)",
         ("prompt",)),
        (rf"(?:超过|超出|大于)了?\s?(?:(?:模型|可用)的?)?(?:最大|上限|限制)?\s?(?:长度|限制|上限|值)?\s*{_N}",
         ("limit",)),
        # "입력 토큰 수: 215000 / 제한: 200000"
        (rf"(?:입력|프롬프트|요청)\s?(?:토큰\s?수|토큰|길이)\s*(?:{_C}|는|은|이|가)?\s*{_N}",
         ("prompt",)),
        (rf"(?:제한|한도|최대(?:\s?(?:길이|토큰\s?수|컨텍스트))?|컨텍스트\s?(?:크기|길이|창))\s*"
         rf"(?:{_C}|는|은|이|가)\s*{_N}", ("limit",)),
        # "入力トークン数: 9000", "上限は 8192"
        (rf"(?:入力|プロンプト|リクエスト)の?(?:トークン数?|の?長さ)?\s*(?:{_C}|は|が|\()\s*{_N}",
         ("prompt",)),
        (rf"(?:上限|制限|最大(?:トークン数|長)?|コンテキスト(?:長|の長さ|サイズ|ウィンドウ))\s*"
         rf"(?:{_C}|は|\()\s*{_N}", ("limit",)),
        # Russian, German, Romance and the others: "the request contains N (tokens)", "limit
        # (of / is) M"
        (rf"(?:запрос|ввод|сообщени|промпт|Eingabe|Anfrage|Prompt|Nachricht|requête|entrée"
         rf"|solicitud|entrada|richiesta|solicitação|requisição|invoer|verzoek|permintaan|istek"
         rf"|żądanie)\w*\s(?:содержит|занимает|имеет|составляет|hat|enthält|umfasst|contient"
         rf"|compte|contiene|contém|bevat|berisi|içeriyor|zawiera)\s{_N}", ("prompt",)),
        (rf"(?:лимит|ограничени\w*|максимум|\w*limit|Grenze|Kontext(?:länge|fenster|größe)"
         rf"|limite|l[íi]mite|massimo"
         rf"|m[aá]ximo|limiet|batas|giới hạn|sınır|الحد الأقصى|ліміт|обмеженн\w*)"
         rf"\s*(?:—|{_C}|составляет|становить|равен"
         rf"|von|ist|beträgt|de|est de|es de|è di|é de|di|van|is|là|:)?\s*{_N}", ("limit",)),
        # "Le prompt (33140 tokens) dépasse la fenêtre de contexte (32768 tokens)"
        (rf"\({_N}\s?(?:tokens?|токен\w*|トークン|토큰|jetons?|โทเค็น|טוקנים)?\)\s?(?:dépasse|excède"
         rf"|supera|excede|ultrapassa|sobrepasa|überschreitet|übersteigt|превышает|перевищує|超过|超出"
         rf"|vượt quá|melebihi|melampaui|przekracza|aşıyor|يتجاوز|เกิน|חורג)[^()]{{0,60}}?\({_N}",
         ("prompt", "limit")),
        # a window named, then its figure: "supera la finestra di contesto del modello di 32768
        # token", "доступно 119808 из окна 128000"
        (rf"(?:finestra di contesto|ventana de contexto|janela de contexto|fenêtre de contexte"
         rf"|окн[оае] контекста|вікн[оаі] контексту|Kontextfenster|cửa sổ ngữ cảnh|jendela konteks"
         rf"|okn[oa] kontekstu|bağlam penceresi|חלון ההקשר|หน้าต่างบริบท)[^\d.;]{{0,30}}?{_N}",
         ("limit",)),
        (rf"(?:из|в) окн[аео]\s{_N}", ("limit",)), (rf"(?:з|у) вікн[аоі]\s{_N}", ("limit",)),
        # "требуется 130500 input-токенов", "~81600 token stimati"; "при резерве ответа 8192"
        (rf"(?:требуется|нужно|необходимо|потребуется|потрібно|необхідно)\s{_N}[\s-]?(?:input-"
         rf"|входных\s|вхідних\s)?токен", ("prompt",)),
        (rf"{_N}\s?tokens? (?:stimati|estimados|estimés|geschätzt)", ("prompt",)),
        (rf"резерв\w* (?:для )?(?:ответа|вывода|відповіді)\s{_N}", ("output",)),
    )
)
