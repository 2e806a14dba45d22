"""A model whose writes were all refused has saved nothing, whatever it answers: a tool
it was not given (made up, or one of the agent's), a file that is not its session's note,
a daemon field, a frontmatter block the daemon cannot read. The job fails naming the
refusal and the turns stay pending; a model that writes again as told succeeds, and the
note it leaves reads whole (no unreadable block kept as body text, whose lines no later
rewrite could drop)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, turn
from test_dream import AGENT, open_ws, run_job

from recalld.daemon.index.frontmatter import body_of, parse_frontmatter, unreadable_block

DAY = dt.date.today().isoformat()


def calls(*made: tuple[str, Any]) -> Reply:
    return Reply(json=chat_answer(None, [tool_call(name, args, f"c{i}")
                                         for i, (name, args) in enumerate(made)]))


def saved() -> Reply:
    return Reply(json=chat_answer("All saved to memory."))


def pending(daemon: DaemonHandle, session: str) -> int:
    n: int = add(daemon, session, [], agent_id=AGENT)["pending_turns"]
    return n


def test_a_run_whose_every_write_was_refused_fails_and_keeps_its_turns(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    # A note of another session the same day, for the model to aim at.
    fake.script(calls(("daily_write", {"name": "kites", "content": "- Flies kites"})),
                saved())
    add(daemon, "other", turn("I fly kites."), agent_id=AGENT)
    assert run_job(daemon, "auto_memory", {"session_id": "other"})["state"] == "succeeded"
    other = f"memory/{DAY}/kites.md"
    before = (root / other).read_text(encoding="utf-8")
    cases: list[tuple[tuple[str, Any], str]] = [
        (("remember", {"fact": "Keeps bees"}), "unknown tool 'remember'"),
        (("write", {"path": f"memory/{DAY}/bees.md", "content": "- Keeps bees"}),
         "unknown tool 'write'"),
        (("edit", {"path": other, "old": "- Flies kites", "new": "- Flies kites\n- Bees"}),
         "is not this conversation's note"),
        (("frontmatter_update", {"path": "MEMORY.md", "changes": {"bees": True}}),
         f"only notes under memory/{DAY}/"),
        (("daily_write", {"name": "bees", "content":
                          "---\nname: bees\nname: hives\n---\n- Keeps bees"}),
         "frontmatter block (---) that cannot be read"),
        (("daily_write", {"name": "bees", "content":
                          '---\ndescription: "bees\n---\n- Keeps bees'}),
         "frontmatter block (---) that cannot be read"),
        (("daily_write", {"name": "bees", "content": "---\nname: bees\ndescription: Keeps bees\n"}),
         "frontmatter block (---) that cannot be read"),
    ]
    for n, (call, why) in enumerate(cases):
        session = f"s{n}"
        fake.script(calls(call), saved())
        add(daemon, session, turn("I keep bees in the garden."), agent_id=AGENT)
        job = run_job(daemon, "auto_memory", {"session_id": session})
        assert job["state"] == "failed", (call, job)
        assert job["error"].startswith("the note could not be written") and why in job[
            "error"], (call, job["error"])
        told = [m["content"] for m in fake.requests[-1].json["messages"]
                if m["role"] == "tool"]
        assert told and told[0].startswith("error:") and why in told[0], told
        assert pending(daemon, session) == 1, call
    assert (root / other).read_text(encoding="utf-8") == before
    assert sorted(p.name for p in (root / f"memory/{DAY}").iterdir()) == [
        "index.md", "kites.md"]


def test_a_model_told_why_writes_a_readable_note(daemon: DaemonHandle, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    note = f"memory/{DAY}/owls.md"
    fake.script(
        calls(("daily_write", {"name": "owls", "content":
                               "---\nname: owls\nname: birds\ndescription: 'open\n---\n"
                               "- Watches owls at dusk"})),
        calls(("daily_write", {"name": "owls", "description": "birds",
                               "content": "- Watches owls at dusk"})),
        # An edit that would leave the note's own frontmatter unreadable is refused too:
        # a quote or the block left open.
        calls(("edit", {"path": note, "old": "description: birds",
                        "new": 'description: "birds'})),
        calls(("edit", {"path": note, "old": "---\n- Watches", "new": "- Watches"})),
        saved())
    add(daemon, "s-owl", turn("I watch owls at dusk."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s-owl"})
    assert job["state"] == "succeeded", job
    told = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert "cannot be read" in told[0], told
    assert all(t.startswith("error:") and "unreadable" in t for t in told[2:]), told
    text = (root / note).read_text(encoding="utf-8")
    fields, _ = parse_frontmatter(text)
    assert not unreadable_block(text) and fields["session_id"] == "s-owl", text
    assert fields["description"] == "birds" and text.count("---") == 2, text
    assert pending(daemon, "s-owl") == 0


def test_a_write_with_no_text_leaves_no_empty_note(daemon: DaemonHandle, fake: FakeProvider,
                                                   tmp_path: Path) -> None:
    # Nothing to save, said by a write of nothing: no note without a fact in the day's
    # folder and index, and no failure either (the model is told to call no tool).
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    for n, content in enumerate(["", " \n\t\n", "---\ndescription: small talk\n---\n\n",
                                 "\u200b\n\ufeff", "---\nname: chat\n---\n\u200e\u0301\n"]):
        session = f"s{n}"
        fake.script(calls(("daily_write", {"name": "chat", "content": content})),
                    Reply(json=chat_answer("nothing to save")))
        add(daemon, session, turn("Hi!"), agent_id=AGENT)
        job = run_job(daemon, "auto_memory", {"session_id": session})
        assert job["state"] == "succeeded" and job["result"]["note"] is None, job
        told = [m["content"] for m in fake.requests[-1].json["messages"]
                if m["role"] == "tool"]
        assert told[0].startswith("error: the content holds no text"), told
        assert pending(daemon, session) == 0
    assert not (root / "memory" / DAY).exists()


def test_a_frontmatter_key_that_would_not_read_back_is_refused(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # "description " beside "description" (or "name:", a key with a line break) made the
    # whole block unreadable: the note lost its session_id, the next run wrote another.
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    note = f"memory/{DAY}/owls.md"
    fake.script(calls(("daily_write", {"name": "owls", "description": "birds",
                                       "content": "- Watches owls at dusk"})), saved())
    add(daemon, "s", turn("I watch owls at dusk."), agent_id=AGENT)
    assert run_job(daemon, "auto_memory", {"session_id": "s"})["state"] == "succeeded"
    before = (root / note).read_text(encoding="utf-8")
    bad = [{"description ": "owls"}, {"name:": "owls"}, {"topic\nsession_id": "other"},
           {"": "owls"}]
    # The model writes the note as it is (no change: it holds the turns' fact already),
    # then tries the keys: the run succeeds, the note is as it was.
    fake.script(calls(("daily_write", {"name": "owls", "content": "- Watches owls at dusk"}),
                      *(("frontmatter_update", {"path": note, "changes": changes})
                        for changes in bad)), saved())
    add(daemon, "s", turn("Owls again tonight."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s"})
    assert job["state"] == "succeeded" and pending(daemon, "s") == 0, job
    told = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert all("would not read back" in t for t in told[1:]) and len(told) == 5, told
    assert (root / note).read_text(encoding="utf-8") == before
    fake.script(calls(("daily_write", {"name": "owls", "content":
                                       "- Watches owls at dusk\n- Saw a barn owl"})), saved())
    add(daemon, "s", turn("I saw a barn owl."), agent_id=AGENT)
    assert run_job(daemon, "auto_memory", {"session_id": "s"})["state"] == "succeeded"
    assert sorted(p.name for p in (root / f"memory/{DAY}").iterdir()) == [
        "index.md", "owls.md"]
    fields, _ = parse_frontmatter((root / note).read_text(encoding="utf-8"))
    assert fields["session_id"] == "s" and fields["description"] == "birds"


def test_a_frontmatter_value_that_would_read_back_otherwise_is_refused(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Only keys were checked: a mapping's key with a colon read back as another mapping,
    # one named "#" as a comment, a list in a list as its text; the note took them.
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    note = f"memory/{DAY}/otters.md"
    fake.script(calls(("daily_write", {"name": "otters", "description": "river",
                                       "content": "- Counts otters on the river"})), saved())
    add(daemon, "s", turn("I count otters on the river."), agent_id=AGENT)
    assert run_job(daemon, "auto_memory", {"session_id": "s"})["state"] == "succeeded"
    before = (root / note).read_text(encoding="utf-8")
    bad = [{"seen": {"river: Aare": 3}}, {"seen": {"#": 3}}, {"seen": [["Aare", 3]]},
           {"seen": {"spots": {"Aare": 3}}}, {"seen": {"-": 3}}]
    fake.script(calls(("daily_write", {"name": "otters",
                                       "content": "- Counts otters on the river"}),
                      *(("frontmatter_update", {"path": note, "changes": changes})
                        for changes in bad),
                      ("frontmatter_update", {"path": note, "changes": {
                          "seen": {"Aare": 3, "Reuss": True}}})), saved())
    add(daemon, "s", turn("Three otters in the Aare."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s"})
    assert job["state"] == "succeeded", job
    told = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert len(told) == 7 and all("would not read back the value of 'seen'" in t
                                  for t in told[1:5]), told
    assert "would not read back with the key 'seen'" in told[5], told  # no block at all
    assert not told[6].startswith("error"), told
    after = (root / note).read_text(encoding="utf-8")
    assert parse_frontmatter(after)[0] == {**parse_frontmatter(before)[0],
                                           "seen": {"Aare": 3, "Reuss": True}}
    assert body_of(after)[0] == body_of(before)[0]


def test_a_tool_name_in_a_namespace_is_that_tool(daemon: DaemonHandle, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    # Models trained on OpenAI's harmony or Codex formats call "functions.daily_write",
    # Gemini "default_api.daily_write": refused as unknown, their notes were never written.
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    note = f"memory/{DAY}/herons.md"
    fake.script(calls(("functions.remember", {"fact": "Herons"}),
                      ("other.daily_write", {"name": "herons", "content": "- Herons"}),
                      ("functions.functions.daily_write", {"name": "herons",
                                                           "content": "- Herons"}),
                      ("functions.daily_write", {"name": "herons", "description": "birds",
                                                 "content": "- Photographs herons"}),
                      ("tools.read", {"path": note}),
                      ("default_api.edit", {"path": note, "old": "- Photographs herons",
                                            "new": "- Photographs grey herons"}),
                      ("tools.frontmatter_update", {"path": note,
                                                    "changes": {"place": "lake"}})), saved())
    add(daemon, "s", turn("I photograph grey herons at the lake."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s"})
    assert job["state"] == "succeeded" and pending(daemon, "s") == 0, job
    told = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert [t.startswith("error: unknown tool") for t in told] == [
        True, True, True, False, False, False, False], told
    text = (root / note).read_text(encoding="utf-8")
    assert "- Photographs herons" in told[4], told[4]  # read before the edit
    fields, _ = parse_frontmatter(text)
    assert fields["session_id"] == "s" and fields["place"] == "lake"
    assert body_of(text)[0].strip() == "- Photographs grey herons"
