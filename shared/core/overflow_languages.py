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
Chinese, Japanese, Korean, Russian, German, French, Italian, Spanish, Portuguese, Dutch,
Indonesian, Vietnamese, Turkish, Polish and Arabic are covered.
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
}
_ANY_LETTER = re.compile("|".join(p.pattern for p in _LETTERS.values()))

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
                    "tegoed", "quotum", "credito", "kredit")
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


# Roles that must alternate, tool calls without their results.
TOOL_PAIRING = _rx(
    r"(?:user|assistant|用户|助手).{0,20}?(?:交替|轮流)", r"tool_?(?:result|use|call)\w*.{0,6}?"
    r"(?:配对|对应|匹配)", r"工具(?:调用|结果).{0,6}?(?:配对|不匹配|没有对应|缺少对应)",
    r"(?:ユーザー|アシスタント|user|assistant).{0,20}?交互", r"(?:사용자|user).{0,20}?번갈아",
    r"(?:user|assistant)\b.{0,40}?чередова", r"(?:user|assistant)\b.{0,40}?(?:abwechseln"
    r"|alterner|alternar|afwisselen|bergantian|luân phiên|naprzemiennie)",
)
CAPACITY = _rx(r"容量不足", r"访问量过大")
# Money and allowances, and a memory store that is full (an app's saved memories, not the
# context): checked before any overflow wording.
QUOTA = _rx(
    r"余额不足|欠费|额度|限额|配额", r"记忆(?:库|存储|空间)?(?:已满|不足|超过|超出|已达上限)",
    r"删除(?:一些|部分|现有的?|旧的?)?记忆",
    r"残高|クレジット(?:が|の)?\S{0,4}不足|資金\S{0,10}不足|クォータ|割り?当て(?:量|枠)"
    r"|利用(?:上限|枠)|無料枠",
    r"할당량|잔액|크레딧\S{0,2} 부족|결제|사용 한도",
    r"квот\w*|\bбаланс[аеу]?\b|недостаточно средств|воспоминани\w*",
    r"Kontingent|Guthaben|Kontostand|Abrechnung|Erinnerungen",
    r"\bsolde\b|crédits? (?:insuffisant|épuisé)|facturation|souvenirs",
    r"\bcuota\b|\bsaldo\b|cr[ée]ditos? insuficientes?|facturaci[oó]n|recuerdos",
    r"\bcota\b|faturamento|memórias existentes", r"credito (?:insufficiente|esaurito)",
    r"fatturazione|ricordi esistenti", r"\btegoed\b|\bquotum\b|herinneringen",
    r"\bkuota\b|kredit (?:tidak cukup|habis)", r"hạn ngạch|số dư|tín dụng không đủ",
    r"\bkota\b|bakiye|kredi(?:niz)? (?:yetersiz|bitti)",
    r"limit\w* wykorzystania|brak środków|niewystarczając\w* (?:środk|kredyt)\w*",
    r"الحصة|حصتك|الرصيد|رصيدك|الفوترة|الذكريات",
)
# A rate limit named as such: beside a quota, the rate is what to wait on.
_RATE_NAMES = (
    r"速率限制|频率限制|レート制限|속도 제한", r"(?:лимит|ограничени)\w* (?:скорости|частоты)",
    r"Ratenlimit|limite de (?:débit|taux|fréquence)|l[íi]mite de (?:velocidad|tasa|frecuencia)"
    r"|limite de taxa|limite di (?:velocità|frequenza)|snelheidslimiet|batas (?:kecepatan|laju)"
    r"|giới hạn tốc độ|(?:oran|hız) sınır\w*|limit\w* (?:szybkości|częstotliwości)", r"حد المعدل",
)
_SHORT_WINDOWS = (
    r"每(?:分钟|秒)|毎分|毎秒|1?分(?:間|あたり)|분당|초당", r"в (?:минуту|секунду)",
    r"pro (?:Minute|Sekunde)|par (?:minute|seconde)|por (?:minuto|segundo)"
    r"|al (?:minuto|secondo)|per (?:minuut|menit|detik)|mỗi (?:phút|giây)"
    r"|(?:dakika|saniye) başına|na (?:minutę|sekundę)", r"في (?:الدقيقة|الثانية)",
)
PER_SHORT_WINDOW = _rx(*_SHORT_WINDOWS, *_RATE_NAMES)
RATE = _rx(
    *_RATE_NAMES, *_SHORT_WINDOWS, r"过于频繁|频率超|限流|并发|每(?:小时|天|日)",
    r"(?:请求|提问|调用|发送)得?(?:太|过)快|(?:调用|请求)次数\S{0,4}?(?:超过|超出|达到)",
    r"リクエスト(?:が|数が)?多すぎ|リクエスト過多",
    r"요청\S{0,2} 너무 많|요청 수\S{0,2} (?:너무|제한|한도)",
    r"слишком много запросов|частот\w* (?:ваших )?запрос\w*|лимит\w* запросов",
    r"zu viele Anfragen|Anfragelimit", r"trop de requêtes|limite de requêtes",
    r"demasiadas (?:solicitudes|peticiones)|l[íi]mite de solicitudes",
    r"(?:muitas|excesso de) (?:solicitações|requisições)|limite de (?:requisições|solicitações)",
    r"troppe richieste|limite di richieste", r"te veel (?:verzoeken|aanvragen)",
    r"terlalu banyak permintaan|batas permintaan",
    r"quá nhiều yêu cầu|số (?:lượng )?yêu cầu\b.{0,20}?vượt quá",
    r"çok fazla istek|istek sınır\w*", r"(?:zbyt|za) (?:wiele|dużo) (?:żądań|zapytań|próśb)"
    r"|limit\w* (?:żądań|zapytań)", r"طلبات كثيرة|عدد كبير جد\S* من الطلبات|معدل الطلبات",
)
# The output setting's own cap ("最大输出长度不能超过1000000"): an output limit.
OUTPUT_OVER_WINDOW = _rx(
    r"最大输出(?:长度|token\s?数?)\S{0,4}?(?:不能|不可|不得|无法|应小于|必须小于)",
    r"最大出力(?:トークン数?|長|の長さ)\S{0,30}?(?:を超えることはできません|以下にしてください)",
    r"최대 출력 (?:토큰(?: 수)?|길이)\S{0,2}.{0,20}?초과할 수 없",
    r"(?:выходных токенов|длин\w* ответа)\b.{0,20}?не (?:может|должн\w*) превышать",
    r"Ausgabe(?:länge|-?Token\w*)\b.{0,30}?(?:darf|kann) nicht",
    r"(?:longueur|tokens?) (?:maximale? )?de sortie\b.{0,30}?ne (?:peut|doit) pas",
    r"(?:longitud|tokens?) (?:m[aá]xim[oa] )?de salida\b.{0,30}?no (?:puede|debe)",
    r"(?:comprimento|tokens?) (?:m[aá]xim[oa] )?de saída\b.{0,30}?não (?:pode|deve)",
)
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
    r"(?:输入|提示词?|上下文|请求|消息)(?:内容|文本)?(?:长度)?(?:过长|太长|超长|超过|超出)",
    r"超(?:过|出)了?(?:模型)?(?:的)?(?:最大)?(?:上下文|长度|token)", r"超过了?(?:上下文)?窗口",
    r"内容(?:长度)?(?:过长|太长|超长)", r"(?:请求|内容|消息|输入)(?:内容)?(?:过大|太大)",
    r"\b(?:prompt|input|context|tokens?|text)\s*(?:过长|太长|超长)",
    r"(?:token|词元) ?(?:数量|数|长度)?(?:超过|超出)了?(?:模型)?(?:的)?(?:上限|限制|最大)",
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
    r"(?:контекст\w*|окн\w* контекста)\b.{0,30}?(?:переполнен|превыш|заполнен|слишком (?:длинн"
    r"|велик))",
    r"(?:запрос|сообщени|ввод|промпт|диалог|разговор|бесед|текст)\w*\b.{0,20}?слишком длинн\w*",
    r"не помещается в (?:контекст|окно)",
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
)
# Generic wording ("too many tokens"): an overflow unless the HTTP status says otherwise.
OVERFLOW_WEAK = _rx(
    r"token(?:数)?(?:过多|太多)", r"トークン数?が多すぎ", r"토큰\S{0,2}\s?(?:수가 )?너무 많",
    r"слишком много токенов", r"запрос\w*\b.{0,12}?слишком велик", r"Anfrage\b.{0,12}?zu groß",
    r"solicitud\b.{0,12}?demasiado grande", r"(?:requisição|solicitação)\b.{0,12}?muito grande",
    r"zu viele Token", r"trop de (?:tokens|jetons)", r"demasiados tokens",
    r"(?:tokens demais|muitos tokens)", r"troppi token", r"te veel tokens",
    r"terlalu banyak token", r"quá nhiều token", r"çok fazla (?:token|belirteç)",
    r"(?:zbyt|za) (?:wiele|dużo) tokenów", r"عدد كبير جد\S* من الرموز",
)
# Whether generic wording under HTTP 413 counts tokens (the window) or bytes.
TOKEN_WORD = _whole(r"token|トークン|토큰|токен|词元|jeton|belirteç|الرموز")
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
)
# A reply cut at its length limit ("回答已经被大模型截断"): not the request's size.
OUTPUT_LIMIT = _rx(
    r"(?:回答|回复|输出|响应|生成内容?)\S{0,12}?(?:被|已)\S{0,8}?截断",
    r"(?:输出|回复|回答)(?:长度|token\s?数?)?\S{0,2}?(?:达到|超过|超出)了?(?:最大)?(?:输出)?"
    r"(?:上限|限制|长度)",
    r"(?:応答|回答|出力|返答)\S{0,8}?(?:切り捨て|打ち切|途中で切れ|切り詰め)",
    r"最大出力トークン\S{0,6}?(?:に達し|を超え)",
    r"(?:응답|출력|답변)\S{0,3}\s?(?:잘렸|잘림|잘려)",
    r"최대 출력 토큰\S{0,2}\s?(?:에 도달|을 초과)",
    r"ответ\w*\b.{0,20}?(?:обрезан|усеч[её]н|оборван)",
    r"Antwort\b.{0,20}?(?:abgeschnitten|gekürzt)",
    r"réponse\b.{0,20}?(?:tronquée|coupée)", r"respuesta\b.{0,20}?(?:truncada|cortada)",
    r"resposta\b.{0,20}?(?:truncada|cortada)", r"risposta\b.{0,20}?(?:troncata|tagliata)",
    r"antwoord\b.{0,20}?afgekapt", r"(?:respons|jawaban)\b.{0,20}?(?:terpotong|dipotong)",
    r"(?:câu trả lời|phản hồi)\b.{0,20}?bị cắt", r"yanıt\b.{0,20}?kesildi",
    r"odpowiedź\b.{0,20}?(?:obcięt|ucięt)", r"(?:اقتطاع|قطع) (?:الرد|الإجابة)",
)
AUTH = _rx(
    r"api ?key\W{0,3}(?:不正确|错误|无效)",
    r"未授权|鉴权失败|认证失败|身份验证失败|权限不足|拒绝访问",
    r"(?:密钥|key)\S{0,3}(?:无效|不正确|已过期)|无效的?(?:api ?)?(?:密钥|key)",
    r"認証(?:に失敗|エラー)|(?:API ?)?キーが(?:無効|正しくありません)|アクセスが拒否",
    r"인증(?:에)? (?:실패|오류)|(?:유효하지 않은|잘못된) API 키|접근(?:이)? 거부",
    r"(?:неверный|недействительный|неправильный) (?:API[- ])?ключ|ошибка (?:авторизации"
    r"|аутентификации)|доступ запрещ[её]н|не авторизован",
    r"ungültiger (?:API-)?Schlüssel|Authentifizierung (?:fehlgeschlagen|erforderlich)"
    r"|Zugriff verweigert",
    r"clé (?:d'API |API )?(?:invalide|incorrecte)|échec de l'authentification|accès refusé",
    r"clave (?:de )?API (?:no válida|inválida|incorrecta)|error de autenticación|acceso denegado",
    r"chave (?:de )?API inválida|falha na autenticação|acesso negado",
    r"chiave API non valida|autenticazione non riuscita|accesso negato",
    r"ongeldige API-sleutel|toegang geweigerd", r"kunci API tidak valid|akses ditolak",
    r"khóa API không hợp lệ|truy cập bị từ chối", r"geçersiz API anahtarı|erişim reddedildi",
    r"nieprawidłowy klucz API|odmowa dostępu", r"مفتاح API غير صالح|فشل(?:ت)? المصادقة",
)
CONTENT_FILTER = _rx(
    r"敏感内容|不安全的?内容|违规内容|审核不通过|涉嫌违规|未通过\S{0,4}?审核|安全审核|内容审核",
    r"コンテンツ(?:フィルター|ポリシー)|不適切な(?:内容|コンテンツ)|安全(?:性)?フィルター",
    r"콘텐츠 (?:필터|정책)|부적절한 (?:내용|콘텐츠)|안전 필터",
    r"фильтр\w* (?:безопасности|контента|содержимого)|модераци\w*",
    r"Inhaltsfilter|Sicherheitsfilter|Inhaltsrichtlinie",
    r"filtre (?:de contenu|de sécurité)|modération", r"filtro (?:de contenido|de seguridad)"
    r"|moderación", r"filtro (?:de conteúdo|de segurança)|moderação",
    r"filtro (?:dei contenuti|di sicurezza)|moderazione", r"inhoudsfilter|moderatie",
    r"filter (?:konten|keamanan)|moderasi", r"bộ lọc (?:nội dung|an toàn)|kiểm duyệt",
    r"içerik filtresi|güvenlik filtresi", r"filtr (?:treści|bezpieczeństwa)|moderacj\w*",
    r"(?:مرشح|فلتر) (?:المحتوى|الأمان)|سياسة المحتوى",
)
OVERLOADED = _rx(
    r"负载过高|过载|繁忙", r"過負荷|混雑|混み合って", r"과부하|혼잡", r"перегруж\w*",
    r"überlastet|Überlastung", r"surchargé", r"sobrecargad|sobrecarregad", r"sovraccaric",
    r"overbelast", r"kelebihan beban", r"quá tải", r"aşırı yük", r"przeciążon",
    r"(?:حمل|ضغط) زائد",
)
# Out of memory (often naming a smaller context size as the cure), timeouts, unavailable.
SERVER = _rx(
    r"内存不足|显存不足|服务器(?:内部)?错误|服务(?:暂时)?不可用|网络(?:错误|异常)|连接(?:超时|失败|中断)",
    r"メモリー?が?不足|サーバー(?:内部)?エラー|内部エラー|タイムアウト|接続(?:エラー|に失敗)",
    r"메모리\S{0,2} 부족|서버 (?:내부 )?오류|시간 초과|연결 (?:오류|실패)",
    r"недостаточно (?:видео)?памяти|нехватк\w* (?:видео)?памяти|внутренн\w* ошибк\w*"
    r"|тайм-?аут|время ожидания|временно недоступ\w*",
    r"nicht genügend (?:Arbeits|Grafik)?speicher|Speichermangel|interner (?:Server)?fehler"
    r"|Zeitüberschreitung|nicht verfügbar",
    r"mémoire insuffisante|erreur (?:interne|du serveur)|délai d'attente|indisponible",
    r"memoria insuficiente|error interno|tiempo de espera", r"memória insuficiente|erro interno"
    r"|indisponível", r"memoria insufficiente|errore interno|non disponibile",
    r"onvoldoende geheugen|interne (?:server)?fout", r"memori tidak cukup|kehabisan memori",
    r"(?:hết|không đủ) bộ nhớ|bộ nhớ không đủ|lỗi (?:máy chủ )?nội bộ|hết thời gian chờ",
    r"yetersiz bellek|bellek yetersiz|sunucu hatası|zaman aşımı",
    r"(?:brak|za mało) pamięci|wewnętrzny błąd|przekroczono (?:limit )?czas",
    r"نفاد الذاكرة|ذاكرة غير كافية|خطأ داخلي|انتهت مهلة",
)
# For the unrecognised-error net: a lookup that failed, a request that names what is malformed
# in it, or a field (a name, a title) that is too long.
NOT_FOUND = _whole(
    r"不存在|找不到|未找到|見つかりません|存在しません|찾을 수 없|존재하지 않",
    r"не найден|не существует",
    r"nicht gefunden|existiert nicht|introuvable|n'existe pas|no encontrado|no existe",
    r"não encontrado|não existe|non trovato|non esiste|niet gevonden|bestaat niet",
    r"tidak ditemukan|không tìm thấy|bulunamadı|nie znaleziono|nie istnieje|غير موجود",
)
MALFORMED = _whole(
    r"参数(?:错误|无效|不合法)|格式错误|无效的?参数|不合法|(?:名称|名字|标题|描述)(?:过长|太长)",
    r"パラメータ\S{0,2}(?:無効|不正)|形式が正しくありません|잘못된 (?:매개변수|형식)",
    r"неверн\w* (?:параметр|формат)|недопустим\w* (?:параметр|значени)",
    r"ungültige[rs]? (?:Parameter|Wert|Format)|mal formée?|paramètre invalide|mal formad[oa]",
    r"parámetro (?:no válido|inválido)|parâmetro inválido|malformat[oa]|parametro non valido",
    r"ongeldige parameter|parameter tidak valid|tham số không hợp lệ|geçersiz parametre",
    r"nieprawidłowy parametr|معلمة غير صالحة",
)
# The complaint is the room left for the output.
OUTPUT_RESERVE = _rx(
    r"(?:留给|预留给?|保留给)(?:输出|回复|回答|生成)", r"出力(?:用|のため)の(?:余地|トークン|領域)",
    r"출력(?:을 위한|용) (?:공간|토큰)", r"мест\w* для (?:ответа|вывода)",
    r"Platz für die (?:Ausgabe|Antwort)", r"place pour la réponse",
    r"espacio para la (?:respuesta|salida)", r"espaço para a (?:resposta|saída)",
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
        (rf"(?:超过|超出|大于)了?\s?(?:最大|上限|限制)?\s?(?:长度|限制|上限|值)?\s*{_N}",
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
         rf"|m[aá]ximo|limiet|batas|giới hạn|sınır|الحد الأقصى)\s*(?:—|{_C}|составляет|равен"
         rf"|von|ist|beträgt|de|est de|es de|è di|é de|di|van|is|là|:)?\s*{_N}", ("limit",)),
    )
)
