"""auto_resource and the shapes of a chat model's answer: a reasoning model's thinking,
an answer cut at the token limit. A real daemon; the model is the scripted fake."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer
from test_dream import ScriptedModel, write
from test_resource import catalog, note_of, open_ws, wait_state


def test_a_reasoning_models_thinking_is_not_the_note(daemon: DaemonHandle,
                                                    fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    # Qwen3 or DeepSeek-R1 served without a reasoning parser answer "<think>...</think>"
    # and then the answer; one cut off while thinking has no answer at all.
    root = tmp_path / "ws"
    thinking = "<think>\nThe user saved a file. Let me list the facts.\n</think>\n\n"
    answers = {"Flight LH 1234": chat_answer(thinking + "Trip plan.\n- Flight LH 1234 at 9:40"),
               "Milk, eggs": chat_answer("<think>\nThe user saved a list. First",
                                         finish_reason="length")}
    # Each file's answer, by what the request holds: never one file's for the other.
    fake.chat_default = lambda req: next(a for k, a in answers.items() if k in str(req))
    write(root, "resource/trip.md", "Flight LH 1234 leaves at 9:40.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/trip.md", "processed", "failed")
    fields, text = note_of(root, "resource/trip.md")
    assert fields["description"] == "Trip plan.", fields
    assert "think" not in text and "Let me" not in text and "- Flight LH 1234" in text, text
    write(root, "resource/list.md", "Milk, eggs.\n")
    wait_state(root, "resource/list.md", "processed", "failed")
    entry = catalog(root)["resource/list.md"]
    assert entry["state"] == "failed" and "no text" in entry["reason"], entry


def test_a_summary_cut_at_the_token_limit_says_so(daemon: DaemonHandle, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    fake.script(Reply(json=chat_answer("Contract terms.\n- Notice period: three mon",
                                       finish_reason="length")))
    write(root, "resource/contract.txt", "Notice period: three months. Renewal: yearly.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/contract.txt", "processed", "failed")
    fields, text = note_of(root, "resource/contract.txt")
    assert "- Notice period: three mon\n\n[summary cut:" in text, text
    assert "length limit]" in text and fields["description"] == "Contract terms."


def test_an_answer_with_a_frontmatter_block_of_its_own(daemon: DaemonHandle,
                                                      fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    # A model imitating a memory note starts its answer with frontmatter: the note keeps
    # the daemon's one block (its link to the file), and its description is text.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    fake.script(Reply(json=chat_answer(
        '---\nname: Minutes\nsource_resource: "[[resource/other.md]]"\n---\n\n'
        "# Board minutes\n- The Lisbon office is approved")))
    write(root, "resource/minutes.md", "The board approved the Lisbon office.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/minutes.md", "processed", "failed")
    fields, text = note_of(root, "resource/minutes.md")
    assert fields["description"] == "Board minutes", fields
    assert fields["source_resource"] == "[[resource/minutes.md]]"
    assert text.count("---\n") == 2 and "resource/other.md" not in text, text
    assert "# Board minutes\n- The Lisbon office is approved" in text


def test_an_answer_stopped_by_another_limit_or_a_filter_says_so(daemon: DaemonHandle,
                                                               fake: FakeProvider,
                                                               tmp_path: Path) -> None:
    # A gateway's "max_tokens" is the length limit by another name, and Azure's content
    # filter cuts an answer mid-way: each summary was written as if it were whole.
    root = tmp_path / "ws"
    answers = {"Lease": chat_answer("Lease.\n- Rent: 900 a mon", finish_reason="max_tokens"),
               "Recipe": chat_answer("Recipe.\n- Flour: 200", finish_reason="content_filter")}
    fake.chat_default = lambda req: next(a for k, a in answers.items() if k in str(req))
    write(root, "resource/lease.txt", "Lease: rent 900 a month.\n")
    write(root, "resource/recipe.txt", "Recipe: flour 200 g.\n")
    open_ws(daemon, "res", root, fake)
    for rel in ("resource/lease.txt", "resource/recipe.txt"):
        wait_state(root, rel, "processed", "failed")
    text = note_of(root, "resource/lease.txt")[1]
    assert "- Rent: 900 a mon\n\n[summary cut: the model's answer stopped at its length " \
        "limit]" in text, text
    text = note_of(root, "resource/recipe.txt")[1]
    assert "- Flour: 200\n\n[summary cut: the provider's content filter stopped the " \
        "model's answer]" in text, text


def test_a_refusal_is_no_summary_and_says_why(daemon: DaemonHandle, fake: FakeProvider,
                                              tmp_path: Path) -> None:
    # OpenAI's ``refusal``: with no content the file failed as "answered with no text",
    # the model's reason lost; with content beside it, the refusal became the file's note.
    root = tmp_path / "ws"
    why = "I'm sorry, I cannot help with that."

    def refusing(content: str | None) -> dict[str, object]:
        answer = chat_answer(content)
        answer["choices"][0]["message"]["refusal"] = why
        return answer

    answers = {"Diary": refusing(None), "Ledger": refusing(why)}
    fake.chat_default = lambda req: next(a for k, a in answers.items() if k in str(req))
    write(root, "resource/diary.txt", "Diary: a quiet day.\n")
    write(root, "resource/ledger.txt", "Ledger: 12 entries.\n")
    open_ws(daemon, "res", root, fake)
    for rel in ("resource/diary.txt", "resource/ledger.txt"):
        wait_state(root, rel, "processed", "failed")
        entry = catalog(root)[rel]
        assert entry["state"] == "failed" and not entry.get("note"), entry
        assert entry["reason"] == f"the chat model refused to summarize it: {why}", entry
    assert not list(root.glob("memory/*/resource-*.md"))


def test_a_file_or_an_answer_that_shows_nothing_is_an_empty_one(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A file of only zero-width spaces and a byte order mark went to the model, which
    # could only invent its summary; an answer of only such characters was the note.
    root = tmp_path / "ws"
    fake.chat_default = lambda req: chat_answer("\u200b\n\ufeff\u200e\n")
    write(root, "resource/blank.txt", "\ufeff\u200b\n\u2060\n\u200b\n")
    write(root, "resource/menu.txt", "Menu: soup, bread.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/blank.txt", "skipped", "processed", "failed")
    assert catalog(root)["resource/blank.txt"]["reason"] == "the file is empty"
    wait_state(root, "resource/menu.txt", "processed", "failed")
    entry = catalog(root)["resource/menu.txt"]
    assert entry["state"] == "failed" and "no text" in entry["reason"], entry
    assert not list(root.glob("memory/*/resource-*.md"))


def test_passwords_in_a_csv_resource_reach_no_model_note_or_index(daemon: DaemonHandle,
                                                                   fake: FakeProvider,
                                                                   tmp_path: Path) -> None:
    """A CSV export with a password column: the model is sent the rows with the passwords
    masked, and a model that quotes the rows back leaves none in the note or the index."""
    root = tmp_path / "ws"
    passwords = ("Hunter2Pass", "Tr0ub4dor&3", "Zq8mN2pL4x")
    rows = "".join(f"{u},{p},{u}@example.com\n" for u, p in zip(("bob", "amy", "cat"),
                                                                  passwords, strict=True))
    model = ScriptedModel(fake)
    model.resource_answer = "Accounts of the lab.\n\nuser,password,email\n" + rows
    write(root, "resource/accounts.csv", "user,password,email\n" + rows)
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/accounts.csv", "processed", "failed")
    prompts = [r.body.decode() for r in fake.requests if b"accounts.csv" in r.body]
    assert prompts and "amy@example.com" in prompts[0], prompts
    assert not any(p in prompt for p in passwords for prompt in prompts)
    assert catalog(root)["resource/accounts.csv"]["state"] == "processed"
    _fields, text = note_of(root, "resource/accounts.csv")
    assert "amy@example.com" in text and not any(p in text for p in passwords), text
    daemon.call("index.sync", {"agent_id": "res"})
    hits = daemon.call("memory.search", {"agent_id": "res", "query": "amy@example.com"})
    assert hits["results"], hits
    for p in passwords:
        assert not daemon.call("memory.search", {"agent_id": "res", "query": p})["results"]
