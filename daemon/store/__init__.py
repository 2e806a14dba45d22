"""Storage: atomic files, checksummed zstd JSONL, generation manifests."""
