"""auto_dream with node names of other shapes than words, and notes still being written:
a real daemon, a real socket and a scripted OpenAI-compatible model (see test_dream.py)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from waits import wait_for


def digest_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "digest").rglob("*.md"))


def unseen(text: str) -> list[str]:
    """The characters of ``text`` that show nothing: controls (but line breaks), format
    characters (zero width, bidi), variation selectors."""
    return [f"U+{ord(c):04X}" for c in text if c != "\n" and (
        unicodedata.category(c) in ("Cc", "Cf") or "\ufe00" <= c <= "\ufe0f")]


def test_names_without_letters_get_files_of_their_own(daemon: DaemonHandle,
                                                      fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    """Emoji and punctuation names all became ``node.md``: the second was refused as
    another node of that file, with advice the model could not act on. Each now has a
    file named by its characters, the same one whenever the name comes back."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "Tea, rockets, love, a family, a flag and a loud warning.\n")
    open_ws(daemon, root, fake)
    names = ["🍵", "🚀", "❤️", "👨\u200d👩\u200d👧", "🇫🇷", "🇩🇪", "!!!", "‼️"]
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": n,
                                     "content": f"- about {n}", "reason": "seen"})
                      for n in names]]
    first = dream(daemon)
    assert first["actions"] == {"CREATE": len(names)}, (first, model.tool_results)
    files = digest_files(root)
    assert len(files) == len(names) and "digest/wiki/node.md" not in files
    assert "digest/wiki/teacup-without-handle.md" in files
    assert "digest/wiki/man-woman-girl.md" in files
    assert all(not unseen(f) for f in files), files
    by_name = {node(root, f)[0]["name"]: f for f in files}
    assert sorted(by_name) == sorted(names)
    write(root, b, "Tea and rockets again.\n")
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": n,
                                     "content": f"- about {n}", "sources": [b],
                                     "reason": "again"}) for n in ("🍵", "🚀")]]
    second = dream(daemon)
    assert second["actions"] == {"CORROBORATE": 2}, (second, model.tool_results)
    assert digest_files(root) == files
    assert node(root, by_name["🚀"])[0]["sources"] == [a, b]


def test_invisible_characters_are_left_out_of_names(daemon: DaemonHandle,
                                                    fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    """A name with zero-width characters, a bidi override or a terminal escape was kept
    as written: a look-alike of another node (``ad\\u200bmin``), or a name shown in
    another order (``\\u202e``). They are left out of the name, its title and its file;
    right-to-left names, and a joiner inside a Persian word, stay as written."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "The admin account; the invoice; مرحبا; می‌خواهم.\n")
    open_ws(daemon, root, fake)
    plan = {"admin": "admin", "invoice\u202etxt.exe": "invoicetxt.exe",
            "\u2066Deploy\u2069 \x1b[1mnow\u00ad": "Deploy [1mnow",
            "مرحبا \u200fبالعالم": "مرحبا بالعالم", "می\u200cخواهم": "می\u200cخواهم"}
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": name,
                                     "description": f"about\u200b {name}",
                                     "content": "- noted", "reason": "seen\u202e"})
                      for name in plan]]
    first = dream(daemon)
    assert first["actions"] == {"CREATE": len(plan)}, (first, model.tool_results)
    for f in digest_files(root):
        fields, text = node(root, f)
        assert fields["name"] in plan.values() and f"# {fields['name']}\n" in text
        if fields["name"] == "می\u200cخواهم":  # the joiner, only there
            assert f == "digest/wiki/می\u200cخواهم.md"
            f, text = f.replace("\u200c", ""), text.replace("\u200c", "")
        assert unseen(f) == [] and unseen(text) == [], (f, text)
    # A look-alike of a node is that node, not a second one.
    write(root, b, "The admin account again.\n")
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                     "name": "ad\u200bmi\u200dn", "content": "- noted",
                                     "sources": [b], "reason": "again"})]]
    second = dream(daemon)
    assert second["actions"] == {"CORROBORATE": 1}, (second, model.tool_results)
    assert node(root, "digest/wiki/admin.md")[0]["sources"] == [a, b]
    log = (root / second["log"]).read_text(encoding="utf-8")
    assert "\u200b" not in log and "\u202e" not in (root / first["log"]).read_text()


def test_a_note_whose_frontmatter_is_not_closed_is_not_sent(daemon: DaemonHandle,
                                                            fake: FakeProvider,
                                                            tmp_path: Path) -> None:
    """A note with an opening ``---`` and fields but no closing fence yet (being written)
    was sent to the model as if its fields were text; it is read once it has a body. A
    rule followed by prose is a body."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    writing = "memory/2026-11-20/writing.md"
    ruled = "memory/2026-11-20/ruled.md"
    write(root, writing, "---\nsession_id: s1\ntags:\n  - a\n\n")
    write(root, "memory/2026-11-20/fence.md", "---\n\n")
    write(root, ruled, "---\nTODO: call Ana about the lease\n")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    assert first["notes"] == 3, first
    asked = [r.json["messages"][1]["content"].split(":", 1)[0]
             for r in fake.requests if r.path.endswith("/chat/completions")]
    assert asked == [f"Daily note {ruled}"], asked
    write(root, writing, "---\nsession_id: s1\n---\nThe user moved to Lisbon.\n")
    second = dream(daemon)
    assert second["notes"] == 1
    asked = [r.json["messages"][1]["content"].split(":", 1)[0]
             for r in fake.requests if r.path.endswith("/chat/completions")]
    assert asked == [f"Daily note {ruled}", f"Daily note {writing}"], asked
    assert model.plan == {}


def test_prose_after_a_rule_that_looks_like_fields_is_read_by_the_next_run(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """``---`` then lowercase ``key: value`` lines reads as a frontmatter block not closed
    yet; it was recorded as read and never dreamed until it changed. Unchanged at the next
    run, it is no note being written: it is read then. One still changing waits."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    prose = "memory/2026-11-21/errands.md"
    growing = "memory/2026-11-21/growing.md"
    write(root, prose, "---\nnote: buy oat milk\nplace: the shop on rua augusta\n")
    write(root, growing, "---\nsession_id: s9\n")
    open_ws(daemon, root, fake)

    def asked() -> list[str]:
        return list(dict.fromkeys(r.json["messages"][1]["content"].split(":", 1)[0]
                                  for r in fake.requests
                                  if r.path.endswith("/chat/completions")))

    first = dream(daemon)
    assert first["notes"] == 2 and asked() == [], (first, asked())
    write(root, growing, "---\nsession_id: s9\ntopic: lisbon\n")
    model.plan[prose] = [[("integrate", {
        "action": "CREATE", "bucket": "personal", "name": "Errands",
        "content": "- buy oat milk at the shop on rua augusta", "reason": "errand"})]]
    second = dream(daemon)
    assert second["notes"] == 2 and second["actions"] == {"CREATE": 1}, second
    assert asked() == [f"Daily note {prose}"], asked()
    assert any("note: buy oat milk" in r.json["messages"][1]["content"]
               for r in fake.requests if r.path.endswith("/chat/completions"))
    assert node(root, "digest/personal/errands.md")[0]["sources"] == [prose]
    third = dream(daemon)  # read: not again; the other one stayed as it was
    assert third["notes"] == 1 and asked() == [f"Daily note {prose}", f"Daily note {growing}"]
    assert dream(daemon)["notes"] == 0


def test_a_new_name_told_apart_only_by_accents_or_punctuation_is_no_second_node(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """``Zoe Orsted`` and ``e-mail setup`` made second nodes beside ``Zoë Ørsted`` and
    ``Email setup``: the same person or procedure in two files, each half of it. The model
    is now told the node that exists; words that marks tell apart in other scripts, and
    names of no letter, stay apart."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    one, two = "memory/2026-11-28/a.md", "memory/2026-11-29/b.md"
    zoe, mail = "digest/personal/zoë-ørsted.md", "digest/procedure/email-setup.md"
    write(root, one, "Zoë Ørsted likes tea. Email setup: use IMAP.\n")
    open_ws(daemon, root, fake)

    def create(bucket: str, name: str, **more: object) -> tuple[str, dict[str, object]]:
        return ("integrate", {"action": "CREATE", "bucket": bucket, "name": name,
                              "content": "- likes tea" if bucket == "personal" else
                              "- use IMAP", "reason": "fact", **more})

    model.plan[one] = [[create("personal", "Zoë Ørsted"), create("procedure", "Email setup"),
                        create("wiki", "🍵"), create("wiki", "किम")]]
    assert dream(daemon)["actions"] == {"CREATE": 4}
    write(root, two, "Zoe Orsted likes tea, again. E-mail setup: IMAP still.\n")
    model.plan[two] = [
        [create("personal", "ZOE ORSTED"), create("procedure", "E-mail setup!"),
         create("wiki", "🚀"), create("wiki", "कोम")],
        [create("personal", "Zoë Ørsted", node=zoe),
         create("procedure", "Email setup", node=mail)]]
    result = dream(daemon)
    assert result["actions"] == {"refused": 2, "CREATE": 2, "CORROBORATE": 2}, (
        result, model.tool_results)
    refusals = [r for r in model.tool_results if r.startswith("refused")]
    assert len(refusals) == 2 and f"{zoe} ('Zoë Ørsted')" in refusals[0], refusals
    assert f"{mail} ('Email setup')" in refusals[1], refusals
    assert sorted(p.name for p in (root / "digest/personal").iterdir()) == ["zoë-ørsted.md"]
    assert sorted(p.name for p in (root / "digest/procedure").iterdir()) == ["email-setup.md"]
    assert node(root, zoe)[0]["sources"] == [one, two]
    assert node(root, mail)[0]["sources"] == [one, two]
    assert len(list((root / "digest/wiki").iterdir())) == 4


def test_a_rewrite_naming_an_accent_variant_of_a_node_is_pointed_at_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A REFINE, CORROBORATE or CORRECT naming ``Zoe Orsted`` (by its path or its name)
    beside the node ``Zoë Ørsted`` heard "needs an existing node" and was never told
    which node it meant; now it is named, and nothing is written."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    one, two = "memory/2026-11-28/a.md", "memory/2026-11-29/b.md"
    zoe = "digest/personal/zoë-ørsted.md"
    write(root, one, "Zoë Ørsted likes tea.\n")
    open_ws(daemon, root, fake)
    model.plan[one] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                       "name": "Zoë Ørsted", "content": "- likes tea",
                                       "reason": "fact"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    before = (root / zoe).read_text(encoding="utf-8")
    write(root, two, "Zoe Orsted likes green tea.\n")
    model.plan[two] = [[
        ("integrate", {"action": "REFINE", "bucket": "personal",
                       "node": "digest/personal/zoe-orsted.md", "content": "- green tea",
                       "reason": "detail"}),
        ("integrate", {"action": "CORROBORATE", "bucket": "personal", "name": "ZOE ORSTED!",
                       "reason": "again"}),
        ("integrate", {"action": "CORRECT", "bucket": "personal", "name": "Zoe-Orsted",
                       "content": "- green tea", "reason": "changed"})]]
    result = dream(daemon)
    assert result["actions"] == {"refused": 3}, (result, model.tool_results)
    for told in model.tool_results[-3:]:
        assert told.startswith("refused") and f"{zoe} ('Zoë Ørsted')" in told, told
        assert "accents, case or punctuation" in told, told
    assert (root / zoe).read_text(encoding="utf-8") == before
    assert sorted(p.name for p in (root / "digest/personal").iterdir()) == ["zoë-ørsted.md"]


def test_names_and_links_with_nothing_seen_are_refused_saying_why(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A ``related`` entry or a node name of only invisible characters, marks or spaces
    (a BOM, a combining acute, a variation selector, a Hangul filler) would name a file
    hashed from nothing a person can read: each call is refused saying why, and the
    model's calls without them are applied."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-08/odd.md"
    write(root, note, "Kettle: 1.7 litres. Teapot: glass.\n")
    open_ws(daemon, root, fake)

    def create(name: str, related: list[str] | None = None,
               content: str = "- 1.7 litres") -> tuple[str, dict[str, object]]:
        return ("integrate", {"action": "CREATE", "bucket": "wiki", "name": name,
                              "content": content, "reason": "fact",
                              **({"related": related} if related else {})})

    model.plan[note] = [[create("Kettle", ["\ufeff"]), create("Kettle", ["wiki/\u3164 "]),
                         create("\u0301\u0301"), create("\ufe0f \u034f")],
                        [create("Teapot", content="- made of glass"), create("Kettle", ["Teapot"])]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 2}, (result, model.tool_results)
    refused = model.tool_results[:4]
    assert all(r.startswith("error:") and "no character that is seen" in r for r in refused)
    assert r"'\ufeff'" in refused[0] and r"'\u0301\u0301'" in refused[2], refused
    assert digest_files(root) == ["digest/wiki/kettle.md", "digest/wiki/teapot.md"]
    fields, _ = node(root, "digest/wiki/kettle.md")
    assert fields["related"] == ["digest/wiki/teapot.md"], fields


def test_a_link_to_a_node_named_without_its_accents_names_that_node(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A new name only accents tell from a node's was refused at CREATE pointing at that
    node, but a ``related`` entry so spelled was only "no such node". Now the model is
    told the node of a name alike, and links it on its next call."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-10/people.md"
    write(root, note, "Zoë Ørsted leads the team; Ann reports to her.\n")
    open_ws(daemon, root, fake)
    zoe, ann = "digest/personal/zoë-ørsted.md", "digest/personal/ann.md"

    def create(name: str, related: str | None = None) -> tuple[str, dict[str, object]]:
        return ("integrate", {"action": "CREATE", "bucket": "personal", "name": name,
                              "content": f"- {name} is on the team", "reason": "who",
                              **({"related": [related]} if related else {})})

    model.plan[note] = [[create("Zoë Ørsted")], [create("Ann", "Zoe Orsted")],
                        [("integrate", {"action": "CORROBORATE", "node": ann,
                                        "related": [zoe], "reason": "link"})]]
    dream(daemon)
    told = model.tool_results[1]
    assert "not linked, no such node: digest/personal/zoe-orsted.md (a node of a name " \
           f"alike: {zoe})" in told, model.tool_results
    fields, _ = node(root, ann)
    assert fields["related"] == [zoe], fields


def test_names_of_blank_looking_letters_and_symbols_are_refused(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The braille blank, the musical null notehead, the Khmer inherent vowels and code
    points reserved as default ignorable show nothing, yet named a node (its file
    ``braille-pattern-blank.md``). Each such name or link is refused saying why; braille
    that shows (``⠞⠑⠁``) still names a node."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-09/blank.md"
    write(root, note, "Kettle: 1.7 litres.\n")
    open_ws(daemon, root, fake)

    def create(name: str, related: list[str] | None = None) -> tuple[str, dict[str, object]]:
        return ("integrate", {"action": "CREATE", "bucket": "wiki", "name": name,
                              "content": "- 1.7 litres", "reason": "fact",
                              **({"related": related} if related else {})})

    blanks = ["\u2800", " \u2800\u2800 ", "\U0001d159", "\u17b4", "\u2065\ufff3", "\u2800\u3164"]
    model.plan[note] = [[*(create(b) for b in blanks), create("Kettle", ["wiki/\u2800.md"])],
                        [create("⠞⠑⠁")]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1}, (result, model.tool_results)
    refused = model.tool_results[:len(blanks) + 1]
    assert all(r.startswith("error:") and "no character that is seen" in r
               for r in refused), refused
    files = digest_files(root)
    assert len(files) == 1 and node(root, files[0])[0]["name"] == "⠞⠑⠁", files


def test_a_dream_names_a_note_named_by_a_credential_masked_in_its_progress(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """While a dream asks the model about a daily note whose name is a token, the job's
    progress (``jobs.get``, ``job.progress``) named the note with the token; it names it
    masked, as search does."""
    root = tmp_path / "ws"
    token = "ghp_" + "Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9Lz1Xc3Vb5"
    write(root, f"memory/2026-11-20/{token}.md", "The cat is called Miso.\n")
    open_ws(daemon, root, fake)
    fake.script(Reply(delay_s=30))  # the model's answer hangs: the job stays on the note
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream"})["job_id"]
    wait_for(lambda: not fake.pending_script(), "the model to be asked about the note")
    job = daemon.call("jobs.get", {"agent_id": AGENT, "job_id": job_id})
    assert job["progress"]["message"] == "memory/2026-11-20/[REDACTED].md", job
    assert token not in str(job), job
    daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})


def test_a_note_a_dream_skips_is_named_masked_in_the_log(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A daily note a dream passes by (here a symbolic link) was named in the log as it
    is, a token in its name too; it is named masked, as search names it."""
    root = tmp_path / "ws"
    token = "ghp_" + "Zx8Cv6Bn4Ma2Sd0Fg8Hj6Kl4Qw2Er0Ty8Ui6"
    write(root, "elsewhere.md", "Not a daily note.\n")
    (root / "memory/2026-11-21").mkdir(parents=True)
    (root / f"memory/2026-11-21/{token}.md").symlink_to(root / "elsewhere.md")
    open_ws(daemon, root, fake)
    dream(daemon)
    log = daemon.log()
    assert "dream skips memory/2026-11-21/[REDACTED].md: " in log and token not in log



def test_a_node_named_as_obsidian_links_it_or_by_its_name_is_that_node(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """``node`` given as ``[[digest/wiki/kite-club]]`` (a link without ``.md``, as the
    nodes' own Obsidian links are written) or as the node's name was refused ("node must
    be a path like ..."), though ``related`` took both."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    club = "digest/wiki/klub-latawców.md"
    a, b, c = ("memory/2026-08-01/kites.md", "memory/2026-08-02/kites.md",
               "memory/2026-08-03/kites.md")
    write(root, a, "Zofia's kite club (Klub Latawców) meets on Sundays.\n")
    write(root, b, "Klub Latawców: Sundays again.\n")
    write(root, c, "Klub Latawców: Sundays, at the dunes.\n")
    made = {"action": "CREATE", "bucket": "wiki", "name": "Klub Latawców",
            "content": "- meets on Sundays", "reason": "fact"}
    model.plan[a] = [[("integrate", made)]]
    model.plan[b] = [[("integrate", {**made, "action": "CORROBORATE",
                                     "node": "[[digest/wiki/klub-latawców]]"})]]
    model.plan[c] = [[("node_read", {"path": club})], [("integrate", {
        **made, "action": "REFINE", "node": "Klub Latawców",
        "content": "- meets on Sundays, at the dunes"})]]
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1, "CORROBORATE": 1, "REFINE": 1}, \
        (result, model.tool_results)
    fields, text = node(root, club)
    assert fields["sources"] == [a, b, c] and "at the dunes" in text, text


def test_a_create_naming_another_city_in_devanagari_or_arabic_is_no_corroboration(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Words were cut at their combining marks (vowel signs, viramas, Arabic points), so
    a node saying the sister lives in चेन्नई (Chennai) or بَغْدَادَ (Baghdad) "held" a
    later note's line naming रांची (Ranchi) or دُبَيّ (Dubai): the model's CREATE was taken
    as a corroboration of the claim the note contradicts. It is refused, and a line that
    only adds a word keeps the node's line as before."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b, c = ("memory/2026-11-20/a.md", "memory/2026-11-21/b.md",
               "memory/2026-11-22/c.md")
    write(root, a, "मेरी बहन चेन्नई में रहती है। تَسْكُنُ أُخْتِي فِي بَغْدَادَ\n")
    open_ws(daemon, root, fake)

    def creates(hindi: str, arabic: str) -> list[list[tuple[str, Any]]]:
        return [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "बहन",
                                "content": f"- मेरी बहन {hindi} में रहती है",
                                "reason": "fact"}),
                 ("integrate", {"action": "CREATE", "bucket": "personal", "name": "أختي",
                                "content": f"- تَسْكُنُ أُخْتِي فِي {arabic}",
                                "reason": "fact"})]]

    model.plan[a] = creates("चेन्नई", "بَغْدَادَ")
    assert dream(daemon)["actions"] == {"CREATE": 2}, model.tool_results
    hi, ar = (f for f in digest_files(root) if f.startswith("digest/personal/"))
    if "बहन" not in hi:
        hi, ar = ar, hi
    write(root, b, "मेरी बहन रांची में रहती है। تَسْكُنُ أُخْتِي فِي دُبَيّ\n")
    model.plan[b] = creates("रांची", "دُبَيّ")
    second = dream(daemon)
    assert second["actions"] == {"refused": 2}, (second, model.tool_results)
    for rel, city in ((hi, "चेन्नई"), (ar, "بَغْدَادَ")):
        fields, text = node(root, rel)
        assert fields["sources"] == [a] and fields["corroborations"] == 0, fields
        assert city in text
    write(root, c, "फिर से: मेरी बहन चेन्नई में रहती है। تَسْكُنُ أُخْتِي فِي بَغْدَادَ\n")
    model.plan[c] = creates("चेन्नई", "بَغْدَادَ")
    assert dream(daemon)["actions"] == {"CORROBORATE": 2}, model.tool_results
    assert node(root, hi)[0]["sources"] == [a, c]
