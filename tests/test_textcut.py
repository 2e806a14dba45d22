"""cut_text: a start of a text that ends between whole characters as a reader sees them."""

from __future__ import annotations

import pytest

from recalld.ipc.textcut import cut_text

FAMILY = "👨\u200d👩\u200d👧\u200d👦"


@pytest.mark.parametrize(("text", "limit", "cut"), [
    ("plain text", 5, "plain"),
    ("short", 99, "short"),
    ("e\u0301a\u0308", 3, "e\u0301"),                       # not a without its diaeresis
    ("e\u0301\u0323x", 2, ""),                               # two marks on one letter
    ("\U0001f1ef\U0001f1f5\U0001f1eb\U0001f1f7", 3, "\U0001f1ef\U0001f1f5"),  # half a flag
    ("\U0001f1ef\U0001f1f5\U0001f1eb\U0001f1f7", 4, "\U0001f1ef\U0001f1f5\U0001f1eb\U0001f1f7"),
    (FAMILY + "x", 6, ""),                                   # a ZWJ sequence is whole or out
    (FAMILY + "x", 7, FAMILY),
    ("ok👍🏽", 3, "ok"),                                      # a skin tone stays with its hand
    ("❤\ufe0f!", 1, ""),                                     # an emoji presentation selector
    ("\u1112\u1161\u11ab\u1100\u1161", 2, ""),               # a syllable of conjoining jamo
    ("\u1112\u1161\u11ab\u1100\u1161", 4, "\u1112\u1161\u11ab"),
    ("a\r\nb", 2, "a"),
    ("京都の旅", 2, "京都"),
    ("กำลัง", 1, ""),                                         # Thai sara am after its consonant
    ("ສຳ", 1, ""),                                            # Lao am
    ("क्षत्रिय", 2, ""),                                        # a conjunct is not cut at its virama
    ("क्षत्रिय", 5, "क्ष"),
    ("नमस्ते", 5, "नम"),
    ("ஸ்ரீ", 2, "ஸ்"),                                         # Tamil's virama joins no conjunct
    ("\u0600\u0661\u0662", 1, ""),                           # an Arabic number sign and its number
    ("\u0600\n", 1, "\u0600"),
    ("abc", 0, ""),
    ("abc", -3, ""),
])
def test_cut_text_keeps_clusters_whole(text: str, limit: int, cut: str) -> None:
    assert cut_text(text, limit) == cut


def test_client_side_renderers_cut_whole_characters() -> None:
    """The linked context the MCP tool and the AgentScope tools show, and the hits the
    AgentScope middleware injects, are cut the same way."""
    from recalld.ipc.agentscope_messages import format_hits
    from recalld.ipc.types import SearchResponse, render_linked

    text = "x" + "\U0001f1ef\U0001f1f5" * 2000  # flags: a cut at an even place halves one
    hit = {"path": "digest/flags.md", "start_line": 1, "end_line": 1, "text": text,
           "score": 1.0}
    response = SearchResponse.from_wire({"results": [hit], "expanded": [{**hit, "via": "a.md"}]})
    for shown in (render_linked(response, 999).rsplit("\n", 1)[1],
                  render_linked(response, 1000).rsplit("\n", 1)[1],
                  format_hits(response)[0].rsplit("\n", 1)[1]):
        flags = shown.removesuffix("…").removeprefix("x")
        assert flags and flags == "\U0001f1ef\U0001f1f5" * (len(flags) // 2)
