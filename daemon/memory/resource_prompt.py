"""What auto_resource tells the chat model about a file (the system prompt and the
message with the file's text) and what of its answer becomes the note's summary. Pure
functions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from recalld.ipc.textcut import cut_text

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


#: Why an answer was stopped mid-way, by its finish reason: the length limit (``length``;
#: ``max_tokens`` from gateways that pass Anthropic's name on) or a content filter
#: (Azure OpenAI's, which cuts the answer where it objects).
_CUT_BY: Final = {
    "length": "the model's answer stopped at its length limit",
    "max_tokens": "the model's answer stopped at its length limit",
    "content_filter": "the provider's content filter stopped the model's answer",
}


def cut_summary(summary: str, finish_reason: str | None, max_chars: int) -> str:
    """``summary`` at most ``max_chars`` long (a model that ignores max_tokens), saying so
    when it was cut there or the answer was stopped mid-way (its length limit, a filter)."""
    if len(summary) > max_chars:
        return (cut_text(summary, max_chars).rstrip()
                + "\n\n[summary cut: the model's answer was longer]")
    cut_by = _CUT_BY.get(finish_reason or "")
    return summary if cut_by is None else f"{summary}\n\n[summary cut: {cut_by}]"


def refused(refusal: str | None) -> str | None:
    """Why the file has no summary when the model declined to write one (OpenAI's
    ``refusal``; masked, short), else None."""
    if not refusal:
        return None
    from recalld.daemon.memory.redact import redact  # loaded with the chat client

    return f"the chat model refused to summarize it: {redact(cut_text(refusal, 300))}"
