"""Month and weekday names in the languages the checks read (English, German, French,
Spanish, Italian; weekdays in Chinese too), each with its number (January 1, Monday 1).

The grounding check matches an English month or weekday of a summary to a date the
document writes in its own language; the sentence splitter keeps a German ordinal ("12.
März") with its month; the extractive summary scores a sentence that holds a date.
"""

from __future__ import annotations

MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
# a date the document writes in German, French, Spanish or Italian grounds the English month
# name of a summary in English ("März" grounds "March"); English names are in MONTHS
FOREIGN_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("januar", "jänner", "janvier", "enero", "gennaio"),
            ("februar", "février", "fevrier", "febrero", "febbraio"),
            ("märz", "maerz", "mars", "marzo"),
            ("avril", "abril", "aprile"),
            ("mai", "mayo", "maggio"),
            ("juni", "juin", "junio", "giugno"),
            ("juli", "juillet", "julio", "luglio"),
            ("août", "aout", "agosto"),
            ("septembre", "septiembre", "settembre"),
            ("oktober", "octobre", "octubre", "ottobre"),
            ("novembre", "noviembre"),
            ("dezember", "décembre", "decembre", "diciembre", "dicembre"),
        ),
        start=1,
    )
    for name in names
}
WEEKDAYS = {
    name: number
    for number, names in enumerate(
        (
            ("monday", "mon", "montag", "lundi", "lunes", "lunedì", "星期一", "周一"),
            ("tuesday", "tue", "tues", "dienstag", "mardi", "martes", "martedì", "星期二", "周二"),
            ("wednesday", "wed", "mittwoch", "mercredi", "miércoles", "mercoledì", "星期三",
             "周三"),
            ("thursday", "thu", "thurs", "donnerstag", "jeudi", "jueves", "giovedì", "星期四",
             "周四"),
            ("friday", "fri", "freitag", "vendredi", "viernes", "venerdì", "星期五", "周五"),
            ("saturday", "sat", "samstag", "sonnabend", "samedi", "sábado", "sabato", "星期六",
             "周六"),
            ("sunday", "sun", "sonntag", "dimanche", "domingo", "domenica", "星期日", "星期天",
             "周日"),
        ),
        start=1,
    )
    for name in names
}  # fmt: skip
ENGLISH_WEEKDAYS = {n for n in WEEKDAYS if n.isascii() and len(n) > 4}
# every month name and abbreviation, longest first (for regular expressions)
MONTH_NAMES = tuple(sorted({*MONTHS, *FOREIGN_MONTHS}, key=lambda n: (-len(n), n)))


def is_month(word: str) -> bool:
    """Whether `word` (any case, trailing punctuation ignored) names a month."""
    folded = word.strip(".,;:").casefold()
    return folded in MONTHS or folded in FOREIGN_MONTHS
