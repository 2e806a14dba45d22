"""What auto_resource tells the chat model about a file (the system prompt and the
message with the file's text) and what of its answer becomes the note's summary. Pure
functions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # the chat client loads the redaction rules: not at a warm start
    from recalld.daemon.providers.chat import ChatMessage

SYSTEM_PROMPT: Final = """\
You turn a file the user saved into a memory note. Write concise Markdown: one line saying
what the file is, then its key facts, decisions, names, numbers and dates as a short list.
Do not invent anything that is not in the file. Answer with the note text only."""


def messages(rel: str, size: int, text: str, *, cut: bool) -> list[ChatMessage]:
    """The conversation asking for the note of the file ``rel`` of ``size`` bytes whose
    text (its first part only if ``cut``) is ``text``."""
    prompt = f"File {rel} ({size} bytes{', first part only' if cut else ''}):\n\n{text}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]


def cut_summary(summary: str, finish_reason: str | None, max_chars: int) -> str:
    """``summary`` at most ``max_chars`` long (a model that ignores max_tokens), saying so
    when it was cut there or the model stopped at its length limit, mid-way."""
    if len(summary) > max_chars:
        return summary[:max_chars].rstrip() + "\n\n[summary cut: the model's answer was longer]"
    if finish_reason == "length":
        return summary + "\n\n[summary cut: the model's answer stopped at its length limit]"
    return summary
