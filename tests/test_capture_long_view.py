"""A session's note far larger than a prompt may hold, and one at the write limit:
capture goes on, every fact in the session's notes once.

A real daemon, a real socket, and the chat model of :mod:`test_capture_long_note` on
127.0.0.1, behind a context window: a request larger than :data:`CONTEXT_CHARS` is
refused with HTTP 400, as a real server refuses one past its model's context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, today, turn
from test_capture_long_note import _config, _cut_model
from waits import wait_job

from recalld.daemon.index.frontmatter import body_of, parse_frontmatter
from recalld.daemon.memory.capture_long import NOTE_VIEW_CHARS
from recalld.daemon.memory.fileops import MAX_WRITE_BYTES

CONTEXT_CHARS = 60_000


def _behind_context(fake: FakeProvider) -> list[int]:
    """Refuse chat requests past the context window; the size of each prompt sent."""
    sizes: list[int] = []

    def reply_for(body: Any) -> Reply | None:
        if "messages" not in body:
            return None
        size = sum(len(str(m.get("content") or "")) for m in body["messages"])
        sizes.append(size)
        return Reply(status=400) if size > CONTEXT_CHARS else None

    fake.reply_for = reply_for
    return sizes


def _old_note(root: Path, session: str, facts: list[str], stem: str = "day") -> Path:
    """The session's note of the day as an earlier run left it: headings, then facts."""
    half = len(facts) // 2
    body = "\n".join(["## Morning", *(f"- {f}" for f in facts[:half]), "",
                      "## Afternoon", *(f"- {f}" for f in facts[half:])])
    path = root / "memory" / today() / f"{stem}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {stem}\ndescription: the day\nsession_id: {session}\n---\n"
                    f"{body}\n")
    return path


def _bodies(root: Path) -> dict[str, str]:
    return {p.name: body_of(p.read_text())[0]
            for p in sorted((root / "memory" / today()).glob("*.md")) if p.name != "index.md"}


def test_a_note_far_larger_than_a_prompt_keeps_being_captured(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    old = [f"fact-{n} the crate in bay {n} holds spare valves of size {n}"
           for n in range(3000)]
    _old_note(root, "big", old)
    d = daemon_factory(_config(root, fake))
    sizes = _behind_context(fake)
    fake.chat_default = _cut_model([])
    new = [f"fact-{n} the pallet on shelf {n} waits for the truck" for n in range(5000, 5009)]
    for start in range(0, len(new), 3):
        # A fact of the note's morning, long out of view, is said again too.
        add(d, "big", turn(" ".join(f"Remember: {f}." for f in new[start:start + 3])
                           + f" Remember: {old[start + 7]}."))
        job = wait_job(d, add(d, "big", [], flush=True)["job_id"])
        assert job["state"] == "succeeded", job
    body = _bodies(root)["day.md"]
    assert len(body) > 3 * CONTEXT_CHARS
    for fact in old + new:
        assert body.count(fact) == 1, fact
    assert body.index("## Afternoon") < body.index(new[0])
    assert sizes and max(sizes) < NOTE_VIEW_CHARS + 5_000  # not growing with the note
    prompts = [next(m["content"] for m in r.json["messages"] if m["role"] == "user")
               for r in fake.requests if r.path.endswith("/chat/completions")]
    assert all("## Morning" in p and "## Afternoon" in p for p in prompts)
    assert add(d, "big", [])["pending_turns"] == 0


# A name as long as a note's name may be: its continuation's is longer.
@pytest.mark.parametrize("stem", ["day", "-".join(["cargo"] * 13) + "-dy"])
def test_a_note_at_the_write_limit_goes_on_in_a_second_note(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path, stem: str) -> None:
    root = tmp_path / "ws"
    old = [f"fact-{n} the crate in bay {n} holds spare valves of size {n}"
           for n in range(MAX_WRITE_BYTES // 64)]
    while len("\n".join(old).encode()) > MAX_WRITE_BYTES - 1500:
        old.pop()
    full = _old_note(root, "full", old, stem)
    before = full.read_text()
    # The next name is another conversation's note: the session's goes on past it.
    theirs = full.with_name(f"{stem}-2.md")
    theirs.write_text(f"---\nname: {stem}\nsession_id: other\n---\n- fact-1 their own\n")
    kept = theirs.read_text()
    d = daemon_factory(_config(root, fake))
    _behind_context(fake)
    fake.chat_default = _cut_model([])
    first = [f"fact-{n} the barge at quay {n} sails at dawn" for n in range(8000, 8004)]
    later = [f"fact-{n} the crane {n} is booked for friday" for n in range(9000, 9003)]
    for said in ([*first, old[3]], [*later, first[0], old[-2]]):
        add(d, "full", turn(" ".join(f"Remember: {f}." for f in said)))
        job = wait_job(d, add(d, "full", [], flush=True)["job_id"])
        assert job["state"] == "succeeded", job
    bodies = _bodies(root)
    third = f"{stem}-3.md"
    assert sorted(bodies) == sorted([f"{stem}.md", f"{stem}-2.md", third])
    assert full.read_text() == before and theirs.read_text() == kept
    second = (root / "memory" / today() / third).read_text()
    assert parse_frontmatter(second)[0]["session_id"] == "full"
    for fact in first + later:
        assert bodies[third].count(fact) == 1, fact
    assert old[3] not in bodies[third] and old[-2] not in bodies[third]
    index = (root / "memory" / today() / "index.md").read_text()
    assert all(f"({name})" in index for name in bodies)
    assert job["result"]["note"].endswith(f"/{third}")
    assert add(d, "full", [])["pending_turns"] == 0


def test_facts_added_to_a_long_note_keep_their_new_heading(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    old = [f"fact-{n} the van {n} is parked in lot {n}" for n in range(600)]
    note = _old_note(root, "sect", old)
    d = daemon_factory(_config(root, fake))
    content = (f"## Afternoon\n- {old[-1]}\n- fact-700 the van 700 is in the wash\n\n"
               "## Evening\n- fact-701 the night shift starts at ten\n"
               "Olga takes the keys home.\n")
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_append",
                                                        {"content": content})])),
                Reply(json=chat_answer("saved")))
    add(d, "sect", turn("Vans: 700 is in the wash; the night shift starts at ten; Olga "
                        "takes the keys home."))
    job = wait_job(d, add(d, "sect", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert note.read_text().endswith(
        f"- {old[-1]}\n- fact-700 the van 700 is in the wash\n\n## Evening\n"
        "- fact-701 the night shift starts at ten\nOlga takes the keys home.\n")
    assert note.read_text().count("## Afternoon") == 1
