#!/usr/bin/env python3
"""A minimal agent loop with long-term memory from recalld.

Each user message is answered like this:

1. ``memory.search`` finds what the workspace remembers about it;
2. the hits are given to the model in a ``<recalled-memory>`` block (recalld drops such
   blocks when it captures turns, so recalled memory is never stored as a new fact; a
   hit that itself holds the tag has it made plain text, ``inert_recall_tags``, so it
   cannot end the block early);
3. the model answers (any OpenAI-compatible chat completions server);
4. the user message and the answer go back with ``memory.add_turns``; every few user
   turns the daemon runs auto_memory and writes the facts into today's note.

On exit (end of input, Ctrl-C, or after ``--once``) it calls ``memory.add_turns`` with
``flush: true``, which is also what an agent should do before it compacts its context.

Configuration by environment: ``OPENAI_BASE_URL`` (default https://api.openai.com/v1),
``OPENAI_API_KEY``, ``MODEL`` (default gpt-4o-mini); ``RECALLD_SOCKET`` if the daemon is
not on its default socket. Only the standard library and ``recalld.ipc`` are used.

    python docs/examples/agent_loop.py --agent coder --session demo
    python docs/examples/agent_loop.py --once "Where do I keep my backups?"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
import uuid
from typing import Any

from recalld.ipc.client import Client
from recalld.ipc.recall_tags import inert_recall_tags

SYSTEM = "You are a helpful assistant. Use the recalled memory when it is relevant."


def chat(messages: list[dict[str, Any]]) -> str:
    """One chat completion from the OpenAI-compatible server named by the environment."""
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise SystemExit(f"OPENAI_BASE_URL must be an http(s) URL, not {base!r}")
    body = json.dumps({"model": os.environ.get("MODEL", "gpt-4o-mini"),
                       "messages": messages}).encode()
    request = urllib.request.Request(  # noqa: S310 - scheme checked above
        f"{base}/chat/completions", data=body, method="POST",
        headers={"Content-Type": "application/json"})
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - scheme checked
        answer = json.load(response)
    return str(answer["choices"][0]["message"].get("content") or "")


def recall(client: Client, agent: str, question: str, limit: int) -> str:
    """The recalled-memory block for ``question`` ('' when nothing was found)."""
    hits = client.search(agent, question, max_results=limit)
    if not len(hits):
        return ""
    parts = [f"[{hit.path}:{hit.start_line}-{hit.end_line}]\n{hit.text.strip()}" for hit in hits]
    return "<recalled-memory>\n" + inert_recall_tags("\n\n".join(parts)) + "\n</recalled-memory>"


def answer_one(client: Client, agent: str, session: str, history: list[dict[str, Any]],
               question: str, limit: int) -> str:
    memory = recall(client, agent, question, limit)
    messages = [{"role": "system", "content": SYSTEM}]
    if memory:
        messages.append({"role": "system", "content": memory})
    user = {"role": "user", "content": question}
    reply = chat([*messages, *history, user])
    assistant = {"role": "assistant", "content": reply}
    history.extend([user, assistant])
    # A request id makes a retried call harmless: the daemon adds the turns only once.
    client.add_turns(agent, session, [user, assistant], request_id=uuid.uuid4().hex)
    return reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", default="default", help="recalld workspace (agent id)")
    parser.add_argument("--session", default=None, help="conversation id (default: random)")
    parser.add_argument("--socket", default=None, help="recalld socket path")
    parser.add_argument("--limit", type=int, default=5, help="memory hits per question")
    parser.add_argument("--once", metavar="TEXT", help="answer one message and exit")
    args = parser.parse_args(argv)
    session = args.session or uuid.uuid4().hex[:12]
    history: list[dict[str, Any]] = []
    with Client(args.socket) as client:
        client.workspace_open(args.agent)
        try:
            if args.once is not None:
                print(answer_one(client, args.agent, session, history, args.once, args.limit))
            else:
                for line in sys.stdin:
                    if line.strip():
                        print(answer_one(client, args.agent, session, history, line.strip(),
                                         args.limit), flush=True)
        except KeyboardInterrupt:
            pass
        finally:
            done = client.add_turns(args.agent, session, [], flush=True)
            if done.get("job_id"):
                print(f"[memory: auto_memory job {done['job_id']} started]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
