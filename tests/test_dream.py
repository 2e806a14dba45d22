"""auto_dream end to end: a real daemon, a real socket, a scripted OpenAI-compatible model.

The fake chat server answers each conversation by the daily note it is about: the test
scripts which tool calls the model makes for which note (malformed ones included), and
the daemon applies them with its own rules.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_for, wait_job

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.errors import InvalidParams, MethodNotFound, NotAllowed, RecalldError

AGENT = "dreamer"


class ScriptedModel:
    """Chat answers keyed by the note a conversation is about.

    ``plan[note]`` is a list of turns; each turn is a list of tool calls (name, args).
    After the last turn the model answers with text. Conversations about resources (no
    ``Daily note`` marker) get ``resource_answer``.
    """

    def __init__(self, fake: FakeProvider) -> None:
        self.plan: dict[str, list[list[tuple[str, Any]]]] = {}
        self.resource_answer: str | None = "A file.\n- it has facts"
        self.tool_results: list[str] = []
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        fake.chat_default = self.answer

    def answer(self, req: Any) -> dict[str, Any]:
        messages = req["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        if not user.startswith("Daily note "):
            return chat_answer(self.resource_answer)
        note = user.split(":", 1)[0].removeprefix("Daily note ")
        with self._lock:
            for m in messages:
                if m["role"] == "tool" and m["tool_call_id"] not in self._seen:
                    self._seen.add(m["tool_call_id"])
                    self.tool_results.append(m["content"])
        step = sum(1 for m in messages if m["role"] == "assistant")
        turns = self.plan.get(note, [])
        if step >= len(turns):
            return chat_answer(f"done with {note}")
        calls = [tool_call(name, args, f"{note}_{step}_{i}")
                 for i, (name, args) in enumerate(turns[step])]
        return chat_answer(None, tool_calls=calls)


def chat_config(fake: FakeProvider) -> dict[str, Any]:
    return {"backend": "openai", "base_url": fake.url + "/v1", "model_name": "fake",
            "api_key": "sk-test", "timeout_s": 10.0}


def open_ws(daemon: DaemonHandle, root: Path, fake: FakeProvider | None,
            **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"dream_cron_enabled": False, **extra}
    if fake is not None:
        config["chat_model_config"] = chat_config(fake)
    info: dict[str, Any] = daemon.call("workspace.open", {"agent_id": AGENT, "path": str(root),
                                                          "config": config})
    return info


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def run_job(daemon: DaemonHandle, kind: str, params: dict[str, Any] | None = None,
            agent: str = AGENT) -> dict[str, Any]:
    job_id = daemon.call("jobs.submit", {"agent_id": agent, "kind": kind,
                                         "params": params or {}})["job_id"]
    return wait_job(daemon, job_id, agent=agent)


def dream(daemon: DaemonHandle) -> dict[str, Any]:
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "succeeded", (job["error"], job)
    result: dict[str, Any] = job["result"]
    return result


def node(root: Path, rel: str) -> tuple[dict[str, Any], str]:
    text = (root / rel).read_text(encoding="utf-8")
    fields, _ = parse_frontmatter(text)
    return fields, text


def inbox_items(daemon: DaemonHandle) -> list[dict[str, Any]] | None:
    try:
        answer = daemon.call("inbox.list", {"agent_id": AGENT})
    except MethodNotFound:
        return None
    items: list[dict[str, Any]] = answer["items"] if isinstance(answer, dict) else answer
    return [i for i in items if i["kind"] == "auto_dream"]


TEA = "digest/personal/tea-preference.md"
DEPLOY = "digest/procedure/deploy.md"


def test_dream_lifecycle(daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-11-20/a.md"
    write(root, a, "# Monday\n\nThe user prefers tea over coffee.\nDeploy: make deploy.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [
        [("node_search", {"query": "tea"}),
         ("integrate", {"action": "DELETE", "bucket": "personal", "name": "x"}),
         ("integrate", {"action": "CORROBORATE", "bucket": "personal", "name": "nope",
                        "reason": "no such node"})],
        [("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea preference",
                        "description": "What the user drinks", "type": "preference",
                        "content": "- prefers tea over coffee", "sources": [a],
                        "reason": "stated preference"}),
         ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Deploy",
                        "description": "How to deploy",
                        "content": "- run make deploy\n- check the dashboard\n- tell the team",
                        "related": [TEA], "reason": "how-to"})],
    ]
    first = dream(daemon)
    assert first["notes"] == 1 and first["changed"] is True
    assert first["actions"] == {"CREATE": 2, "refused": 1}
    assert any("action must be one of" in r for r in model.tool_results)
    assert any("needs an existing node" in r for r in model.tool_results)
    fields, text = node(root, TEA)
    assert fields["name"] == "Tea preference" and fields["bucket"] == "personal"
    assert fields["sources"] == [a] and fields["corroborations"] == 0
    assert fields["created"] and fields["updated"] and fields["type"] == "preference"
    assert f"## Sources\n\n- [[{a}]]\n" in text
    dfields, dtext = node(root, DEPLOY)
    assert dfields["related"] == [TEA] and f"- [[{TEA}]]" in dtext
    assert dfields["sources"] == [a]  # the note being read, when the model names none
    run1 = first["run_id"]
    log_md = (root / first["log"]).read_text()
    assert "**CREATE**" in log_md and f"[[{a}]]" in log_md and "stated preference" in log_md
    interests = (root / "digest/interests.yaml").read_text()
    assert 'topic: "Tea preference"' in interests
    searched = daemon.call("memory.search", {"agent_id": AGENT, "query": "dashboard",
                                             "sync": True})
    assert [r["path"] for r in searched["results"]] == [DEPLOY]

    # Nothing changed: the catalog prevents reprocessing; no run, no model call.
    calls = len(fake.requests)
    again = dream(daemon)
    assert again["notes"] == 0 and again["run_id"] is None and len(fake.requests) == calls

    # CORROBORATE adds the source once, however often it is proposed.
    b = "memory/2026-11-21/b.md"
    write(root, b, "Tea again, as always.\n")
    corroborate = {"action": "CORROBORATE", "bucket": "personal", "node": TEA,
                   "name": "Tea preference", "sources": [b], "reason": "said again"}
    model.plan[b] = [[("integrate", corroborate)], [("integrate", corroborate)]]
    second = dream(daemon)
    assert second["notes"] == 1 and second["actions"] == {"CORROBORATE": 1, "unchanged": 1}
    fields, text = node(root, TEA)
    assert fields["sources"] == [a, b] and fields["corroborations"] == 1
    assert fields["confidence"] == 0.75
    assert text.count(f"[[{b}]]") == 1 and "prefers tea over coffee" in text
    after_second = (root / TEA).read_bytes()
    deploy_before = (root / DEPLOY).read_bytes()

    # CORRECT keeps the old claim as history; a destructive REFINE is refused.
    c = "memory/2026-11-22/c.md"
    write(root, c, "Actually the user switched to coffee.\n")
    model.plan[c] = [[
        ("integrate", {"action": "CORRECT", "bucket": "personal", "node": TEA,
                       "name": "Tea preference", "content": "- prefers coffee over tea",
                       "sources": [c], "reason": "switched"}),
        ("integrate", {"action": "REFINE", "bucket": "procedure", "node": DEPLOY,
                       "name": "Deploy", "content": "- something else entirely",
                       "reason": "rewrite"}),
    ]]
    third = dream(daemon)
    assert third["actions"] == {"CORRECT": 1, "refused": 1}
    fields, text = node(root, TEA)
    assert "- prefers coffee over tea" in text.split("## History")[0]
    history = text.split("## History", 1)[1].split("## Sources")[0]
    assert "prefers tea over coffee" in history and f"[[{c}]]" in history
    assert "switched" in history
    # The claim overturned: only the correcting note backs the node now.
    assert fields["sources"] == [c] and fields["overturned_sources"] == [a, b]
    assert fields["confidence"] == 0.5 and fields["corroborations"] == 0
    assert (root / DEPLOY).read_bytes() == deploy_before
    log3 = (root / third["log"]).read_text()
    assert "refused REFINE digest/procedure/deploy.md" in log3 and "keeps only 0%" in log3

    # Undo restores the exact previous bytes; a second undo is refused. A damaged record
    # (fields missing, others of another type) is passed by.
    (root / "mem_metadata/dream/runs/20261120T000000Z-abcdef.json").write_text(
        '{"version": 1, "notes": 3}')
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert [r["run_id"] for r in runs] == [third["run_id"], second["run_id"], run1]
    listed = subprocess.run(
        [sys.executable, "-m", "recalld.ipc", "dream", "--agent", AGENT, "--runs", "2"],
        env=daemon.env, capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["RUN_ID", "STARTED", "TRIGGER", "NOTES", "FILES", "UNDONE"]
    assert [line.split()[0] for line in lines[1:]] == [third["run_id"], second["run_id"]]
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": third["run_id"]})
    assert TEA in undone["restored"]
    assert (root / TEA).read_bytes() == after_second
    with pytest.raises(InvalidParams, match="already undone"):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": third["run_id"]})

    # A later run wrote the file again: refused, naming that run to undo first.
    with pytest.raises(NotAllowed, match="changed since run") as refused:
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run1})
    assert f"{TEA} (written again by run {second['run_id']}: undo it first)" in str(
        refused.value), refused.value
    # A file changed since the run: refused, unless forced (here through the CLI).
    (root / TEA).write_text((root / TEA).read_text() + "\nhand edit\n")
    with pytest.raises(NotAllowed, match="changed since run"):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second["run_id"]})
    proc = subprocess.run(
        [sys.executable, "-m", "recalld.ipc", "dream", "--agent", AGENT, "--undo",
         second["run_id"], "--force", "--json"],
        env=daemon.env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert TEA in orjson.loads(proc.stdout)["restored"]
    fields, _ = node(root, TEA)
    assert fields["sources"] == [a] and fields["corroborations"] == 0

    # Undo of the first run removes the nodes it created.
    daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run1, "force": True})
    assert not (root / TEA).exists() and not (root / DEPLOY).exists()
    with pytest.raises(RecalldError):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": "../../etc"})


def test_failing_model_retries_note_next_run(daemon: DaemonHandle, fake: FakeProvider,
                                             tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-11-23/d.md"
    write(root, note, "The build server is called hal.\n")
    open_ws(daemon, root, fake)
    # A body that is not JSON, then a tool call whose arguments are not JSON.
    fake.script(Reply(raw=b"{this is not json"))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "no note could be processed" in job["error"]
    fake.script(Reply(json=chat_answer(None, tool_calls=[tool_call("integrate", "{x")])))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "not valid JSON" in job["error"]
    assert not (root / "digest/wiki").exists() or not any((root / "digest/wiki").iterdir())
    items = inbox_items(daemon)
    assert items in (None, [])
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Build server", "content": "- it is hal",
                                        "reason": "fact"})]]
    result = dream(daemon)
    assert result["notes"] == 1 and result["actions"] == {"CREATE": 1}
    fields, _ = node(root, "digest/wiki/build-server.md")
    assert fields["sources"] == [note]
    items = inbox_items(daemon)
    if items is not None:
        assert len(items) == 1 and "digest/wiki/build-server.md" in items[0]["changes"]


def dream_one_good_one_broken(daemon: DaemonHandle, fake: FakeProvider, root: Path,
                              bad: str, shown: Iterable[str]) -> dict[str, Any]:
    """A dream over two notes: one the model consolidates, ``bad`` whose conversation
    breaks (a tool call that is no JSON; ``shown``: other names the model sees it by).
    The run's result."""
    model = ScriptedModel(fake)
    good = "memory/2026-11-20/ok.md"
    write(root, good, "The printer on floor 3 is called gutenberg.\n")
    write(root, bad, "The VPN gateway moved to vpn2.\n")
    open_ws(daemon, root, fake)
    model.plan[good] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Printer", "content": "- it is gutenberg",
                                        "reason": "fact"})]]
    for name in (bad, *shown):
        model.plan[name] = [[("integrate", "{not json")]]
    return dream(daemon)


def test_a_dream_that_left_a_note_unprocessed_says_so_in_status(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # One note is consolidated, the other's conversation breaks: the run succeeds (the
    # note is tried again next run), and status must not read as if all went well.
    root, bad = tmp_path / "ws", "memory/2026-11-21/broken.md"
    result = dream_one_good_one_broken(daemon, fake, root, bad, ())
    assert (result["notes"], result["failed_notes"]) == (2, 1), result
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "status"], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)
    shown = " ".join(proc.stdout.split())
    assert "succeeded, 1 note(s) not processed" in shown, proc.stdout
    assert "the last dream left 1 daily note(s) not processed" in shown, proc.stdout
    assert result["log"] in shown, proc.stdout
    assert bad in (root / result["log"]).read_text()


def test_dream_without_changes_pushes_nothing(daemon: DaemonHandle, fake: FakeProvider,
                                              tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-11-24/e.md"
    write(root, note, "Nothing worth keeping today.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("node_search", {"query": "anything"})]]
    result = dream(daemon)
    assert result["notes"] == 1 and result["changed"] is False and result["actions"] == {}
    items = inbox_items(daemon)
    if items is not None:
        assert items == []
    assert "No memory changed." in (root / result["log"]).read_text()


def test_no_chat_model_and_cron_status(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    daemon = daemon_factory()
    root = tmp_path / "ws"
    write(root, "memory/2026-11-25/f.md", "a note\n")
    info = open_ws(daemon, root, None, dream_cron_enabled=True, dream_cron="30 4 * * *")
    assert info["dream"]["cron"] == "30 4 * * *" and info["dream"]["enabled"] is True
    assert info["dream"]["next_run"]  # registered with the scheduler
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "no chat model configured" in job["error"]
    status = daemon.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == AGENT)
    assert ws["dream"]["next_run"] == info["dream"]["next_run"]
    daemon.call("workspace.close", {"agent_id": AGENT})
    assert (daemon.data_dir / "state" / "scheduler.json").exists()
    info = open_ws(daemon, root, None, dream_cron_enabled=False)
    assert "next_run" not in info["dream"] and info["dream"]["enabled"] is False


HALF_A, HALF_B = "memory/2026-11-26/a.md", "memory/2026-11-26/b.md"


def dream_until_the_second_note(daemon: DaemonHandle, fake: FakeProvider, root: Path
                                ) -> tuple[ScriptedModel, str]:
    """A dream of two notes that created digest/personal/cat.md from the first and is
    waiting, for ever, for the model's answer about the second; its model and job id."""
    model = ScriptedModel(fake)
    write(root, HALF_A, "猫の名前はミソ. Fact one: the cat is called Miso.\n")
    write(root, HALF_B, "Fact two.\n")
    open_ws(daemon, root, fake)
    model.plan[HALF_A] = [[("integrate", {
        "action": "CREATE", "bucket": "personal", "name": "Cat",
        "content": "- the cat is called Miso", "reason": "fact"})]]
    # a: tool call, then its final answer; b's first request hangs.
    fake.script(Reply(), Reply(), Reply(delay_s=30))
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream"})["job_id"]
    # b's request has arrived (and hangs) once none is left.
    wait_for(lambda: not fake.pending_script(), "the job to reach the second note")
    assert (root / "digest/personal/cat.md").exists()
    return model, job_id


def test_cancelled_dream_keeps_its_log_and_catalog(daemon: DaemonHandle, fake: FakeProvider,
                                                   tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model, job_id = dream_until_the_second_note(daemon, fake, root)
    b = HALF_B
    job = daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})
    assert job["state"] == "cancelled", job
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert len(runs) == 1 and "digest/personal/cat.md" in runs[0]["files"]
    assert "**CREATE** [[digest/personal/cat.md]]" in (
        root / f"mem_metadata/dream/runs/{runs[0]['run_id']}.md").read_text()
    assert (root / "digest/personal/cat.md").exists()
    # What it wrote before it was cancelled is in the inbox, as any run's changes are.
    (item,) = inbox_items(daemon) or [None]
    assert item is not None and "digest/personal/cat.md" in item["changes"], item
    assert item["details"]["run_id"] == runs[0]["run_id"] and not item["details"]["ended"]
    assert "1 create" in item["summary"] and "stopped before its end" in item["summary"]
    # The next run reads only the note that was not finished.
    model.plan[b] = []
    result = dream(daemon)
    assert result["notes"] == 1
    daemon.call("dream.undo", {"agent_id": AGENT, "run_id": runs[0]["run_id"]})
    assert not (root / "digest/personal/cat.md").exists()


# -- the pure parts -------------------------------------------------------------------------


def test_node_format_keeps_foreign_fields_and_hand_sections() -> None:
    from recalld.daemon.memory import digest, integration

    text = ("---\nname: Editor\nowner: me\nsources: [memory/2026-01-01/x.md]\n---\n"
            "# Editor\n\nUses vim.\n\n## Notes by hand\n\nkeep me\n\n## Sources\n\n"
            "- [[memory/2026-01-02/y.md]]\n")
    node = digest.parse_node("digest/personal/editor.md", text)
    assert node.sources == ["memory/2026-01-01/x.md", "memory/2026-01-02/y.md"]
    assert "## Notes by hand" in node.content and node.extra == {"owner": "me"}
    again = digest.parse_node(node.path, digest.render_node(node))
    assert (again.content, again.sources, again.extra) == (node.content, node.sources,
                                                           node.extra)
    assert digest.slugify("咖啡 偏好!") == "咖啡-偏好"
    assert integration.kept_fraction("- a\n- b\n- c\n- d", "* a\n  b  \nnew") == 0.5


def test_integration_arguments_are_checked() -> None:
    from recalld.daemon.memory import digest, integration, proposals

    def parse(**args: Any) -> digest.Integration:
        return proposals.parse_integration(args, digest_dir="digest",
                                        allowed_sources=["memory/d/a.md"],
                                        default_source="memory/d/a.md")

    for bad in ({"action": "CREATE", "bucket": "personal", "node": "digest/../x.md"},
                {"action": "CREATE", "bucket": "nope", "name": "x", "content": "c"},
                {"action": "REFINE", "bucket": "wiki", "name": "x"},
                {"action": 3, "bucket": "wiki"}):
        with pytest.raises(digest.IntegrationError):
            parse(**bad)
    # Content that shows nothing (a zero-width space, a byte order mark, bidi marks, a
    # mark with no letter) is none: the node would be written with an empty body.
    for nothing in ("\u200b\n\ufeff", "\u200e\u200f", " \u0301 "):
        for action in ("CREATE", "REFINE", "CORRECT"):
            with pytest.raises(digest.IntegrationError, match="content is required"):
                parse(action=action, bucket="wiki", name="Hal", content=nothing)
    ok = parse(action="create", bucket="wiki", name="Hal", content="c",
               sources=["memory/other.md", "[[memory/d/a.md]]"], related=["Build", "x/y"])
    assert ok.sources == ("memory/d/a.md",) and ok.related == ("digest/wiki/build.md",)
    assert ok.path == "digest/wiki/hal.md"
    # REFINE at exactly half kept is allowed; below is refused.
    node = digest.parse_node(ok.path, integration.integrate(None, ok, "2026-01-01").text or "")
    grown = dataclasses_replace(ok, action="REFINE", content="- a\n- b")
    node.content = "- a\n- x\n- y\n- z"
    assert integration.integrate(node, grown, "2026-01-02").status == "refused"
    node.content = "- a\n- x"
    assert integration.integrate(node, grown, "2026-01-02").status == "applied"


def dataclasses_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_interests_round_trip_and_decay() -> None:
    from recalld.daemon.memory import interests

    text = interests.render_interests({"tea": 0.8, 'say "hi"': 0.3}, "2026-01-01")
    assert interests.parse_interests(text) == {"tea": 0.8, 'say "hi"': 0.3}
    refreshed = interests.refresh(interests.parse_interests(text), {"rust": 0.6, "tea": 0.5})
    assert refreshed == {"tea": 0.72, "rust": 0.6, 'say "hi"': 0.27}
    assert interests.refresh({"old": 0.04}, {}) == {}


def test_undo_refuses_records_pointing_outside_the_digest(tmp_path: Path) -> None:
    from recalld.daemon.memory import changelog, dreamundo

    runs = tmp_path / "mem_metadata/dream/runs"
    run = changelog.RunLog("20260101T000000Z-abcdef", "s", "manual")
    run.record_write("digest/wiki/a.md", None, b"new")
    changelog.write_run(runs, run)
    (tmp_path / "digest/wiki").mkdir(parents=True)
    (tmp_path / "digest/wiki/a.md").write_bytes(b"new")
    record = orjson.loads((runs / f"{run.run_id}.json").read_bytes())
    record["files"]["../outside.md"] = record["files"].pop("digest/wiki/a.md")
    (runs / f"{run.run_id}.json").write_bytes(orjson.dumps(record))
    with pytest.raises(RecalldError, match="outside digest"):
        dreamundo.undo_run(tmp_path, runs, run.run_id, digest_dir="digest", now="t")
    assert (tmp_path / "digest/wiki/a.md").read_bytes() == b"new"
