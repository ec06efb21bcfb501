"""The records of a W&B run file (``run-<id>.wandb``, what ``wandb sync`` uploads), read without
the network: W&B writes them in LevelDB's log format (a 7-byte header ``:W&B``, magic 0xBEE1,
version 0; then 32 KiB blocks of records, each with a 7-byte header: CRC32, length, type FULL /
FIRST / MIDDLE / LAST), each record a ``wandb_internal_pb2.Record`` protobuf."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), "not a W&B run file"
    records, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            offset += left
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + HEADER])
        chunk = data[offset + HEADER:offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
            pending = b""
    return records


def run_records(run_file: Path) -> tuple[dict, list[dict]]:
    """(the config, the history rows) a W&B run file holds: each value JSON-decoded."""
    from wandb.proto import wandb_internal_pb2 as pb

    config: dict = {}
    history: list[dict] = []
    for raw in raw_records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "config":
            for item in record.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "run":
            for item in record.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            history.append(row)
    return config, history


def _finished(path: Path) -> bool:
    """Whether a run file holds its run's exit record."""
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in raw_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "exit":
            return True
    return False


def finished_run_files(run_dir: Path, count: int = 1, timeout: float = 60.0) -> list[Path]:
    """The ``count`` run files of a W&B run folder's offline runs (a run continued by ``resume`` writes one
    per session), once each holds its exit record (W&B's service writes them in a process of its own,
    which may still be flushing when ``finish`` returns)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        files = sorted((Path(run_dir) / "wandb").glob("offline-run-*/run-*.wandb"))
        if len(files) == count and all(_finished(f) for f in files):
            return files
        if time.monotonic() > deadline:
            raise AssertionError(f"not {count} finished W&B run files in {run_dir}/wandb: {files}")
        time.sleep(0.2)


def finished_run_file(run_dir: Path, timeout: float = 60.0) -> Path:
    """The run file of a W&B run folder's one offline run, once it holds its exit record."""
    return finished_run_files(run_dir, 1, timeout)[0]
