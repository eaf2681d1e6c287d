"""The other languages' wording of the verdicts that are not overflows: tool pairing, capacity,
quota, rate limits, output limits, auth, content filters, overload and server errors, and the
unrecognised-error net's lookups and malformed requests.

Split from ``shared.core.overflow_languages`` (which keeps the scripts, the overflow and payload
families and the numbers) when that module outgrew ~550 lines; the split follows the decision
order: these families are the negatives each overflow wording must get past. Each part is read
only for texts with its script's letters, as there.
"""

# Words of other scripts look like Latin letters to ruff (Cyrillic "о", Turkish "ı"): they are
# the point of this module.
# ruff: noqa: RUF001, RUF003
from __future__ import annotations

from shared.core.overflow_languages import _rx, _whole

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
    r"недостатньо коштів", r"โควต้า|โควตา|ยอดเงิน\S{0,6}ไม่เพียงพอ|เครดิต\S{0,4}ไม่เพียงพอ",
    r"מכסה|המכסה|יתרה|היתרה|אין מספיק (?:קרדיט|זיכוי)",
    # an agent's allowance of auto-approved requests ("Kilo Code وصل لحد 50 طلب API موافَق عليه
    # تلقائيًا"): reset the count to go on
    r"موافَ?ق\S*\s+عليه\S*\s+تلقائي", r"自动(?:批准|审批|同意)的?\S{0,20}?(?:上限|限制|次数)",
    r"自動承認\S{0,20}?(?:上限|制限)", r"자동 승인.{0,20}?(?:한도|제한)",
    r"(?:лимит|предел)\w*\b.{0,40}?автоматически одобр|автоматически одобр\w*\b.{0,40}?(?:лимит"
    r"|предел)", r"Limit\b.{0,40}?automatisch genehmigt|automatisch genehmigt\w*\b.{0,40}?Limit",
    r"limite\b.{0,40}?(?:approuvées? automatiquement|aprovad[oa]s? automaticamente"
    r"|approvat[ei] automaticamente)", r"l[íi]mite\b.{0,40}?aprobad[oa]s? automáticamente",
)
# A rate limit named as such: beside a quota, the rate is what to wait on.
_RATE_NAMES = (
    r"速率限制|频率限制|レート制限|속도 제한", r"(?:лимит|ограничени)\w* (?:скорости|частоты)",
    r"Ratenlimit|limite de (?:débit|taux|fréquence)|l[íi]mite de (?:velocidad|tasa|frecuencia)"
    r"|limite de taxa|limite di (?:velocità|frequenza)|snelheidslimiet|batas (?:kecepatan|laju)"
    r"|giới hạn tốc độ|(?:oran|hız) sınır\w*|limit\w* (?:szybkości|częstotliwości)", r"حد المعدل",
    r"обмеженн\w* (?:швидкості|частоти)", r"จำกัดอัตรา", r"מגבלת קצב",
)
_SHORT_WINDOWS = (
    r"每(?:分钟|秒)|毎分|毎秒|1?分(?:間|あたり)|분당|초당", r"в (?:минуту|секунду)",
    # a wait of minutes or seconds named ("还需要等待 12 分钟"): a quota so worded is a rate
    r"(?:等待|稍等|等)\s*\d+\s*(?:分钟|秒)", r"за (?:хвилину|секунду)", r"ต่อ(?:นาที|วินาที)",
    r"לדקה|בדקה|לשנייה",
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
    r"(?:太|过于|过度|过|很)频繁|频繁(?:请求|访问|调用|操作)|超过(?:限制|最大)?次数",
    r"너무 많은 요청|너무 (?:빠르게|자주)", r"слишком часто|через \d+ (?:секунд|минут)",
    r"(?:забагато|занадто багато) запитів|ліміт\w* запитів|занадто часто",
    r"через \d+ (?:секунд|хвилин)",
    r"คำขอมากเกินไป|บ่อยเกินไป", r"יותר מדי בקשות|בקשות רבות מדי",
    # a wait of a few seconds asked for ("Aguarde alguns segundos e tente novamente")
    r"aguarde (?:alguns|uns|\d+) (?:segundos|minutos)",
    r"esper[ae] (?:unos|algunos|\d+) (?:segundos|minutos)",
    r"(?:patientez|attendez) (?:quelques|\d+) (?:secondes|minutes)",
    r"attend[ai] (?:qualche|alcuni|\d+) (?:second[oi]|minuti)",
    r"подождите (?:несколько|\d+) (?:секунд|минут)", r"зачекайте (?:кілька|\d+) (?:секунд|хвилин)",
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
    # the max_tokens parameter itself over its cap ("max_tokens 不能超过 65536"); N output tokens
    # requested against the model's maximum
    r"max_(?:tokens|new_tokens|completion_tokens|output_tokens)\W{0,3}(?:不能|不可|不得|应|必须)"
    r"(?:超过|大于|小于)",
    r"max_tokens\S{0,3}(?:は|が)?\S{0,12}?(?:を超えることはできません|以下にしてください)",
    r"max_tokens\S{0,3}\s?.{0,15}?초과할 수 없", r"max_tokens\W{0,3}не (?:может|должен) превышать",
    r"(?:запрошено|запрос\w*)\s\d[\d\s]*\s?(?:output-|выходных\s)токен\w*\b.{0,30}?(?:максимум|лимит"
    r"|предел)", r"(?:max_tokens|вихідних токенів)\b.{0,20}?не (?:може|повин\w*) перевищувати",
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
    # Arabic verbs, short vowels written or not ("اقتُطعت إجابتي عند حد الإخراج"), and the output
    # limit named ("حد الإخراج")
    r"(?:اقت|قُ?)[\u064b-\u0652]?ط[\u064b-\u0652]?ع\S*\s(?:\S+\s)?(?:إجاب|الإجاب|الرد|رد|المخرجات"
    r"|الاستجابة)", r"(?:عند|بلغ\S*|وصل\S* إلى|تجاوز\S*) حد (?:الإخراج|المخرجات)",
    r"(?:超出|超过|达到)了?(?:最大)?(?:回复|回答|输出|生成)(?:长度|token\s?数?)?的?(?:限制|上限)",
    r"(?:การตอบสนอง|คำตอบ|เอาต์พุต).{0,12}?(?:ถูกใช้หมด|หมดแล้ว|ถูกตัด|เกินขีดจำกัด)",
    r"відповід\w*\b.{0,20}?(?:обрізан|урізан|обірван)", r"התשובה\s.{0,20}?(?:נקטעה|קוצרה)",
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
    r"API[_ ]?KEY\S{0,3}\s?(?:が|は)?(?:未設定|設定されていません)",
    r"APIキー(?:が|は)?(?:未設定|設定されていません)",
    r"API[_ ]?KEY\S{0,3}\s?(?:未设置|未配置|为空|不能为空)|未(?:设置|配置)\S{0,4}API[_ ]?KEY",
    r"API[_ ]?(?:KEY|키)\S{0,3}\s?(?:가 |이 )?(?:설정되지 않|없습니다)",
    r"(?:API[_ ]?KEY|ключ\w* API)\s?не (?:задан|установлен|указан)",
    r"(?:невірний|недійсний|неправильний) (?:API[- ])?ключ|ключ\w* API не (?:задано|встановлено"
    r"|вказано)|помилка (?:авторизації|автентифікації)|доступ заборонено",
    r"คีย์ API ไม่ถูกต้อง|การยืนยันตัวตนล้มเหลว", r"מפתח API (?:לא תקין|שגוי)|האימות נכשל",
)
CONTENT_FILTER = _rx(
    r"敏感内容|不安全的?内容|违规内容|审核不通过|涉嫌违规|未通过\S{0,4}?审核|安全审核|内容审核",
    r"コンテンツ(?:フィルター|ポリシー)|不適切な(?:内容|コンテンツ)|安全(?:性)?フィルター",
    r"콘텐츠 (?:필터|정책)|부적절한 (?:내용|콘텐츠)|안전 필터",
    r"фильтр\w* (?:безопасности|контента|содержимого)|модераци\w*",
    r"Inhaltsfilter|Sicherheitsfilter|Inhaltsrichtlinie",
    r"filtres? (?:de contenu|de sécurité)|modération", r"filtros? (?:de contenido|de seguridad)"
    r"|moderación", r"filtros? (?:de conteúdo|de segurança)|moderação",
    r"filtr[oi] (?:dei contenuti|di sicurezza)|moderazione", r"inhoudsfilter|moderatie",
    r"filter (?:konten|keamanan)|moderasi", r"bộ lọc (?:nội dung|an toàn)|kiểm duyệt",
    r"içerik filtresi|güvenlik filtresi", r"filtr (?:treści|bezpieczeństwa)|moderacj\w*",
    r"(?:مرشح|فلتر) (?:المحتوى|الأمان)|سياسة المحتوى",
    r"不合规|(?:被|已被)(?:过滤|拦截|屏蔽)|风控", r"фільтр\w* (?:безпеки|контенту|вмісту)",
    r"vượt qua (?:các )?(?:hướng dẫn|chỉ dẫn|chỉ thị)(?: hệ thống)?",  # a prompt injection refused
    r"ตัวกรอง(?:เนื้อหา|ความปลอดภัย)|นโยบายเนื้อหา", r"מסנן (?:תוכן|בטיחות)|מדיניות התוכן",
)
OVERLOADED = _rx(
    r"负载过高|过载|繁忙", r"過負荷|混雑|混み合って", r"과부하|혼잡", r"перегруж\w*",
    r"überlastet|Überlastung", r"surchargé", r"sobrecargad|sobrecarregad", r"sovraccaric",
    r"overbelast", r"kelebihan beban", r"quá tải", r"aşırı yük", r"przeciążon",
    r"(?:حمل|ضغط) زائد",
    r"超负荷|超载|负荷过(?:高|大)", r"перевантаж\w*", r"โอเวอร์โหลด|ภาระงานสูงเกินไป",
    r"עומס (?:יתר|כבד)|עמוס",
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
    r"habis waktu|waktu (?:tunggu )?habis|kehabisan waktu|batas waktu (?:terlampaui|habis)",
    r"tempo (?:limite |de espera )?esgotado|tempo (?:di attesa )?scaduto",
    r"(?:hết|không đủ) bộ nhớ|bộ nhớ không đủ|lỗi (?:máy chủ )?nội bộ|hết thời gian chờ",
    r"yetersiz bellek|bellek yetersiz|sunucu hatası|zaman aşımı",
    r"(?:brak|za mało) pamięci|wewnętrzny błąd|przekroczono (?:limit )?czas",
    r"نفاد الذاكرة|ذاكرة غير كافية|خطأ داخلي|انتهت مهلة",
    # a network that is unstable, a server that does not answer
    r"网络(?:不稳定|连接)|服务器(?:无|没有|未)响应",
    r"ネットワーク(?:エラー|が不安定)|サーバーが応答しません",
    r"네트워크\S{0,2}\s?(?:불안정|오류|연결|문제)|서버\S{0,2}\s?응답하지 않",
    r"сет\w* (?:нестабильн|недоступн)|сетев\w* ошибк|сервер не отвечает",
    r"мереж\w* (?:нестабільн|недоступн)|мережев\w* помилк|сервер не відповідає",
    r"Netzwerkfehler|Server antwortet nicht", r"erreur réseau|le serveur ne répond pas",
    r"error de red|el servidor no responde", r"erro de rede|o servidor não responde",
    r"errore di rete|il server non risponde", r"lỗi mạng|máy chủ không phản hồi",
    r"ağ hatası|sunucu yanıt vermiyor", r"błąd sieci|serwer nie odpowiada",
    r"خطأ في الشبكة|الخادم لا يستجيب", r"เครือข่าย(?:ไม่เสถียร|ผิดพลาด)|เซิร์ฟเวอร์ไม่ตอบสนอง",
    r"שגיאת רשת|השרת אינו מגיב",
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
