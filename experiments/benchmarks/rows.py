"""What the benchmark scripts share about their results: rows (dicts) written as a CSV for --out."""
from __future__ import annotations

import csv
from pathlib import Path


def write_csv(folder: Path, name: str, rows: list[dict], fields: list[str] | None = None) -> Path:
    """`rows` as folder/name, the folder made if needed; columns `fields`, by default every key any row has
    (sorted)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields or sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    return path
