"""The read stage: a read task (a run of small files, or a unit of one big file) to its
records, counted; progress written for the launcher's line.

Tasks of small objects on a store are read a few together (BATCH_FILES files), their objects
fetched ahead across task boundaries (readers.Prefetch): a task holds as few as one file when
there are many (MIN_TASKS), and a store answers each request in 10-50 ms."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from tokenmill import store
from tokenmill.transforms.progress_counts import reporter
from tokenmill.transforms.readers import FileRange, Prefetch, files_in, read_files, read_task
from tokenmill.transforms.stage_base import count

BATCH_FILES = 64


class ReadFn(beam.DoFn):
    def __init__(self, cfg, progress_to: str | None = None):
        self.cfg, self._progress_folder = cfg, progress_to

    def start_bundle(self):
        self._progress = reporter(self._progress_folder)
        self._pending: list[tuple[FileRange, list]] = []  # tasks of objects on a store, to read together

    def process(self, task):
        if isinstance(task, dict):  # a dropped doc from planning a big file (an unreadable footer)
            count("read.records")
            count(f"dropped.{task['dropped_by']}")
            yield task
            return
        if isinstance(task, FileRange):
            files = files_in(task)
            if any(store.is_store(f.path) for f in files):
                self._pending.append((task, files))
                if sum(len(fs) for _, fs in self._pending) >= BATCH_FILES:
                    yield from self._read_pending()
                return
        yield from self._counted(read_task(task, self.cfg), task)

    def _read_pending(self):
        pending, self._pending = self._pending, []
        with Prefetch([f for _, files in pending for f in files]) as ahead:
            for task, files in pending:
                yield from self._counted(read_files(files, self.cfg, ahead), task)

    def _counted(self, records, task):
        for d in records:
            count("read.records")  # every row the docs Parquet will hold, dropped ones too
            if d.get("dropped_by"):
                count(f"dropped.{d['dropped_by']}")
            if self._progress:
                self._progress.add(read=1)
            yield d
        if self._progress:  # the task's bytes once it is read (a run of files, or a unit of one)
            self._progress.add(bytes=task.size())

    def finish_bundle(self):
        for d in self._read_pending():
            yield WindowedValue(d, MIN_TIMESTAMP, [GlobalWindow()])
        if self._progress:
            self._progress.flush()
