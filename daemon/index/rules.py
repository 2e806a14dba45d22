"""The versions of the rules a saved index generation was made by: a generation saved
under other rules is made again where they touch it after a load (:mod:`persist`)."""

from __future__ import annotations

# The chunker's and the tokenizer's rules (2: frontmatter joins the first body chunk; 3: a
# code block ends at its own fence, a BOM is no text, paths and dotted names give their
# compound parts, 々 〆 〇 are CJK; 4: secrets after full-width separators and in other
# languages are masked, passwords holding brackets, ``&``, ``;`` whole, and those of
# ``auth=("user", "...")`` pairs; 5: a word goes on through combining marks, so words of
# Indic scripts, Arabic and Hebrew are whole; 6: Thai, Lao, Khmer and Myanmar are paired as
# CJK; 7: a quoted frontmatter value may be followed by a comment; 8: `::` and underscores
# before a dot join compound tokens; 9: frontmatter keys in any script; 10, 11: frontmatter
# values, list items and nested values wrapped over indented lines; 12: YAML's escapes in
# double quotes; 13: flow mappings; 14: a masked value stops before the next setting of its
# run and a bracket closing around it, code naming where a credential comes from is kept,
# PIN codes in Chinese, passwords stated in more languages and values that configuration
# files set apart from their names are masked, a UUID after a bare key and hex after
# words other than a statement of it are not, a value named before its credential word is,
# and more issuers' keys, a token as a URL's user part and base64-wrapped secrets are, as
# are credential elements' values, label lines, .pgpass lines, subscript assignments and
# more command lines' passwords; and the redaction rules of the time; 15: notes not in
# UTF-8 are read as Windows-1252, or by their byte order mark, notetext.py; 16: emoji and
# pictographs are terms; 17: words are folded, accents off Latin and Greek letters,
# Hebrew and Arabic points, soft hyphens and joiners out, ``tokenizer.fold``; 18: a
# frontmatter ``session_id`` that the ``source_conversation`` link beside it names unmasked
# is not masked, ``redact.note_spans``; 19: notes in GBK, Big5 or Shift_JIS are read so,
# notetext.py; 20: the encoding of a note not in UTF-8 is kept, ``FileInfo.encoding``; 21:
# notes in EUC-KR/cp949 or EUC-JP are read so, and short CJK notes by their script,
# notescript.py; more vendors' tokens are masked alone or joined to a name, "basic"
# before a compound word is not, nor are lowercase words joined into one right after a
# credential word, "the token passing-scheme-for-rings"; a token whose alphabet holds
# "-" is found with a "-" or "_" joining a word right after it, ``old_<secret>-2.md``, and
# base64 wrapping a token right after a "/", ``digest/procedure/<base64>.md``); 22: a
# token is read through characters that show nothing inside it
# (``secret_rules.INVISIBLE_IN_TOKEN``); 23: a number after a count of tokens
# (``max_tokens: 4096``) and a setting of words and a number (``token_budget=2000``) are
# not masked; 24: a text ending inside a URL's password, before its "@", is; 25: a number
# after a tokenizer's token id (``eos_token_id: 151645``) is not; 26: a token is read
# through the escapes inside it that spell its characters (``secret_reading``,
# ``ghp%5F...``, ``gh\\x70_...``, a quoted-printable soft line break); 27: and through
# escapes of base64's "/" and "+" (an AWS secret key URL-encoded, JSON's ``\\/``); 28:
# base64 of a text holding a secret anywhere is masked (``secret_base64.BLOB``); a
# generation saved under other rules has its files chunked, masked and tokenized again
# after a load; 29: a private key block not closed in a note keeps its BEGIN line and
# masks its key lines, not the prose below them (``secret_keys.key_blocks``); 30:
# passwords stated in Arabic, Persian, Hebrew, Hindi, Greek, Thai, Turkish, Vietnamese
# and Indonesian are masked, and password names longer than 12 characters are matched;
# 31: a Telegram bot token glued to "bot" (its API URLs), a password stated with the
# verb last ("मेरा पासवर्ड ... है", "... است", "... です") and a credential in a Markdown
# table (the cell after its name, the column under it) are masked; 32: Slack's session
# tokens (``xoxc-``, the ``xoxd-`` cookie) are masked, a Slack prefix before words is not;
# 33: a key wrapped onto the lines below its name or quoted over lines, passwords that
# PowerShell, credential classes, Windows commands and other clients, ``sudo -S``,
# fish's ``set -x``, ``setx``, ``ENV`` and setters take, session cookies outside a Cookie
# header or named (``PHPSESSID``) and a "PAT" stated are masked (``secret_wrapped``,
# ``secret_commands``), "Pat: 555-...", "$env:PW -AsPlainText" and code in brackets after a
# switch, ``-Credential (Get-Credential)``, not; 34: a heading is no chunk by itself (nor
# with only a frontmatter block) before a paragraph over the cap: it takes that
# paragraph's first lines, or the first piece of its overlong line; 35: a closed block of
# fields the frontmatter reader cannot parse, one over 2,000 lines and a TOML ``+++`` block
# join the first body chunk too (``frontmatter.recall_block``); 36: public keys, key ids
# and fingerprints, structured keys and key-file paths, user names after "login", pinned
# versions and settings after a credential word are left alone; Airtable, Tencent Cloud,
# Baidu Qianfan, Zhipu AI and Asana keys, a credential given in parts and a password to
# log in with given in prose are masked; 37: a name with a number glued on (``python3``,
# ``node18``, ``BRCA1``) is indexed under the name too (``tokenizer._word_parts``); 38:
# Latin letters with a stroke or bar and the dotless ``ı`` fold to their base letter
# (``tokenizer.fold``: ``Łódź`` is ``lodz``, ``DIYARBAKIR`` ``diyarbakır``); 39: Arabic's
# tatweel is taken out of words (``textfold.INVISIBLE``: ``مرحـــبا`` is ``مرحبا``); 40:
# the ligatures ``æ`` and ``œ`` are ``ae`` and ``oe`` (``textfold._LIGATURES``); 41: a
# middle dot between CJK characters joins them (``コンピュータ・ウイルス``, ``迈克尔·乔丹``),
# and the katakana middle dot and double hyphen are no CJK characters
# (``tokenizer._JOINING_DOTS``); 42: a region's flag (a black flag and its tag letters)
# is a term of its own (``tokenizer.EMOJI``); 43: Arabic's alef with a hamza or a madda
# (أ إ آ) folds to alef (``textfold._FOLDED_LETTERS``); 44: the small kana ヵ ヶ ゕ ゖ are
# their full-size letters (``textfold.SMALL_KANA``: 霞ヶ関 is 霞ケ関); 45: Arabic-script
# letters written one for another are one: Persian's yeh and keheh and Arabic's, alef
# with a wasla and bare alef, teh marbuta and heh (``textfold._ARABIC_LETTERS``: ``ایران``
# is ``ايران``); 46: setext headings (a line of text underlined with ``=`` or ``-``)
# open sections and name their chunks as ``#`` ones do (``chunker._body``); 47: a line
# inside a comment of the body (``<!-- -->``, ``%% %%``) is no heading and opens no code
# block; 48: a heading's text in the heading path is at most the chunk cap
# (``chunker._title``); 49: a chunk that continues a table ends its heading path with
# the table's header row (``tablerows.table_row``); 50: a heading of no text (``## ``
# alone) is no step of the heading path (``chunker._Builder.emit``), and a JSON object
# at the top of a note (Hugo) is its frontmatter block (``frontmatter_json``), and a
# block that would take the first chunk over the cap is in no chunk's text, its values
# that chunk's index text (``chunker.chunk_markdown``), and a setext heading's text may
# run over several lines, and follow a heading or a code block (``chunker._run``); 51:
# the decimal digits of every script are their ASCII digits (``textfold.DIGIT_ZEROS``:
# ``۲۰۲۶`` is ``2026``), Cyrillic's accented ``ѐ`` and ``ѝ`` are ``е`` and ``и``
# (``textfold._FOLDED_LETTERS``), a word holding a zero-width non-joiner is the word glued
# and its parts (``textfold.ZWNJ``), Devanagari's nukta is dropped and its candrabindu is
# anusvara (``textfold``).
# Raise it with any change of these rules (redact.py's included).
CHUNKING = 51
# The rules by which wikilinks are read and name notes (``links.py``, ``codelines.py``): a
# generation saved under other rules has its graph's edges to no note resolved again after
# a load, and every note read again by the startup reconcile (2 on). 1: as Obsidian
# resolves them (``[[Kafka.md]]``, ``[[wiki/foo]]`` in any case); 2: links in comments
# (``<!-- -->``, ``%% %%``) and escaped ones (``\[[x]]``) are none, and links of one line
# to one note with other headings or aliases are each kept; 3: a comment sign in a
# value of the frontmatter block hides no link of the body (``codelines.visible_lines``).
# Raise it with any change of these rules.
LINKING = 3
