"""Window vectors through a real daemon: what is embedded, best-window scoring, the
context a hybrid hit hands back, score fusion, and the refill after a restart."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import orjson
from fakes.provider_server import FakeProvider
from test_vectors_daemon import vectors_status, write
from waits import wait_value

from recalld.daemon.index.windows import chunk_windows, embed_units

# Six turns of ~150 characters: one chunk, three windows of two lines at 400 characters.
TURNS = [
    f"Speaker{i}: " + " ".join(f"{word}{i}" for word in (
        "morning", "harbour", "ferry", "ticket", "bakery", "umbrella", "violin", "granite",
        "lantern", "meadow", "orchard", "pebble", "quartz", "saddle", "thistle", "walnut",
        "zephyr", "cobalt")) + "."
    for i in range(6)
]
NOTE = "# Trip\n\n" + "\n".join(TURNS) + "\n"
OTHER = "# Food\n\nRamen and dumplings on a rainy evening.\n"
REL = "memory/2026-07-23/trip.md"


def config(root: Path, fake: FakeProvider, search: str = "") -> str:
    return (f'[workspaces.w]\npath = "{root}"\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            f'api_key = "k", model_name = "m", dimensions = 8}}\n'
            + (f"search = {{{search}}}\n" if search else "")
            + '[daemon]\npersist_delay_s = 0.05\n')


def wait_idle(d: Any) -> dict[str, Any]:
    """The vectors status once every chunk has its vectors and the backfill rests."""
    return wait_value(lambda: vectors_status(d),
                      lambda st: st["total"] and st["coverage"] >= 1.0 and st["state"] == "idle",
                      "every vector, backfill idle")


def passages(fake: FakeProvider) -> list[str]:
    return [t for r in fake.requests if r.path.endswith("/embeddings")
            for t in r.json["input"] if t != "ping"]


def chunk_text() -> str:
    # The note's one body chunk: the title, the blank line and the six turns.
    return NOTE.rstrip("\n")


def test_windows_are_embedded_and_a_hit_hands_back_its_best_window(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    write(root, "digest/personal/food.md", OTHER)
    wins = chunk_windows(chunk_text(), 400)
    assert len(wins) == 3 and embed_units(chunk_text(), 400) == [w.text for w in wins]
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "context_lines = 0"))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_idle(d)
        assert st["embedded"] == st["total"] == 2
        sent = passages(fake)
        # The long chunk went as its three windows (never whole); the short note as itself.
        assert sorted(sent) == sorted([*(w.text for w in wins), OTHER.rstrip("\n")])
        # The fake's vectors are hashes of the text: a query equal to the middle window
        # is nearest to it, so the hit is cut to that window's lines.
        middle = wins[1]
        res = d.call("memory.search", {"agent_id": "w", "query": middle.text,
                                       "max_results": 2})
        assert res["mode"] == "hybrid"
        top = res["results"][0]
        assert top["path"] == REL and top["vector"] > 0.99
        assert top["text"] == middle.text
        # Line numbers in the file: the chunk starts at line 1 of the note.
        assert (top["start_line"], top["end_line"]) == (1 + middle.first, 1 + middle.last)
        assert d.stop() == 0


def test_a_keyword_hit_shows_the_lines_holding_its_terms(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    # The note's words are distinct per turn (zephyr4 only in turn 4), and a last line
    # holds an identifier and Chinese text: whatever window the vector branch likes best
    # (the fake's vectors are hashes), a keyword hit shows the window that matched.
    note = NOTE + "Ticket QX_TORVEL_5831 记录在会议纪要里 by the harbour master.\n"
    root = tmp_path / "ws"
    write(root, REL, note)
    write(root, "digest/personal/food.md", OTHER)
    text = note.rstrip("\n")
    lines = text.split("\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "context_lines = 0"))
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        for word in [*(f"zephyr{i}" for i in range(6)), "qx_torvel_5831", "会议纪要",
                     "Pebble3 and quartz3"]:
            res = d.call("memory.search", {"agent_id": "w", "query": word,
                                           "max_results": 1})
            top = res["results"][0]
            assert res["mode"] == "hybrid" and top["path"] == REL, res
            assert top["keyword"] is not None
            shown = top["text"].casefold()
            assert word.split()[0].casefold() in shown, (word, top)
            # The label names the lines shown (the chunk starts at line 1 of the file).
            first, last = top["start_line"] - 1, top["end_line"] - 1
            assert top["text"] == "\n".join(lines[first:last + 1])
            assert len(top["text"]) < len(text)
        assert d.stop() == 0


def test_whole_chunk_context_and_score_fusion(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    write(root, "digest/personal/food.md", OTHER)
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, 'fusion = "score", context_lines = -1'))
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        wins = chunk_windows(chunk_text(), 400)
        res = d.call("memory.search", {"agent_id": "w", "query": wins[2].text})
        top = res["results"][0]
        assert res["mode"] == "hybrid" and top["path"] == REL
        assert top["text"] == chunk_text() and top["start_line"] == 1
        # Score fusion: the best of both branches scores 1 (each branch scaled to [0, 1]),
        # less the default length penalty of 0.1 per 2,000 characters.
        assert abs(top["score"] - (1.0 - 0.1 * len(chunk_text()) / 2000)) < 1e-6
        assert d.stop() == 0


def test_exact_identifier_still_first_with_windows(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    write(root, "memory/2026-07-24/error.md",
          "# Error\n\nThe deploy failed with ERR_QX_7731 at the gateway.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        for search in ('fusion = "rrf"', 'fusion = "score"'):
            d = daemon_factory(config(root, fake, search))
            d.call("index.sync", {"agent_id": "w"})
            wait_idle(d)
            # Whatever the vector branch says, the note that contains the identifier
            # comes first in either fusion.
            res = d.call("memory.search", {"agent_id": "w", "query": "ERR_QX_7731"})
            assert res["mode"] == "hybrid" and res["vector_hits"] == 2
            top = res["results"][0]
            assert top["path"] == "memory/2026-07-24/error.md" and top["exact"] is True, res
            assert d.stop() == 0


def test_a_damaged_window_file_is_refilled_without_the_provider(daemon_factory: Any,
                                                                tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    data = str(tmp_path / "data")  # every daemon: one data dir, so one embedding cache
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "context_lines = 0"), RECALLD_DATA_DIR=data)
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        assert d.stop() == 0
        saved = list((root / "mem_metadata" / "index").glob("windows*"))
        assert len(saved) == 1
        raw = bytearray(saved[0].read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        saved[0].write_bytes(bytes(raw))
        wins = chunk_windows(chunk_text(), 400)
        for refilled in (3, 0):  # from the cache, then as saved again
            before = len(passages(fake))
            d = daemon_factory(config(root, fake, "context_lines = 0"),
                               RECALLD_DATA_DIR=data)
            st = wait_idle(d)
            assert st["provider_texts"] == 0 and st["cache_texts"] == refilled, st
            assert len(passages(fake)) == before
            res = d.call("memory.search", {"agent_id": "w", "query": wins[2].text})
            assert res["results"][0]["text"] == wins[2].text
            assert "Traceback" not in d.log()
            assert d.stop() == 0
            if refilled:  # the log says what stands in for the damaged file
                assert re.search(r"derived state was corrupt \(.*windows.*\); (the window "
                                 r"vectors are refilled from the embedding cache|generation "
                                 r"\d+ serves)", d.log()), d.log()
                assert "rebuilding" not in d.log()


def newest_manifest(root: Path) -> tuple[int, dict[str, Any]]:
    """The newest generation's number and its manifest's file entries."""
    path = max((root / "mem_metadata" / "index").glob("MANIFEST-*"))
    return (int(path.stem.split("-")[1]),
            orjson.loads(path.read_bytes())["manifest"]["files"])


def test_a_damaged_newest_window_file_says_which_generation_serves(
        daemon_factory: Any, tmp_path: Path) -> None:
    # The newest generation's own window file is damaged, the one before is whole: that
    # one serves, and the log says so (it said "rebuilding []").
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    data = str(tmp_path / "data")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=data)
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        assert d.stop() == 0
        older, _ = newest_manifest(root)
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=data)
        two = "# Two\n\n" + "\n".join(reversed(TURNS)) + "\n"
        write(root, "memory/2026-07-24/two.md", two)
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["total"] == 2
                   and st["coverage"] >= 1.0 and st["state"] == "idle", "two.md embedded")
        assert d.stop() == 0
        newest, files = newest_manifest(root)
        assert newest > older
        damaged = root / "mem_metadata" / "index" / files["windows"]["name"]
        raw = bytearray(damaged.read_bytes())
        raw[-10] ^= 0xFF
        damaged.write_bytes(bytes(raw))
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=data)
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["total"] == 2
                   and st["coverage"] >= 1.0 and st["state"] == "idle", "two.md again")
        log = d.log()
        assert "rebuilding" not in log, log
        served = re.search(r"generation (\d+) serves, the notes changed since it read again "
                           r"from the Markdown", log)
        assert served and older <= int(served[1]) < newest, log
        res = d.call("memory.search", {"agent_id": "w", "query": "Speaker5 morning5"})
        assert {r["path"] for r in res["results"]} >= {REL, "memory/2026-07-24/two.md"}
        assert d.stop() == 0


def index_status(d: Any) -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
    out: dict[str, Any] = ws["index"]
    return out


def test_a_restart_with_nothing_changed_commits_nothing(daemon_factory: Any,
                                                        tmp_path: Path) -> None:
    # Refilling the windows after a restart gives each chunk the vector it has (the mean
    # of its windows, read back from the cache): that is no change to count or commit.
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    write(root, "digest/personal/food.md", OTHER)
    write(root, "memory/2026-07-24/two.md", "# Two\n\n" + "\n".join(reversed(TURNS)) + "\n")
    data = str(tmp_path / "data")
    manifests = root / "mem_metadata" / "index"
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "context_lines = 0"), RECALLD_DATA_DIR=data)
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        assert d.stop() == 0
        saved = sorted(p.name for p in manifests.glob("MANIFEST-*"))
        assert saved
        d = daemon_factory(config(root, fake, "context_lines = 0"), RECALLD_DATA_DIR=data)
        st = wait_idle(d)
        # The windows were saved with the index: none is read back or inserted again.
        assert st["cache_texts"] == 0 and st["provider_texts"] == 0, st
        index = index_status(d)
        assert index["uncommitted_changes"] == 0 and index["last_commit"] is None, index
        # The windows serve: a query equal to a window finds its chunk cut to it.
        last = chunk_windows(chunk_text(), 400)[-1]
        top = d.call("memory.search", {"agent_id": "w", "query": last.text})["results"][0]
        assert top["path"] == REL and top["text"] == last.text
        assert d.stop() == 0
        assert sorted(p.name for p in manifests.glob("MANIFEST-*")) == saved


def test_window_setting_is_checked(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "vector_window_chars = 20"), wait=False)
        assert d.proc.wait(timeout=60) == 2
        assert "vector_window_chars = 20: must be 0 (one vector per chunk) or from 100" in (
            d.log())


def test_a_query_embedded_just_before_a_model_change_ends(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    # The query is embedded in the old space (8-d) while the new one (16-d) completes and
    # takes over: its vector must not be held against the new space's windows.
    root = tmp_path / "ws"
    write(root, REL, NOTE)
    with FakeProvider(dims=8) as fake:
        d = daemon_factory(config(root, fake, "context_lines = 2").replace(
            "dimensions = 8}", "dimensions = 8, use_dimensions = true}"))
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        passages = fake.gate(lambda body: body.get("model") == "m2" and body["input"] != ["ping"])
        query = "walnut3 cobalt3"
        held = fake.gate(lambda body: body.get("input") == [query])
        d.call("workspace.close", {"agent_id": "w"})
        d.call("workspace.open", {"agent_id": "w", "config": {"embedding_model_config": {
            "backend": "openai", "base_url": f"{fake.url}/v1", "api_key": "k",
            "model_name": "m2", "dimensions": 16, "use_dimensions": True}}})
        wait_value(lambda: vectors_status(d), lambda st: st["migrating"], "the model change")
        answer: dict[str, Any] = {}
        searching = threading.Thread(target=lambda: answer.update(
            d.call("memory.search", {"agent_id": "w", "query": query})))
        searching.start()
        assert held.entered.wait(10)
        passages.open()
        wait_value(lambda: vectors_status(d), lambda st: not st["migrating"], "the swap")
        held.open()
        searching.join(30)
        assert answer["results"][0]["path"] == REL, answer
        assert "Traceback" not in d.log()
        # The next query is embedded in the new space and finds its best window again.
        last = chunk_windows(chunk_text(), 400)[-1]
        top = d.call("memory.search", {"agent_id": "w", "query": last.text})["results"][0]
        assert top["vector"] > 0.99 and top["start_line"] == 1 + last.first - 2
        assert d.stop() == 0


def test_a_keyword_hit_shows_the_lines_with_the_whole_phrase(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    # Chinese and Thai are searched by pairs of characters: a window holding the pairs
    # of the query apart (他是负责的，不要责人) holds as many terms as the one holding
    # the phrase whole (负责人); the hit shows the phrase's lines, whatever window the
    # vector branch likes best.
    filler = "今天天气很好，我们去公园散步，看见很多花和树。" * 6
    cases = (("负责人", "他是负责的，不要责人太多。", "负责人是王芳。"),
             ("ระบบไม่ทำงาน", "ระบบดีมาก ฉันไม่ทำงานวันนี้", "เมื่อวานระบบไม่ทำงานเลย"))
    root = tmp_path / "ws"
    for n, (_query, apart, whole) in enumerate(cases):
        rows = [apart + filler, filler, filler, filler, filler, whole + filler]
        write(root, f"memory/2026-07-2{n}/n.md", "# 记录\n\n" + "\n".join(rows) + "\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(config(root, fake, "context_lines = 0"))
        d.call("index.sync", {"agent_id": "w"})
        wait_idle(d)
        for n, (query, _apart, whole) in enumerate(cases):
            res = d.call("memory.search", {"agent_id": "w", "query": query,
                                           "max_results": 1})
            top = res["results"][0]
            assert top["path"] == f"memory/2026-07-2{n}/n.md" and top["keyword"], res
            assert whole in top["text"] and top["end_line"] == 8, (query, top)
        assert d.stop() == 0
