"""HTML pages saved into resource/ are summarised from the text a reader sees: a saved
web page opens with tens of kilobytes of styles and scripts, which were all the model
was shown of it."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import catalog, open_ws, wait_state

STYLE = "<style>" + ".nav{color:#333;margin:0 auto}\n" * 800 + "</style>"
SCRIPT = ("<script>" + "window.dataLayer=window.dataLayer||[];function gtag(){}\n" * 600
          + "if (a < b && c > d) { render('<p>not text</p>'); }</script>")


def page(body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"nb\"><head><meta charset=\"utf-8\">"
            f"<title>Budsjett 2027 &ndash; Oslo</title>{STYLE}{SCRIPT}</head>"
            f"<body><svg><text>logo</text></svg>{body}<noscript>Slå på JavaScript"
            f"</noscript></body></html>")


def test_a_page_is_read_as_its_text_not_its_styles_and_scripts(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/budget.html", page(
        "<article><h1>Budsjett</h1><p>Kvartalsbudsjettet er\n  42&nbsp;millioner "
        "kroner.</p><ul><li>Skole</li><li>Vei &amp; bane</li></ul>"
        "<p>会议在北京<br>举行。</p></article>"))
    long_text = "".join(f"<p>Avsnitt {n}: hendelser i Bergen.</p>" for n in range(4000))
    write(root, "resource/long.htm", page(long_text))
    open_ws(daemon, "res", root, fake)
    for rel in ("resource/budget.html", "resource/long.htm"):
        wait_state(root, rel, "processed", "skipped", "failed")
        assert catalog(root)[rel]["state"] == "processed", catalog(root)[rel]
    asked = {r.json["messages"][1]["content"].split(" (", 1)[0]: r.json["messages"][1]["content"]
             for r in fake.requests if r.path.endswith("/chat/completions")}
    budget = asked["File resource/budget.html"]
    assert budget.split("\n\n", 1)[1] == (
        "Budsjett 2027 – Oslo\n# Budsjett\nKvartalsbudsjettet er 42 millioner kroner.\n"
        "- Skole\n- Vei & bane\n会议在北京\n举行。"), budget
    assert "first part only" not in budget.split("\n\n", 1)[0]
    # A page whose text goes past what the model is shown: its first part, from its text.
    long = asked["File resource/long.htm"]
    assert "first part only" in long.split("\n\n", 1)[0]
    assert long.split("\n\n", 1)[1].startswith(
        "Budsjett 2027 – Oslo\nAvsnitt 0: hendelser i Bergen.\nAvsnitt 1:"), long[:300]
    for text in asked.values():
        assert "gtag" not in text and "margin" not in text and "logo" not in text
        assert "not text" not in text and "JavaScript" not in text


def test_a_page_in_the_encoding_it_declares_is_read_in_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Windows-1251 and KOI8-R text was skipped as "not UTF-8" though the page names its
    # encoding; a guess (Windows-1252, GBK) gives way to what the page says.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    text = "Встреча в понедельник в Казани."
    pages = {
        "resource/cp1251.html": ('<html><head><meta charset="windows-1251"></head>'
                                 f"<body><p>{text}</p></body></html>", "cp1251"),
        "resource/koi8.htm": ('<HTML><HEAD><META HTTP-EQUIV="Content-Type" CONTENT="text/html;'
                              f' charset=koi8-r"></HEAD><BODY>{text}</BODY></HTML>', "koi8_r"),
        "resource/latin1.html": ("<meta charset=iso-8859-1><p>Caf\u00e9 \u00e0 Li\u00e8ge, "
                                 "d\u00e9j\u00e0 vu.</p>", "latin-1"),
    }
    for rel, (markup, encoding) in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(markup.encode(encoding))
    open_ws(daemon, "res", root, fake)
    for rel in pages:
        wait_state(root, rel, "processed", "skipped", "failed")
        assert catalog(root)[rel]["state"] == "processed", catalog(root)[rel]
    asked = [r.json["messages"][1]["content"].split("\n\n", 1)[1]
             for r in fake.requests if r.path.endswith("/chat/completions")]
    assert sorted(asked) == sorted(
        [text, text, "Caf\u00e9 \u00e0 Li\u00e8ge, d\u00e9j\u00e0 vu."])


def test_a_pages_table_is_read_as_a_table_and_its_passwords_are_not_sent(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A saved admin page listing accounts: its table reaches the model as a table, rows
    under their header, and its definition list as one, each definition below its term,
    so the passwords are masked as in a note (cell by cell on lines of their own, a
    password stood below a user name, unrecognised)."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    passwords = ("Hunter2Pass", "Tr0ub4dor&3")
    write(root, "resource/accounts.html", page(
        "<h1>Accounts</h1><table><thead><tr><th>User</th><th>Password</th></tr></thead>"
        "<tbody><tr><td>bob</td><td>Hunter2Pass</td></tr>"
        "<tr><td>amy</td><td><p>Tr0ub4dor&amp;3</p></td></tr>"
        "<tr><td>cat | dog</td><td>changeme</td></tr></tbody></table><p>Rotate monthly.</p>"
        "<dl><dt>Root password</dt><dd>Zq8mN2pL4x</dd><dt>Host</dt><dd>db.internal</dd>"
        "<dt>Note</dt><dd></dd></dl>"))
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/accounts.html", "processed", "skipped", "failed")
    asked = [r.json["messages"][1]["content"].split("\n\n", 1)[1]
             for r in fake.requests if r.path.endswith("/chat/completions")]
    assert asked == ["Budsjett 2027 – Oslo\n# Accounts\n| User | Password |\n|---|---|\n"
                     "| bob | [REDACTED] |\n| amy |  [REDACTED]  |\n| cat \\| dog | changeme |\n"
                     "Rotate monthly.\nRoot password\n: [REDACTED]\nHost\n: db.internal\n"
                     "Note"], asked
    assert not any(p in text for p in (*passwords, "Zq8mN2pL4x") for text in asked)
