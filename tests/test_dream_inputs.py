"""auto_dream with odd but possible model arguments: a real daemon, a real socket and a
scripted OpenAI-compatible model (see test_dream.py)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, run_job, write
from waits import wait_job

from recalld.daemon.memory import digest

SECRET = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1w"


def cat_note(daemon: DaemonHandle, fake: FakeProvider,
             tmp_path: Path) -> tuple[Path, ScriptedModel, str]:
    """A workspace opened with one daily note (about a cat), its scripted model, the note."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-11-20/a.md"
    write(root, a, "The cat is called Miso.\n")
    open_ws(daemon, root, fake)
    return root, model, a


def test_undo_of_a_node_whose_secret_was_masked(daemon: DaemonHandle, fake: FakeProvider,
                                                tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    key = "digest/procedure/deploy-key.md"
    write(root, a, f"The deploy key is {SECRET}.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "procedure",
                                     "name": "Deploy key", "reason": "how-to",
                                     "content": f"- the key is {SECRET}"})]]
    first = dream(daemon)
    created = (root / key).read_text()
    assert SECRET not in created and "- the key is [REDACTED]" in created
    write(root, b, f"Rotate the key {SECRET} monthly.\n")
    model.plan[b] = [[("integrate", {
        "action": "REFINE", "bucket": "procedure", "node": key, "name": "Deploy key",
        "sources": [b], "reason": "more detail",
        "content": f"- the key is {SECRET}\n- rotate it monthly"})]]
    second = dream(daemon)
    assert second["actions"] == {"REFINE": 1}
    assert "- rotate it monthly" in (root / key).read_text()
    # Nobody touched the node since: undo restores without a conflict, run by run.
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second["run_id"]})
    assert key in undone["restored"] and undone["forced_over"] == []
    assert (root / key).read_text() == created
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": first["run_id"]})
    assert key in undone["removed"] and not (root / key).exists()


def test_secrets_typed_into_a_node_do_not_make_its_refinement_destructive(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A person adds credentials to a node by hand; the model, shown the node masked,
    refines it keeping those lines as it saw them. The lines count as kept (the
    refinement is applied, not refused as keeping a third of the node)."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    key = "digest/procedure/deploy.md"
    write(root, a, "Deploys go to host alpha.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "procedure",
                                     "name": "Deploy", "reason": "how-to",
                                     "content": "- deploys go to host alpha"})]]
    dream(daemon)
    text = (root / key).read_text()
    text = text.replace("- deploys go to host alpha\n", "- deploys go to host alpha\n"
                        f"- db password: Plum7784!\n- api token {SECRET}\n")
    write(root, key, text)
    write(root, b, "Deploys run on Fridays.\n")
    model.plan[b] = [[("node_read", {"path": key})], [("integrate", {
        "action": "REFINE", "bucket": "procedure", "node": key, "name": "Deploy",
        "sources": [b], "reason": "more detail",
        "content": "- deploys go to host alpha\n- db password: [REDACTED]\n"
                   "- api token [REDACTED]\n- deploys run on Fridays"})]]
    second = dream(daemon)
    assert second["actions"] == {"REFINE": 1}, (second, model.tool_results)
    refined = (root / key).read_text()
    assert "- deploys run on Fridays" in refined and "Plum7784!" not in refined


def test_a_secret_the_model_writes_in_a_name_or_reason_is_masked(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Whatever a model writes is masked: a node's name (its file name too) and the
    reason kept in the run's change log and inbox item."""
    root, model, a = cat_note(daemon, fake, tmp_path)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                     "name": f"Cat {SECRET}", "content": "- the cat is Miso",
                                     "reason": f"the note says so ({SECRET})"})]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1}, (result, model.tool_results)
    runs = daemon.call("memory.changes", {"agent_id": AGENT, "kind": "auto_dream"})
    inbox = daemon.call("inbox.list", {"agent_id": AGENT})
    written = "".join(p.as_posix() + p.read_text(errors="replace") for p in root.rglob("*")
                      if p.is_file())
    for text in (str(result), str(runs), str(inbox), written):
        assert SECRET not in text and SECRET.lower() not in text


def test_arguments_cannot_forge_sections_or_split_lines(daemon: DaemonHandle,
                                                        fake: FakeProvider,
                                                        tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    write(root, "digest/wiki/pets .md", "# Pets\n")
    forged = [
        "- the cat is Miso\n\n## Sources\n\n- [[memory/2020-01-01/never.md]]",
        "- the cat is Miso\n\n## History\n\n- 2020-01-01: corrected; previously: \"dog\"",
        "- the cat is Miso\nderived_from:: [[memory/2020-01-01/never.md]]",
    ]
    model.plan[a] = [
        [("integrate", {"action": "CREATE", "bucket": "personal", "name": "Cat",
                        "content": text, "reason": "fact"}) for text in forged],
        [("integrate", {"action": "CREATE", "bucket": "personal",
                        "name": "Cat\n---\nowner: x", "description": "the\ncat",
                        "content": "- the cat is Miso", "reason": "a\n## Sources\n- x",
                        "related": ["digest/wiki/pets\n.md"]})],
    ]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1}, result
    assert sum("content must not hold" in r for r in model.tool_results) == 3
    path = "digest/personal/cat-owner-x.md"
    fields, text = node(root, path)
    assert fields["name"] == "Cat --- owner: x" and fields["description"] == "the cat"
    assert fields["sources"] == [a] and fields["related"] == ["digest/wiki/pets .md"]
    assert "owner" not in fields and "\n---\n" not in text.split("---\n", 2)[2]
    parsed = digest.parse_node(path, text)
    assert parsed.sources == [a] and parsed.content == "- the cat is Miso"
    assert parsed.history == []


def test_a_failed_run_that_changed_memory_tells_the_inbox(daemon: DaemonHandle,
                                                          fake: FakeProvider,
                                                          tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Cat",
                                     "content": "- the cat is Miso", "reason": "fact"})]]
    # The node is written, then the conversation breaks: the note fails, the job too.
    fake.script(Reply(), Reply(raw=b"{not json"))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "no note could be processed" in job["error"]
    assert (root / "digest/personal/cat.md").exists()
    items = daemon.call("inbox.list", {"agent_id": AGENT})["items"]
    assert [i["kind"] for i in items] == ["auto_dream"]
    assert "digest/personal/cat.md" in items[0]["changes"]
    run_id = items[0]["details"]["run_id"]
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert [r["run_id"] for r in runs] == [run_id]


def test_a_correction_that_drops_everything_keeps_it_all_in_history(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    path = "digest/wiki/servers.md"
    facts = [f"- server number {i} is called host-{i:03d} and runs in rack {i % 7}"
             for i in range(40)]
    write(root, a, "\n".join(facts) + "\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Servers",
                                     "content": "\n".join(facts), "reason": "inventory"})]]
    dream(daemon)
    write(root, b, "All servers were decommissioned.\n")
    model.plan[b] = [[("integrate", {"action": "CORRECT", "bucket": "wiki", "node": path,
                                     "name": "Servers", "sources": [b],
                                     "content": "- there are no servers any more",
                                     "reason": "decommissioned"})]]
    assert dream(daemon)["actions"] == {"CORRECT": 1}
    _, text = node(root, path)
    history = text.split("## History", 1)[1].split("## Sources", 1)[0]
    for fact in facts:
        assert fact.removeprefix("- ") in history, fact
    assert "decommissioned" in history and f"[[{b}]]" in history


def test_undo_of_an_older_run_keeps_the_newer_interests(daemon: DaemonHandle,
                                                        fake: FakeProvider,
                                                        tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "The user drinks tea.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "- drinks tea", "reason": "fact"})]]
    first = dream(daemon)
    write(root, b, "The user learns Rust.\n")
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Rust",
                                     "content": "- learns Rust", "reason": "fact"})]]
    dream(daemon)
    interests = (root / "digest/interests.yaml").read_bytes()
    assert b'"Rust"' in interests and b'"Tea"' in interests
    # Both runs rewrote interests.yaml; only the first touched the tea node.
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": first["run_id"]})
    assert undone["removed"] == ["digest/personal/tea.md"] and undone["forced_over"] == []
    assert not (root / "digest/personal/tea.md").exists()
    assert (root / "digest/wiki/rust.md").exists()
    assert (root / "digest/interests.yaml").read_bytes() == interests


def test_create_of_another_name_on_the_same_path_is_no_corroboration(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    path = "digest/procedure/c-build-flags.md"
    write(root, a, "C++ builds use -O2.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "procedure",
                                     "name": "C++ build flags", "content": "- use -O2",
                                     "reason": "how-to"})]]
    dream(daemon)
    created = (root / path).read_bytes()
    write(root, b, "C# builds use /optimize.\nAgain: C++ builds use -O2.\n")
    model.plan[b] = [[
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "C# build flags",
                       "content": "- use /optimize", "reason": "how-to"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "c++  Build flags",
                       "content": "- use -O2", "reason": "said again", "sources": [b]})]]
    second = dream(daemon)
    assert second["actions"] == {"refused": 1, "CORROBORATE": 1}
    assert any("is the node 'C++ build flags', not 'C# build flags'" in r
               for r in model.tool_results)
    fields, text = node(root, path)
    assert fields["sources"] == [a, b] and "/optimize" not in text
    assert (root / path).read_bytes() != created


def test_a_note_longer_than_one_prompt_is_consolidated_to_its_end(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)  # every conversation answers "done"
    note = "memory/2026-11-25/retro.md"
    # ~40,000 characters of meeting log in sections; a fact at the very end.
    sections = [f"## Topic {i}\n" + "".join(f"- item {i}.{j}: we discussed option {j} at "
                                            f"length and parked it for later.\n"
                                            for j in range(40)) + "\n" for i in range(16)]
    text = "# Retro\n\n" + "".join(sections) + "Decision: the release train leaves Tuesdays.\n"
    assert len(text) > 3 * 12_000
    write(root, note, text)
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert result["notes"] == 1
    asked = [r.json["messages"][1]["content"] for r in fake.requests
             if r.path.endswith("/chat/completions") and r.json
             and r.json["messages"][1]["content"].startswith(f"Daily note {note}:")]
    # One conversation per part; each part at most the limit; nothing cut off, every
    # line of the note in exactly one part, in order.
    assert len(asked) >= 4 and not any("[truncated" in a for a in asked)
    bodies = [a.split(":\n\n", 1)[1].rsplit("\n\nExisting nodes", 1)[0] for a in asked]
    bodies = [b.split("]\n", 1)[1] for b in bodies]  # the "[part i of n ...]" line
    assert all(len(b) <= 12_000 for b in bodies)
    assert "".join(bodies) == text
    assert asked[0].split("\n\n")[1].startswith(f"[part 1 of {len(asked)} ")
    assert "Decision: the release train leaves Tuesdays." in asked[-1]


def test_related_links_are_written_only_to_nodes_that_exist(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    write(root, "digest/wiki/Fish food.md", "# Fish food\n\n- cats like it\n")
    model.plan[a] = [[("integrate", {
        "action": "CREATE", "bucket": "personal", "name": "Cat", "content": "- the cat is Miso",
        "reason": "fact",
        "related": ["Diet", "digest/wiki/nowhere.md", "digest/wiki/..md", "Cat",
                    "digest/wiki/fish food.md"]})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    fields, text = node(root, "digest/personal/cat.md")
    # The one node that exists is linked (by its real name); the others are not, and
    # the model is told which.
    assert fields["related"] == ["digest/wiki/Fish food.md"]
    assert "[[digest/wiki/Fish food.md]]" in text and "nowhere" not in text
    assert ("not linked, no such node: digest/personal/diet.md, digest/wiki/nowhere.md, "
            "digest/wiki/..md") in model.tool_results[0]


def test_a_name_in_another_case_form_or_bucket_lands_on_the_node_that_exists(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "Python is a language. A café sells coffee.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Python",
                       "content": "- a programming language", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "node": "digest/wiki/Café.md",
                       "name": "Café", "content": "- sells coffee", "reason": "fact"})]]
    dream(daemon)
    write(root, b, "Again: Python is a language; a cafe\u0301 sells coffee, and tea.\n")
    model.plan[b] = [[
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "python",
                       "content": "- a programming language", "reason": "said again",
                       "sources": [b]}),
        ("integrate", {"action": "REFINE", "bucket": "wiki", "node": "digest/wiki/PYTHON.md",
                       "name": "Python", "content": "- a programming language\n- by Guido",
                       "reason": "detail", "sources": [b]}),
        ("integrate", {"action": "REFINE", "bucket": "wiki",
                       "node": "digest/wiki/cafe\u0301.md", "name": "Café",
                       "content": "- sells coffee\n- and tea", "reason": "detail",
                       "sources": [b]})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1, "REFINE": 2}
    nodes = sorted(str(p.relative_to(root)) for p in (root / "digest").rglob("*.md"))
    assert nodes == ["digest/wiki/café.md", "digest/wiki/python.md"]  # named by their slugs
    fields, text = node(root, "digest/wiki/python.md")
    assert fields["sources"] == [a, b] and "- by Guido" in text
    assert "- and tea" in node(root, "digest/wiki/café.md")[1]


def test_a_refinement_may_add_detail_inside_a_line_and_keeps_what_it_rewrote(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    cat, me = "digest/personal/cat.md", "digest/personal/me.md"
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Cat",
                       "content": "- the cat is Miso", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Me",
                       "content": "- drinks tea\n- lives in Graz\n- 住在格拉茨",
                       "reason": "facts"})]]
    dream(daemon)
    b = "memory/2026-11-21/b.md"
    write(root, b, "Miso is a grey tabby. I drink coffee now.\n")
    model.plan[b] = [[
        ("integrate", {"action": "REFINE", "bucket": "personal", "node": cat, "name": "Cat",
                       "content": "- The cat is Miso, a grey tabby", "reason": "detail",
                       "sources": [b]}),
        ("integrate", {"action": "REFINE", "bucket": "personal", "node": me, "name": "Me",
                       "content": "- drinks coffee\n- lives in Graz, Austria\n- 住在奥地利格拉茨",
                       "reason": "newer habit", "sources": [b]})]]
    assert dream(daemon)["actions"] == {"REFINE": 2}, model.tool_results
    _, text = node(root, cat)
    content, history = text.split("## History", 1)
    assert "- The cat is Miso, a grey tabby" in content
    assert f'refined; previously: "the cat is Miso" (source: [[{b}]]; reason: detail)' in history
    # A claim a refinement drops is not lost: it is under History, as a correction's.
    _, text = node(root, me)
    content, history = text.split("## History", 1)
    assert "drinks tea" not in content and "- drinks coffee" in content
    assert 'previously: "drinks tea / lives in Graz / 住在格拉茨"' in history


def test_a_node_edited_by_hand_keeps_its_title_and_what_was_written_in_its_sections(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    path = "digest/personal/cat.md"
    by_hand = ("---\nname: Cat\nbucket: personal\nsources: [memory/2026-11-01/old.md]\n---\n"
               "# Miso, our cat\n\n- the cat is Miso\n\n## Related\n\n"
               "See also the vet's leaflet in the drawer.\n\n## Sources\n\n"
               "- [[memory/2026-11-01/old.md]] (the day we got her)\n"
               "- told by the neighbour, no note\n")
    write(root, path, by_hand.replace("\n", "\r\n"))  # saved by an editor with CRLF
    model.plan[a] = [[("integrate", {"action": "CORROBORATE", "bucket": "personal",
                                     "node": path, "name": "Cat", "reason": "said again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}
    fields, text = node(root, path)
    assert "\r" not in text and fields["sources"] == ["memory/2026-11-01/old.md", a]
    assert "\n# Miso, our cat\n\n- the cat is Miso\n" in text
    assert "## Related\n\nSee also the vet's leaflet in the drawer.\n" in text
    assert text.endswith("## Sources\n\n- [[memory/2026-11-01/old.md]] (the day we got her)\n"
                         f"- told by the neighbour, no note\n- [[{a}]]\n")


def test_notes_whose_names_are_not_utf8_are_passed_by_and_the_daemon_lives(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, _, _ = cat_note(daemon, fake, tmp_path)
    memory = bytes(root / "memory")
    os.makedirs(memory + b"/2026-11-2\xff")
    for name in (b"/2026-11-2\xff/x.md", b"/2026-11-20/caf\xe9.md"):
        with open(memory + name, "wb") as fh:
            fh.write(b"A note in a file named in Latin-1.\n")
    result = dream(daemon)
    assert result["notes"] == 1 and daemon.call("daemon.ping") is not None
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert [r["run_id"] for r in runs] == [result["run_id"]]
    assert "its name is not valid UTF-8" in daemon.log()


def test_a_source_note_with_a_hash_in_its_name_stays_one_source(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/meeting #3.md", "memory/2026-11-21/C# notes.md"
    path = "digest/wiki/c-tips.md"
    write(root, a, "In C# prefer var.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "C# tips",
                                     "content": "- prefer var", "reason": "how-to"})]]
    dream(daemon)
    write(root, b, "Again: in C# prefer var.\n")
    model.plan[b] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": path,
                                     "name": "C# tips", "sources": [b], "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}
    fields, text = node(root, path)
    assert fields["sources"] == [a, b] and fields["confidence"] == 0.75
    assert text.endswith(f"## Sources\n\n- [[{a}]]\n- [[{b}]]\n")


def test_a_note_renamed_since_its_dream_is_no_second_source(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    moved = "memory/2026-11-21/pets/cat.md"
    path = "digest/personal/cat.md"
    plan = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Cat",
                            "content": "- the cat is Miso", "reason": "fact"})]]
    model.plan[a] = model.plan[moved] = plan
    dream(daemon)
    created = (root / path).read_text()
    (root / moved).parent.mkdir(parents=True)
    os.rename(root / a, root / moved)
    asked = len(fake.requests)
    second = dream(daemon)
    # Not read again (no model call): the node cites the note by its new path, once.
    assert second["actions"] == {"RELINK": 1} and len(fake.requests) == asked
    fields, text = node(root, path)
    assert fields["sources"] == [moved] and fields["confidence"] == 0.5
    assert f"[[{moved}]]" in text and f"[[{a}]]" not in text
    assert dream(daemon)["run_id"] is None
    daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second["run_id"]})
    assert (root / path).read_text() == created


def test_a_rewrite_of_a_node_edited_since_the_model_read_it_is_refused(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    path = "digest/personal/cat.md"
    write(root, path, "---\nname: Cat\n---\n# Cat\n\n- the cat is Miso\n")
    refine = {"action": "REFINE", "bucket": "personal", "node": path, "name": "Cat",
              "content": "- the cat is Miso\n- she is grey", "reason": "detail"}
    model.plan[a] = [[("node_read", {"path": path})], [("integrate", refine)],
                     [("node_read", {"path": path})], [("integrate", {
                         **refine, "content": "- the cat is Miso\n- she is grey\n"
                                              "- she sleeps all day"})]]
    # The model reads the node; a person adds a line before the model answers.
    gate = fake.gate(lambda body: len(body.get("messages", [])) == 4)
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream",
                                         "params": {}})["job_id"]
    assert gate.entered.wait(60)
    write(root, path, "---\nname: Cat\n---\n# Cat\n\n- the cat is Miso\n- she sleeps all day\n")
    gate.open()
    job = wait_job(daemon, job_id, agent=AGENT)
    assert job["state"] == "succeeded" and job["result"]["actions"] == {"refused": 1,
                                                                        "REFINE": 1}
    assert "changed since you read it" in model.tool_results[1]
    _, text = node(root, path)
    assert "- she sleeps all day" in text.split("## History")[0] and "## History" not in text


def test_tool_arguments_in_a_code_fence_are_read(daemon: DaemonHandle, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    root, model, a = cat_note(daemon, fake, tmp_path)
    args = ('{"action": "CREATE", "bucket": "personal", "name": "猫", "extra": 1, '
            '"content": "- 猫叫味噌", "reason": "事实"}')
    model.plan[a] = [[("integrate", f"```json\n{args}\n```"),
                      ("integrate", f"```{args.replace('猫', 'Cat', 1)}```")]]
    assert dream(daemon)["actions"] == {"CREATE": 2}
    assert "- 猫叫味噌" in node(root, "digest/personal/猫.md")[1]
    assert node(root, "digest/personal/cat.md")[0]["name"] == "Cat"


def test_tool_arguments_that_are_not_text_are_refused_to_the_model(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """An object or a number among ``related`` (or ``sources``) names no node: as text it
    would be made a slug path (``{'path': ...}`` -> ``digest/wiki/path-...md``); a list as
    node_read's path would be read as ``['digest/...']``."""
    root, model, a = cat_note(daemon, fake, tmp_path)
    cat = {"action": "CREATE", "bucket": "personal", "name": "Cat", "reason": "pet",
           "content": "- the cat is Miso"}
    model.plan[a] = [[("integrate", {**cat, "related": [{"path": "digest/wiki/pets.md"}]}),
                      ("integrate", {**cat, "sources": [a, 7]}),
                      ("node_read", {"path": ["digest/personal/cat.md"]})],
                     [("integrate", cat)]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    refused = model.tool_results[:3]
    assert refused[2].startswith("error: path must be a string"), refused
    assert refused[0].startswith("error: related must be a list of strings") \
        and "an object" in refused[0], refused
    assert refused[1].startswith("error: sources must be a list of strings") \
        and "a number" in refused[1], refused
    fields, _ = node(root, "digest/personal/cat.md")
    assert fields["related"] == [] and fields["sources"] == [a], fields
