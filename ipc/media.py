"""Media content blocks (an image, a recording, a file) as the placeholder text that
names them where a conversation is kept: ``[image omitted]``,
``[document omitted: Q3 report]``, as the daemon puts it for every client's media
blocks (``memory.add_turns``). No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from recalld.ipc.textcut import cut_text

#: Media content blocks, each kept as a placeholder naming what it was (and its title or
#: file name when it has one): what the user shared is said, its bytes are not kept.
MEDIA_BLOCKS = {"image_url": "image", "image": "image", "input_image": "image",
                "input_audio": "audio", "audio": "audio", "file": "file", "input_file": "file",
                "video": "video", "video_url": "video", "document": "document",
                "inline_data": "file", "inlineData": "file", "file_data": "file",
                "fileData": "file", "data": "file"}
_MEDIA_KINDS = ("image", "audio", "video")
MAX_MEDIA_NAME = 100
#: Content blocks whose text is said: a refusal is the assistant's answer too.
TEXT_BLOCKS = frozenset({"text", "input_text", "output_text", "refusal"})
#: The fields of a media block (or of its ``kind`` or ``source`` object) that name it.
_NAMING = ("title", "filename", "name", "mime_type", "mimeType", "media_type")
_PLACEHOLDER = re.compile(
    r"\[(?:" + "|".join(sorted(set(MEDIA_BLOCKS.values()) | set(_MEDIA_KINDS)))
    + r") omitted(?:: [^\[\]\n]*)?\]\Z")


def block_kind(block: Mapping[str, object]) -> str | None:
    """A content block's type: its ``type``, or for a block without one (Gemini's parts,
    hand-made blocks) the key that carries its content."""
    kind = block.get("type")
    if isinstance(kind, str):
        return kind
    if "text" in block:
        return "text"
    return next((key for key in block if key in MEDIA_BLOCKS), None)


def media_stub(kind: str, block: Mapping[str, object]) -> dict[str, object]:
    """Media block ``block`` of ``kind`` with only what names it (its type, title, file
    name and MIME type): the same :func:`media_placeholder`, without its bytes or URL."""
    def naming(fields: Mapping[str, object]) -> dict[str, object]:
        return {k: cut_text(v, 4 * MAX_MEDIA_NAME) for k in _NAMING
                if isinstance(v := fields.get(k), str)}

    stub: dict[str, object] = naming(block)
    if isinstance(block.get("type"), str):
        stub["type"] = block["type"]
    for key in (kind, "source"):
        inner = block.get(key)
        if isinstance(inner, Mapping):
            stub[key] = naming(inner)
        elif key == kind and "type" not in stub:
            stub[key] = {}  # a block without type is told by this key
    return stub


def media_placeholder(kind: str, block: Mapping[str, object]) -> str:
    """``[image omitted]``, ``[document omitted: Q3 report]``: what a media block was,
    named by its title or file name (Anthropic ``title``, OpenAI ``filename``, AgentScope
    ``name``), and by its MIME type where the block only says "data" (Gemini's
    ``inline_data``, AgentScope's ``data``)."""
    what = MEDIA_BLOCKS[kind]
    inner = [v for v in (block, block.get(kind), block.get("source")) if isinstance(v, Mapping)]
    mime = next((v.get(k) for v in inner for k in ("mime_type", "mimeType", "media_type")
                 if isinstance(v.get(k), str)), None)
    if what == "file" and isinstance(mime, str) and mime.split("/")[0] in _MEDIA_KINDS:
        what = mime.split("/")[0]
    name = next((v.get(k) for v in inner for k in ("title", "filename", "name")
                 if isinstance(v.get(k), str)), None)
    name = " ".join(str(name or "").replace("[", "(").replace("]", ")").split())
    if len(name) > MAX_MEDIA_NAME:
        name = cut_text(name, MAX_MEDIA_NAME) + "…"
    return f"[{what} omitted: {name}]" if name else f"[{what} omitted]"


def is_placeholder(text: str) -> bool:
    """Whether ``text`` is one whole placeholder as :func:`media_placeholder` makes it."""
    return _PLACEHOLDER.match(text) is not None
