"""The output folder of a bulk job, and what in it is finished, so that a rerun after a crash redoes nothing done.

    DIR/job.json        the settings the images were drawn with; a rerun with other settings is refused
    DIR/images/N.png    the image of prompt N (its line number in the prompts file, from 0), N zero-padded to 6
    DIR/stats.jsonl     one record a prompt: index, prompt, seed, image, sha256, stats, warnings, run; or an error

An image is written to a temporary name and renamed, then its record is appended: a prompt is finished when its
record names an image that exists. A record cut short by a crash (the file's last line without its newline) is
dropped; a prompt whose record says `error` is drawn again on the next run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

JOB_FILE, STATS_FILE, IMAGES = "job.json", "stats.jsonl", "images"


class BulkOutput:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.stats_path = self.folder / STATS_FILE
        self.images = self.folder / IMAGES

    def claim(self, settings: dict) -> None:
        """Make the folder, or check that it was made with these settings; a ValueError says what differs, an
        OSError that the folder cannot be made or written (checked here, before any work starts)."""
        self.images.mkdir(parents=True, exist_ok=True)
        for folder in (self.folder, self.images):
            tempfile.TemporaryFile(dir=folder).close()  # a file can be made there
        job = self.folder / JOB_FILE
        if job.exists():
            before = json.loads(job.read_text())
            changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
            if changed:
                raise ValueError(
                    f"{self.folder} holds images drawn with other settings ({', '.join(changed)}: "
                    f"{', '.join(f'{before.get(k)!r} then, {settings.get(k)!r} now' for k in changed)}): rerun with "
                    "the same options to finish it, or choose another --out."
                )
        else:
            _write_atomically(job, (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode())

    def finished(self, prompts: dict[int, str]) -> set[int]:
        """The prompts already drawn; a ValueError if one of them is no longer the prompt on its line."""
        done = set()
        for record in self.records():
            index = record.get("index")
            if "error" in record or not (self.folder / record.get("image", "")).is_file():
                continue
            if prompts.get(index) != record.get("prompt"):
                raise ValueError(
                    f"prompt {index} was {record.get('prompt')!r} when drawn and is {prompts.get(index)!r} now: "
                    "the prompts file changed; choose another --out for it."
                )
            done.add(index)
        return done

    def records(self) -> list[dict]:
        """Every whole record (a crash's cut-short last line is removed from the file first)."""
        if not self.stats_path.exists():
            return []
        data = self.stats_path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.stats_path, "r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)
            data = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def image_path(self, index: int) -> Path:
        return self.images / f"{index:06d}.png"

    def write(self, log, index: int, png: bytes, record: dict) -> None:
        """Store one prompt's result (`log` is stats.jsonl opened for appending): the image, then its record."""
        if png:
            path = self.image_path(index)
            with _naming(path):
                _write_atomically(path, png)
            record = {**record, "image": str(path.relative_to(self.folder)), "sha256": hashlib.sha256(png).hexdigest()}
        with _naming(self.stats_path):
            log.write(json.dumps(record, sort_keys=True) + "\n")
            log.flush()


@contextlib.contextmanager
def _naming(path: Path):
    """An OSError of a write names the file, as one of open() does and one of write() does not (a full disk)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
