"""What a daemon's search takes in stride: a query of one very long word or of thousands
of identifiers, thousands of filter values, a note whose name is not UTF-8, and bad
parameters."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from test_index_daemon import open_ws, paths, search, workspace, write  # noqa: F401
from waits import wait_value, workspace_status

from recalld.ipc.errors import InvalidParams, PathOutsideWorkspace, UnknownWorkspace


def test_a_long_one_word_query_is_answered_at_once(daemon: Any, workspace: Path) -> None:  # noqa: F811
    """A query of one 100,000-letter word (well inside the frame limit) is answered in a
    fraction of a second: the identifier check reads each word once, not once per letter
    (it took minutes, holding a search thread); so is one of 60,000 identifiers."""
    open_ws(daemon, workspace)
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "x" * 100_000},
                         timeout=20.0)
    assert answer["results"] == []
    answer = daemon.call("memory.search", {"agent_id": "w",
                                           "query": "handle" * 16_000 + "WebSocket"},
                         timeout=20.0)
    assert paths(answer) == ["memory/2026-07-23/commute.md"]
    # Identifiers are still found: camelCase behind digits too.
    assert paths(search(daemon, "handleWebSocketReconnect"))[0] == "memory/2026-07-23/commute.md"
    # 60,000 identifier-like words: each is looked at once, not compared with the others.
    answer = daemon.call("memory.search", {"agent_id": "w", "query": " ".join(
        f"w{i}" for i in range(60_000))}, timeout=20.0)
    assert answer["results"] == []


def test_filters_naming_many_folders_cost_little(daemon: Any, tmp_path: Path) -> None:
    """50,000 path prefixes over 1,000 notes: each note's folders are looked up, not
    compared with every prefix (that took some 20 s, holding a search thread)."""
    root = tmp_path / "ws"
    for i in range(1000):
        write(root, f"memory/d{i % 40}/n{i}.md", f"# Note {i}\n\nthe heron count {i}\n")
    open_ws(daemon, root)
    prefixes = [f"memory/x{i}" for i in range(50_000)] + ["memory/d7/", "memory/d9/n9.md"]
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "heron count",
                                           "max_results": 100,
                                           "filters": {"path_prefix": prefixes}}, timeout=10.0)
    found = set(paths(answer))
    assert found and all(p.startswith("memory/d7/") or p == "memory/d9/n9.md" for p in found)
    assert "memory/d9/n9.md" in found and len(found) == 26


def test_a_path_prefix_may_name_a_folder_by_its_absolute_path(
        daemon: Any, workspace: Path) -> None:  # noqa: F811
    # As workspace.open and workspace.list show the workspace: its folder's own path, or
    # a note's, is that folder or note (not nothing); "/memory" stays the workspace's.
    info = open_ws(daemon, workspace)
    root = info["path"]
    everything = paths(search(daemon, "train"))
    daily = paths(search(daemon, "train", filters={"path_prefix": "memory"}))
    assert daily and daily != everything
    for same in (f"{root}/memory", f"{root}//memory/", "/memory", [f"{root}/memory"]):
        assert paths(search(daemon, "train", filters={"path_prefix": same})) == daily, same
    assert paths(search(daemon, "train", filters={"path_prefix": root})) == everything
    note = f"{root}/memory/2026-07-23/commute.md"
    assert set(paths(search(daemon, "train", filters={"path_prefix": note}))) == {
        "memory/2026-07-23/commute.md"}
    # Another folder's absolute path is still a path inside the workspace, naming nothing.
    assert search(daemon, "train", filters={"path_prefix": f"{root}x/memory"})["results"] == []


def test_search_unknown_workspace_and_bad_params(daemon: Any) -> None:
    with pytest.raises(UnknownWorkspace):
        daemon.call("memory.search", {"agent_id": "nobody", "query": "x"})
    with pytest.raises(InvalidParams):
        daemon.call("memory.search", {"agent_id": "default"})
    with pytest.raises(InvalidParams):
        daemon.call("memory.search", {"agent_id": "default", "query": "x", "max_results": 0})
    assert daemon.call("memory.search", {"agent_id": "default", "query": "x"})["results"] == []
    # A filter naming nothing is refused, whichever way it is written, never read as none.
    for name in ("path_prefix", "bucket", "author"):
        for empty in ("", [], [""], ["memory", ""]):
            with pytest.raises(InvalidParams, match=name):
                daemon.call("memory.search", {"agent_id": "default", "query": "x",
                                              "filters": {name: empty}})
    # A NUL names no file: a filter naming a path with one is refused as such a path is
    # (-32005), never taken as a filter that quietly matches nothing.
    for name, nul in (("path_prefix", "memory\x00"), ("path_prefix", ["memory", "\x00/x"]),
                      ("bucket", "wi\x00ki")):
        with pytest.raises(PathOutsideWorkspace, match=name):
            daemon.call("memory.search", {"agent_id": "default", "query": "x",
                                          "filters": {name: nul}})


@pytest.mark.parametrize("when", ["before start", "while serving"])
def test_a_note_named_in_another_encoding_is_passed_by_and_named_in_the_log(
        daemon: Any, workspace: Path, when: str) -> None:  # noqa: F811
    # A Latin-1 name ("caf\xe9.md") is not UTF-8: no index key, JSON answer or backup
    # member can hold it. It is passed by with a warning; everything else keeps working.
    latin1 = os.fsencode(workspace / "memory" / "2026-07-23") + b"/caf\xe9 notes.md"
    if when == "before start":
        Path(os.fsdecode(latin1)).write_bytes(b"# Cafe\nespressoword\n")
    open_ws(daemon, workspace)
    if when == "while serving":
        Path(os.fsdecode(latin1)).write_bytes(b"# Cafe\nespressoword\n")
        write(workspace, "memory/2026-07-25/later.md", "# Later\nafterword\n")
        assert paths(search(daemon, "afterword", sync=True)) == ["memory/2026-07-25/later.md"]
    assert paths(search(daemon, "ramen", sync=True)) == ["digest/personal/food.md"]
    assert search(daemon, "espressoword")["results"] == []
    health = workspace_status(daemon, "w")
    assert health is not None and health["health"]["state"] == "clean", health
    wait_value(daemon.log, lambda log: "caf\\xe9 notes.md" in log and "not valid UTF-8" in log,
               "the warning")
    archive = daemon.call("backup.create", {"agents": ["w"]})
    assert archive["agents"]["w"]["files"] >= 4


def test_a_note_of_several_authors_is_found_by_each(daemon: Any, tmp_path: Path) -> None:
    # ``author`` as a flow list, as block list lines, as one name, or as no name at all.
    root = tmp_path / "ws"
    write(root, "digest/wiki/flow.md", "---\nauthor: [alice, 'bob']\n---\nThe otter report.\n")
    write(root, "digest/wiki/block.md",
          "---\nauthor:\n  - carol\n  - alice\n---\nThe otter census.\n")
    write(root, "digest/wiki/one.md", "---\nauthor: bob\n---\nThe otter dam.\n")
    write(root, "digest/wiki/odd.md", "---\nauthor: [3, {x: alice}]\n---\nThe otter odd.\n")
    open_ws(daemon, root)

    def by(author: Any) -> set[str]:
        return set(paths(search(daemon, "otter", filters={"author": author})))

    assert by("alice") == {"digest/wiki/flow.md", "digest/wiki/block.md"}
    assert by("bob") == {"digest/wiki/flow.md", "digest/wiki/one.md"}
    assert by("carol") == {"digest/wiki/block.md"}
    assert by(["carol", "bob"]) == {"digest/wiki/flow.md", "digest/wiki/block.md",
                                    "digest/wiki/one.md"}
    assert by("3") == by("dave") == set()


def test_every_agent_appending_to_one_note_stays_its_author(daemon: Any,
                                                           tmp_path: Path) -> None:
    # Agents (and a call naming none) append to one session's note in turn: each one
    # that wrote a part is found by the author filter, whoever wrote last.
    open_ws(daemon, tmp_path / "ws")
    writers = ["coder", None, "Writer Bot", "研究助手", "coder"]
    for n, author in enumerate(writers):
        daemon.call("memory.add_note", {
            "agent_id": "w", "session_id": "shared-log", "name": "log",
            "content": f"The heron count {n} was taken.",
            **({"author": author} if author else {})})
    note = next((tmp_path / "ws/memory").glob("*/log.md")).read_text()
    assert note.count("The heron count") == len(writers), note
    [note_path] = paths(search(daemon, "heron"))
    assert note_path.endswith("/log.md")
    for author in ("coder", "Writer Bot", "研究助手"):
        assert paths(search(daemon, "heron", filters={"author": author})) == [note_path], (
            author, note)
    assert paths(search(daemon, "heron", filters={"author": "nobody"})) == []


def test_an_author_is_found_typed_composed_or_decomposed(daemon: Any, tmp_path: Path) -> None:
    # One name, two Unicode forms (macOS writes decomposed): one author, whichever form
    # the note holds and whichever the search gives, in a list or alone.
    composed = "Zoë Ångström"
    decomposed = unicodedata.normalize("NFD", composed)
    root = tmp_path / "ws"
    write(root, "digest/wiki/typed.md", f"---\nauthor: {composed}\n---\nThe lynx den.\n")
    write(root, "digest/wiki/mac.md", f"---\nauthor: [{decomposed}, bob]\n---\nThe lynx trail.\n")
    open_ws(daemon, root)
    daemon.call("memory.add_note", {"agent_id": "w", "content": "The lynx track.",
                                    "author": decomposed})
    added = {p for p in paths(search(daemon, "lynx")) if p.startswith("memory/")}
    assert len(added) == 1, added
    for form in (composed, decomposed, [decomposed, "carol"]):
        assert set(paths(search(daemon, "lynx", filters={"author": form}))) == {
            "digest/wiki/typed.md", "digest/wiki/mac.md", *added}, ascii(form)


def test_an_integer_past_64_bits_is_refused_with_the_range(daemon: Any) -> None:
    # JSON integers past 64 bits are read as floating-point numbers: "must be an integer"
    # alone would puzzle a caller who sent one; the refusal says the range.
    with daemon.connect() as conn:
        for n, big in enumerate((b"18446744073709551616", b"-9223372036854775809",
                                 b"1" + b"0" * 300)):
            conn.send_bytes(b'{"jsonrpc":"2.0","id":%d,"method":"memory.search","params":'
                            b'{"agent_id":"default","query":"x","max_results":%s}}\n'
                            % (n, big))
            error = conn.recv_response()["error"]
            assert error["code"] == -32602, error
            assert error["message"] == ("param 'max_results' must be an integer from -2**63 "
                                        "to 2**64-1 (JSON integers past it are read as "
                                        "floating-point numbers)"), error
        # The largest one read as an integer is taken (and capped, as any above 100).
        conn.send_bytes(b'{"jsonrpc":"2.0","id":9,"method":"memory.search","params":'
                        b'{"agent_id":"default","query":"x","max_results":'
                        b'18446744073709551615}}\n')
        assert conn.recv_response()["result"]["results"] == []
        # A number with a fraction is no integer, whatever its size.
        conn.send_bytes(b'{"jsonrpc":"2.0","id":10,"method":"memory.search","params":'
                        b'{"agent_id":"default","query":"x","max_results":2.5}}\n')
        error = conn.recv_response()["error"]
        assert error["message"] == "param 'max_results' must be an integer", error


def test_a_client_refuses_numbers_json_cannot_carry(daemon: Any) -> None:
    # JSON has no NaN or infinity; encoded, they were null, so min_score=inf went as no
    # minimum at all and every hit came back. The client refuses them instead.
    from recalld.ipc.aclient import AsyncClient
    from recalld.ipc.client import Client

    with Client(daemon.socket_path) as c:
        c.call("memory.add_note", {"agent_id": "default", "content": "the heron at dusk"})
        assert c.call("memory.search", {"agent_id": "default", "query": "heron",
                                        "min_score": 1e300, "sync": True})["results"] == []
        for bad in (float("inf"), float("nan"), -float("inf")):
            with pytest.raises(InvalidParams, match="finite"):
                c.call("memory.search", {"agent_id": "default", "query": "heron",
                                         "min_score": bad, "sync": True})
            with pytest.raises(InvalidParams, match="finite"):  # at any depth
                c.call("memory.add_note", {"agent_id": "default", "content": "x",
                                           "metadata": {"weights": [1.0, bad]}})
        # A null of its own is sent as it is.
        assert c.call("memory.search", {"agent_id": "default", "query": "heron",
                                        "min_score": None})["results"]

    async def asynchronously() -> None:
        async with AsyncClient(daemon.socket_path) as ac:
            with pytest.raises(InvalidParams, match="finite"):
                await ac.call("memory.search", {"agent_id": "default", "query": "heron",
                                                "min_score": float("inf")})

    import trio
    trio.run(asynchronously)


def test_words_are_found_whatever_their_accents(daemon: Any, tmp_path: Path) -> None:
    """A note written with accents is found by a query typed without them and the other
    way round, a word hyphenated with a soft hyphen is one word, and an identifier written
    with accents is still an exact match (the check reads the note folded as the index
    does)."""
    root = tmp_path / "ws"
    write(root, "memory/2026-03-01/trip.md",
          "# Trip\n\nMet Zoë Müller at the café near Łódź station; she moves to İstanbul.\n")
    write(root, "memory/2026-03-02/plain.md",
          "# Plain\n\nThe resume of the naive intern is on the shared drive.\n")
    write(root, "memory/2026-03-03/shy.md", "# Shy\n\nThe hyphen\u00adation of long "
          "words breaks our display.\n")
    for i in range(30):
        write(root, f"memory/2026-04-{i % 28 + 1:02d}/d{i}.md",
              f"# Deploy {i}\n\nKrakow rollout step {i}: v2 of the service, v2 again.\n")
    write(root, "memory/2026-05-01/needle.md",
          "# 部署记录\n\n" + "今天我们在服务器上完成了新版本的部署和测试工作。" * 12
          + "\n错误出现在 Kraków_v2 模块里。\n")
    open_ws(daemon, root)

    assert paths(search(daemon, "zoe muller cafe lodz istanbul"))[0] == \
        "memory/2026-03-01/trip.md"
    assert paths(search(daemon, "Résumé of the naïve intern"))[0] == \
        "memory/2026-03-02/plain.md"
    assert paths(search(daemon, "hyphenation"))[0] == "memory/2026-03-03/shy.md"
    for query in ("Kraków_v2 错误", "krakow_v2 错误"):
        top = search(daemon, query)["results"][0]
        assert (top["path"], top.get("exact")) == ("memory/2026-05-01/needle.md", True), query


def test_letters_with_a_stroke_and_turkish_capitals_find_their_words(
        daemon: Any, tmp_path: Path) -> None:
    """Letters whose stroke or bar Unicode does not decompose (ø, ł, đ) are folded as
    accents are, Turkish's dotless ı is i, the ligatures œ and æ are oe and ae: a word
    typed in capitals or in plain
    letters finds the note that writes it in lower case with them, and the other way
    round."""
    root = tmp_path / "ws"
    write(root, "memory/2026-06-01/tr.md", "# Gezi\n\nDiyarbakır ve ISPARTA yolculuğu.\n")
    write(root, "memory/2026-06-02/dk.md", "# Rejse\n\nVi kørte fra København til Łódź.\n")
    write(root, "memory/2026-06-03/hr.md", "# Put\n\nĐakovo je mali grad.\n")
    write(root, "memory/2026-06-04/en.md", "# Trip\n\nWe drove from Kyiv to Vilnius.\n")
    write(root, "memory/2026-06-05/fr.md", "# Lecture\n\nL'œuvre complète, encyclopaedia.\n")
    open_ws(daemon, root)
    tr, dk, hr = "memory/2026-06-01/tr.md", "memory/2026-06-02/dk.md", "memory/2026-06-03/hr.md"
    fr = "memory/2026-06-05/fr.md"
    for query, note in (("DIYARBAKIR", tr), ("ısparta", tr), ("diyarbakir", tr),
                        ("kobenhavn", dk), ("lodz", dk), ("ŁÓDŹ", dk),
                        ("dakovo", hr), ("ĐAKOVO", hr), ("oeuvre", fr), ("ŒUVRE", fr),
                        ("encyclopædia", fr)):
        assert paths(search(daemon, query)) == [note], query


def test_arabic_stretched_to_justify_its_line_is_found_as_typed(daemon: Any,
                                                                 tmp_path: Path) -> None:
    # Tatweel (kashida) lengthens a word where a justified line needs room: a note pasted
    # from such a document is found by the word typed plainly, and the other way round.
    root = tmp_path / "ws"
    write(root, "memory/2026-06-05/ar.md", "# اجتماع\n\nمرحـــبا بالعـالم، الاجتمـاع غداً.\n")
    write(root, "memory/2026-06-06/plain.md", "# ملاحظة\n\nالمكتبة مغلقة يوم الجمعة.\n")
    open_ws(daemon, root)
    assert paths(search(daemon, "مرحبا بالعالم")) == ["memory/2026-06-05/ar.md"]
    assert paths(search(daemon, "الاجتماع")) == ["memory/2026-06-05/ar.md"]
    assert paths(search(daemon, "المكتـــبة")) == ["memory/2026-06-06/plain.md"]


def test_arabic_script_letters_typed_one_for_another_find_their_words(
        daemon: Any, tmp_path: Path) -> None:
    # A Persian keyboard types ی and ک where an Arabic one types ي and ك; hamza on alef
    # and teh marbuta are often left off: a query from either finds the note of the other.
    root = tmp_path / "ws"
    fa, ar = "memory/2026-06-07/fa.md", "memory/2026-06-08/ar.md"
    write(root, fa, "# سفر\n\nکتابخانه ملی ایران فردا باز است.\n")
    write(root, ar, "# رحلة\n\nأسامة زار المدرسة الإسلامية.\n")
    write(root, "memory/2026-06-09/en.md", "# Trip\n\nThe library opens tomorrow.\n")
    open_ws(daemon, root)
    for query, note in (("كتابخانه", fa), ("ايران", fa), ("ملي", fa),
                        ("اسامه", ar), ("المدرسه", ar), ("الاسلاميه", ar),
                        ("إيران", fa), ("أسامه", ar)):
        assert paths(search(daemon, query)) == [note], query


def test_a_note_with_a_nul_is_refused_and_nothing_written(daemon: Any) -> None:
    # A NUL in a Markdown note makes it a binary file to every other tool (grep, git,
    # editors); it was written as sent, alone ("\x00") or inside a sentence.
    from recalld.ipc.client import Client

    with Client(daemon.socket_path) as c:
        for params in ({"content": "\x00"}, {"content": "the kestrel\x00 hovers"},
                       {"content": "the kestrel", "description": "bird\x00"}):
            with pytest.raises(InvalidParams, match="must not contain NUL"):
                c.call("memory.add_note", {"agent_id": "default", **params})
        assert c.call("memory.list", {"agent_id": "default"})["files"] == []
        added = c.call("memory.add_note", {"agent_id": "default", "content": "the kestrel"})
        assert added["created"]


def test_a_line_repeating_one_run_of_text_is_not_a_page_of_copies(daemon: Any,
                                                                  tmp_path: Path) -> None:
    # A line longer than a chunk is cut into pieces that all keep its line number; a line
    # that repeats one run of text (a pasted log of one word, a rule of dashes, a run of
    # one letter) gave pieces alike in place and text: the same chunk id several times,
    # one hit shown again and again, crowding out the other notes.
    root = tmp_path / "ws"
    write(root, "digest/wiki/dump.md", "# Dump\n" + "ab " * 5000 + "\n")
    write(root, "digest/wiki/run.md", "# Dump run\n" + "z" * 9000 + "tail\n")
    write(root, "memory/2026-07-23/log.md", "# Log\n\nthe nightly dump ran at noon.\n")
    open_ws(daemon, root)
    answer = search(daemon, "dump", max_results=10)
    hits = [(r["path"], r["start_line"], r["end_line"], r["text"]) for r in answer["results"]]
    assert len(set(hits)) == len(hits), [h[:3] for h in hits]
    assert len({r["chunk_id"] for r in answer["results"]}) == len(hits)
    # Each note is there, and each different piece of a long line once.
    assert set(paths(answer)) == {"digest/wiki/dump.md", "digest/wiki/run.md",
                                  "memory/2026-07-23/log.md"}
    # (The heading opens the line's first piece, cut shorter by it.)
    dump_pieces = [t for p, s, _, t in hits if p == "digest/wiki/dump.md"]
    assert sorted(dump_pieces) == sorted({"# Dump\n" + "ab " * 664, "ab " * 666, "ab " * 340})
    assert [t for p, s, _, t in hits if p == "digest/wiki/run.md" and s == 2][-1].endswith(
        "tail")


def test_a_path_prefix_is_found_typed_composed_or_decomposed(daemon: Any,
                                                             tmp_path: Path) -> None:
    # A folder or note whose name holds accents, written to disk decomposed (macOS, a
    # synced folder) or composed, is one path to the person naming it: a path_prefix
    # (or bucket) typed in the other form named nothing, and the search found nothing.
    nfd = unicodedata.normalize("NFD", "Réunions")
    root = tmp_path / "ws"
    write(root, f"memory/2026-07-23/{nfd}/équipe.md", "# Team\n\nThe heron survey.\n")
    write(root, "digest/Café/menu.md", "# Menu\n\nThe heron pie.\n")
    write(root, "digest/wiki/other.md", "# Other\n\nThe heron elsewhere.\n")
    open_ws(daemon, root)
    team = f"memory/2026-07-23/{nfd}/équipe.md"
    menu = "digest/Café/menu.md"
    for form in ("NFC", "NFD"):
        def named(filters: dict[str, Any], form: str = form) -> list[str]:
            typed = {k: unicodedata.normalize(form, v) for k, v in filters.items()}
            return paths(search(daemon, "heron", filters=typed))
        assert named({"path_prefix": "memory/2026-07-23/Réunions"}) == [team], form
        assert named({"path_prefix": "memory/2026-07-23/Réunions/équipe.md"}) == [team], form
        assert named({"path_prefix": "digest/Café"}) == [menu], form
        assert named({"bucket": "Café"}) == [menu], form
    # A name the notes hold in neither form still names nothing.
    assert paths(search(daemon, "heron", filters={"path_prefix": "digest/Cafe"})) == []


def test_a_name_joined_by_a_middle_dot_is_found_with_or_without_it(daemon: Any,
                                                                   tmp_path: Path) -> None:
    # Japanese joins the parts of a loanword or a foreign name with ・ (half-width ･),
    # Chinese those of a transcribed name with · (or a bullet): typed with the dot or
    # without it, the query finds the note writing the name first, ahead of one holding
    # its parts apart (which sorts first of equals).
    root = tmp_path / "ws"
    cases = (("コンピュータ・ウイルス", "コンピュータとウイルス"),
             ("ｼﾞｮﾝ･ｽﾐｽ", "ジョンとスミス"),
             ("迈克尔·乔丹", "迈克尔和乔丹"),
             ("ジャン゠ポール", "ジャンとポール"),
             ("マイケル•ジョーダン", "マイケルとジョーダン"))
    for i, (name, apart) in enumerate(cases):
        write(root, f"memory/2026-06-0{i + 1}/a.md", f"# メモ\n\n{apart}\n")
        write(root, f"memory/2026-06-0{i + 1}/b.md", f"# メモ\n\n{name}\n")
    open_ws(daemon, root)
    for i, (name, _apart) in enumerate(cases):
        plain = unicodedata.normalize("NFKC", name)
        for dot in "·・•゠":
            plain = plain.replace(dot, "")
        for query in (name, plain):
            assert paths(search(daemon, query))[0] == f"memory/2026-06-0{i + 1}/b.md", query


def test_a_regions_flag_finds_its_own_notes(daemon: Any, tmp_path: Path) -> None:
    # Scotland's, England's and Wales's flags are a black flag and the tag letters naming
    # the region: each finds the notes holding it, not those of the others.
    def flag(region: str) -> str:
        return "\U0001f3f4" + "".join(chr(0xE0000 + ord(c)) for c in region) + "\U000e007f"

    root = tmp_path / "ws"
    regions = ("gbsct", "gbeng", "gbwls")
    for i, region in enumerate(regions):
        write(root, f"memory/2026-06-1{i}/trip.md", f"# Trip\n\nWe cheered {flag(region)}\n")
        write(root, f"memory/2026-06-2{i}/flags.md", f"{flag(region)}\n")  # no word at all
    open_ws(daemon, root)
    for i, region in enumerate(regions):
        assert sorted(paths(search(daemon, flag(region)))) == [
            f"memory/2026-06-1{i}/trip.md", f"memory/2026-06-2{i}/flags.md"], region


def test_an_arabic_alef_is_found_with_or_without_its_hamza(daemon: Any,
                                                           tmp_path: Path) -> None:
    # Much Arabic typing leaves out the hamza or madda of an alef: أحمد and احمد are one
    # name, typed either way in the note or in the query.
    root = tmp_path / "ws"
    write(root, "memory/2026-06-07/a.md", "# اجتماع\n\nقابلت أحمد في إسطنبول.\n")
    write(root, "memory/2026-06-08/b.md", "# ملاحظة\n\nالقران الكريم، امن المدينة.\n")
    write(root, "memory/2026-06-09/c.md", "# أخرى\n\nالطقس جميل اليوم.\n")
    open_ws(daemon, root)
    a, b = "memory/2026-06-07/a.md", "memory/2026-06-08/b.md"
    for query, note in (("احمد", a), ("أحمد", a), ("اسطنبول", a), ("إسطنبول", a),
                        ("القرآن", b), ("آمن", b), ("امن", b)):
        assert paths(search(daemon, query)) == [note], query


def test_a_small_ke_or_ka_is_found_as_its_full_size_kana(daemon: Any, tmp_path: Path) -> None:
    # 霞ヶ関 and 霞ケ関, 一ヵ月 and 一カ月 are one name and one word, written either way.
    root = tmp_path / "ws"
    write(root, "memory/2026-06-10/a.md", "# 出張\n\n霞ヶ関駅で降りて、一ヵ月ぶりに会った。\n")
    write(root, "memory/2026-06-11/b.md", "# 旅行\n\n茅ケ崎の海で三カ月の休みを過ごした。\n")
    write(root, "memory/2026-06-12/c.md", "# 天気\n\n今日は晴れで暖かい。\n")
    open_ws(daemon, root)
    a, b = "memory/2026-06-10/a.md", "memory/2026-06-11/b.md"
    for query, note in (("霞ケ関", a), ("一カ月", a), ("霞ヶ関", a), ("茅ヶ崎", b),
                        ("三ヵ月", b), ("茅ケ崎", b)):
        assert paths(search(daemon, query))[:1] == [note], query
