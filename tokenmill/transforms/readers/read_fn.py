"""The read stage: a read task (a run of small files, or a unit of one big file) to its
records, counted; progress written for the launcher's line."""

from __future__ import annotations

import apache_beam as beam

from tokenmill.transforms.progress_counts import reporter
from tokenmill.transforms.readers import read_task
from tokenmill.transforms.stage_base import count


class ReadFn(beam.DoFn):
    def __init__(self, cfg, progress_to: str | None = None):
        self.cfg, self._progress_folder = cfg, progress_to

    def start_bundle(self):
        self._progress = reporter(self._progress_folder)

    def process(self, task):
        if isinstance(task, dict):  # a dropped doc from planning a big file (an unreadable footer)
            count("read.records")
            count(f"dropped.{task['dropped_by']}")
            yield task
            return
        for d in read_task(task, self.cfg):
            count("read.records")  # every row the docs Parquet will hold, dropped ones too
            if d.get("dropped_by"):
                count(f"dropped.{d['dropped_by']}")
            if self._progress:
                self._progress.add(read=1)
            yield d
        if self._progress:  # the task's bytes once it is read (a run of files, or a unit of one)
            self._progress.add(bytes=task.size())

    def finish_bundle(self):
        if self._progress:
            self._progress.flush()
