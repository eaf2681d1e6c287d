"""Text that is not in the sessions: other scripts, edge inputs, a corpus of files on disk."""

from __future__ import annotations

import base64
import random
import statistics
import string
import uuid
from collections.abc import Sequence

from _timing import interpolated
from _token_data import CORPUS_KINDS, TARGET_UNDER, Doc, pct

from shared.core.tokens import (
    estimate_tokens,
)
from shared.core.tokens_exact import TiktokenCounter

SCRIPT_SAMPLES = {
    "fr": (
        "Le service client a confirmé que la réservation avait été "
        "modifiée hier soir. Nous avons vérifié les détails du vol, "
        "les bagages enregistrés et l'assurance voyage. Si vous "
        "souhaitez annuler, veuillez répondre avant vendredi midi; "
        "après cette date, des frais supplémentaires s'appliqueront. "
        "Merci de votre patience et à très bientôt à bord de nos "
        "appareils."
    ),
    "de": (
        "Die Prüfung der Konfigurationsdatei hat ergeben, dass "
        "mehrere Einträge doppelt vorhanden sind. Bitte überprüfen "
        "Sie die Einstellungen für die Datenbankverbindung und "
        "starten Sie den Dienst anschließend neu. Größere Änderungen "
        "sollten zunächst in einer Testumgebung ausprobiert werden, "
        "damit keine Ausfälle während der Geschäftszeiten entstehen."
    ),
    "pl": (
        "Zespół wdrożeniowy przygotował szczegółową instrukcję "
        "dotyczącą migracji bazy danych. Przed rozpoczęciem należy "
        "wykonać pełną kopię zapasową oraz sprawdzić, czy wszystkie "
        "usługi zostały zatrzymane. Jeżeli pojawią się błędy, proszę "
        "skontaktować się z administratorem systemu i dołączyć pliki "
        "dziennika."
    ),
    "ru": (
        "Команда разработчиков выпустила новую версию библиотеки с "  # noqa: RUF001
        "важными исправлениями. Согласно журналу изменений, была "
        "устранена ошибка, из-за которой происходила утечка памяти "
        "при неожиданном закрытии соединения. Также были добавлены "
        "автоматические тесты, чтобы проблема больше не возникала в "
        "будущем."
    ),
    "el": (
        "Η ομάδα ανάπτυξης κυκλοφόρησε μια νέα έκδοση της "  # noqa: RUF001
        "βιβλιοθήκης με σημαντικές διορθώσεις. Σύμφωνα με το αρχείο "
        "αλλαγών, διορθώθηκε ένα σφάλμα που προκαλούσε διαρροή "
        "μνήμης όταν η σύνδεση έκλεινε απροσδόκητα."
    ),
    "ar": (
        "أصدر فريق التطوير نسخة جديدة من المكتبة تتضمن إصلاحات مهمة. "
        "ووفقًا لسجل التغييرات، تم إصلاح خطأ كان يتسبب في تسرب "
        "الذاكرة عند إغلاق الاتصال بشكل غير متوقع. كما أضاف الفريق "
        "اختبارات تلقائية لمنع تكرار المشكلة في المستقبل."
    ),
    "hi": (
        "विकास टीम ने लाइब्रेरी का एक नया संस्करण जारी किया है "
        "जिसमें महत्वपूर्ण सुधार शामिल हैं। परिवर्तन लॉग के अनुसार, "
        "एक त्रुटि को ठीक किया गया है जिसके कारण कनेक्शन अचानक बंद "
        "होने पर मेमोरी लीक होती थी।"
    ),
    "th": (
        "ทีมพัฒนาได้เปิดตัวไลบรารีเวอร์ชันใหม่ที่มีการแก้ไขที่สำคัญ "
        "ตามบันทึกการเปลี่ยนแปลง "
        "ข้อผิดพลาดที่ทำให้หน่วยความจำรั่วเมื่อการเชื่อมต่อปิดโดยไม่คาดคิดได้รับการแก้ไขแล้ว"
    ),
    "zh": (
        "开发团队发布了该库的新版本，其中包含重要的修复。根据变更日志"  # noqa: RUF001
        "，修复了一个在连接意外关闭时导致内存泄漏的错误。团队还添加了"  # noqa: RUF001
        "自动化测试，以防止该问题将来再次出现。如果您在升级后遇到任何"  # noqa: RUF001
        "问题，请联系技术支持并附上日志文件。"  # noqa: RUF001
    ),
    "ja": (
        "開発チームは重要な修正を含むライブラリの新しいバージョンをリ"
        "リースしました。変更履歴によると、接続が予期せず閉じられたと"
        "きにメモリリークが発生するバグが修正されました。また、問題の"
        "再発を防ぐために自動テストが追加されました。"
    ),
    "ko": (
        "개발팀은 중요한 수정 사항이 포함된 라이브러리의 새 버전을 "
        "출시했습니다. 변경 로그에 따르면 연결이 예기치 않게 닫힐 때 "
        "메모리 누수를 일으키던 버그가 수정되었습니다. 또한 문제가 "
        "다시 발생하지 않도록 자동 테스트가 추가되었습니다."
    ),
}
"""Short hand-written paragraphs per script (indicative: one paragraph each)."""


def edge_inputs() -> dict[str, str]:
    """Inputs that break naive estimators: whitespace and digit runs, blobs, scripts."""
    rng = random.Random(7)
    cases = {
        "10,000 spaces": " " * 10_000,
        "1,000 newlines": "\n" * 1_000,
        "1,000 tabs": "\t" * 1_000,
        "10,000 random digits": "".join(rng.choice("0123456789") for _ in range(10_000)),
        "base64 of 7,500 random bytes": base64.b64encode(rng.randbytes(7_500)).decode(),
        "hex of 5,000 random bytes": rng.randbytes(5_000).hex(),
        "200 UUIDs": " ".join(str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(200)),
        "5,000 random lowercase letters": "".join(
            rng.choice(string.ascii_lowercase) for _ in range(5_000)
        ),
        "5,000 '='": "=" * 5_000,
        "1,000 emoji": "\U0001f600" * 1_000,
    }
    cases.update({f"paragraph, {name}": text for name, text in SCRIPT_SAMPLES.items()})
    return cases


def edge_lines(o200k: TiktokenCounter) -> list[str]:
    out = ["| input | chars | o200k | estimate (no margin) | ratio |", "|---|---:|---:|---:|---:|"]
    for name, text in edge_inputs().items():
        true, est = o200k.text(text), estimate_tokens(text, safety_margin=0.0)
        out.append(f"| {name} | {len(text)} | {true} | {est} | {est / true:.2f} |")
    return out


def corpus_lines(docs: Sequence[Doc], o200k: TiktokenCounter, margin: float) -> list[str]:
    """Uncalibrated error per file (text only, no framing), with the safety margin."""
    out = [
        "| text on disk (not in the sessions) | files | worst | files under by > 5% | p5 "
        "| median (target <= +15%) | worst files |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind in CORPUS_KINDS:
        rows = []
        for doc in docs:
            true = o200k.text(doc.text) if doc.kind == kind else 0
            if true >= 200:
                rows.append((estimate_tokens(doc.text, safety_margin=margin) / true - 1, doc.path))
        if not rows:
            continue
        rows.sort()
        errors = [e for e, _ in rows]
        under = sum(e < TARGET_UNDER for e in errors)
        worst = ", ".join(f"`{path}` {pct(e)}" for e, path in rows[:3] if e < TARGET_UNDER)
        out.append(
            f"| {kind} | {len(rows)} | {pct(errors[0])} | {under} ({under / len(rows):.1%}) "
            f"| {pct(interpolated(errors, 0.05))} | {pct(statistics.median(errors))} "
            f"| {worst or '-'} |"
        )
    return out if len(out) > 2 else ["No neutral text found: pass --corpus DIR."]
