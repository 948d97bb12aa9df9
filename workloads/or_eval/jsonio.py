"""Reading JSON/JSONL records with their line numbers, and an append-only JSONL log that survives kills."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from trex.workloads.or_eval.errors import DataFormatError


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield `(line, record)` for each object in a JSON array file or a JSON-lines file.

    The format is detected from the first non-blank character (`[` means one JSON array, as in
    OptMATH-Bench and OptiBench; anything else is JSON lines, as in NL4OPT.json despite its name).
    Lines are 1-based and point at the start of each record, so errors can name them.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFormatError(str(path), None, "no such file") from None
    except UnicodeDecodeError as error:
        raise DataFormatError(str(path), None, f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        yield from _array_records(str(path), text, start)
    else:
        yield from _line_records(str(path), text)


def _line_records(path: str, text: str) -> Iterator[tuple[int, dict]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, number, f"not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, number, f"expected a JSON object, found {type(record).__name__}")
        yield number, record


def _array_records(path: str, text: str, start: int) -> Iterator[tuple[int, dict]]:
    decoder = json.JSONDecoder()
    position = start + 1
    while True:
        position = _skip_blank(text, position)
        if position >= len(text):
            raise DataFormatError(path, text.count("\n", 0, position) + 1, "the JSON array is not closed")
        if text[position] == "]":
            if text[position + 1 :].strip():
                raise DataFormatError(path, text.count("\n", 0, position) + 1, "text after the closing ]")
            return
        line = text.count("\n", 0, position) + 1
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, error.lineno, f"not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, line, f"expected a JSON object, found {type(record).__name__}")
        yield line, record
        position = _skip_blank(text, position)
        if position < len(text) and text[position] == ",":
            position += 1
        elif position < len(text) and text[position] != "]":
            raise DataFormatError(
                path, text.count("\n", 0, position) + 1, f"expected ',' or ']', found {text[position]!r}"
            )


def _skip_blank(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


class JsonlLog:
    """An append-only JSON-lines file: one record per line, flushed and fsynced as written.

    Opening an existing log reads its records back. A last line without its newline is what a
    killed writer leaves; it is cut off (and only it), so every complete record survives a kill
    and the next append starts on a clean line. A malformed complete line is an error: the file
    was edited or is not ours, and silently dropping records would lose results.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.records: list[dict] = []
        if self.path.exists():
            self._recover()
        self._file = open(self.path, "a", encoding="utf-8")

    def _recover(self) -> None:
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            with open(self.path, "r+b") as file:
                file.truncate(complete)
        for number, line in enumerate(data[:complete].decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(
                    str(self.path), number, f"not valid JSON ({error.msg}); move the file away to start over"
                ) from None
            if not isinstance(record, dict):
                raise DataFormatError(str(self.path), number, "expected a JSON object")
            self.records.append(record)

    def append(self, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
