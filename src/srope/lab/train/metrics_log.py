"""A run's metrics: ``metrics.jsonl`` (cut back to the resumed step) and TensorBoard."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from tqdm import tqdm

from srope.lab.train.distributed import World


def _metrics_records(path: Path) -> list[tuple[int, str]]:
    """``(step, line)`` of every record in ``metrics.jsonl``. A torn last line (a run killed
    while writing it) is dropped with a warning; any other bad line is an error naming it."""
    lines = path.read_text().splitlines()
    last = max((number for number, line in enumerate(lines, 1) if line.strip()), default=0)
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            if number == last:
                warnings.warn(f"{path}: dropped a torn last line (a run killed while writing it): {line[:60]!r}", stacklevel=3)
                continue
            raise ValueError(f"{path}:{number}: not a JSON record ({error}); fix or delete that line, then --resume again") from None
        if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{number}: a record without an integer 'step'; fix or delete that line, then --resume again")
        records.append((record["step"], line))
    return records


class MetricsLog:
    """``metrics.jsonl`` (one JSON object per step) and TensorBoard, on rank 0."""

    def __init__(self, out: Path, world: World, tensorboard: bool, resume_step: int):
        self.path, self.enabled, self.writer = out / "metrics.jsonl", world.is_main, None
        self.last_step = 0  # of the records kept
        if not self.enabled:
            return
        if self.path.exists():  # drop the steps a resume will redo
            kept = [(step, line) for step, line in _metrics_records(self.path) if step <= resume_step]
            self.path.write_text("".join(line + "\n" for _, line in kept))
            self.last_step = max((step for step, _ in kept), default=0)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                tqdm.write("tensorboard is not installed: metrics go to metrics.jsonl only (pip install 'srope[lm]')")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
