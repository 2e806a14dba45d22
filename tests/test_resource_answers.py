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
