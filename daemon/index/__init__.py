"""Index: tokenizer, chunker, BM25, link graph and the per-workspace update loop."""
