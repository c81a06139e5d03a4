"""Where a user command waits: every Triton compile, Triton autotune and torch.compile
(dynamo) compile while it runs, with its start and duration, beside the GPU's busy fraction.

    python benchmarks/profile_stalls.py --out out/stalls.json -- srope demo --device cuda
    python benchmarks/profile_stalls.py --out out/stalls.json -- srope synth copying --preset cpu --device cuda
    python benchmarks/profile_stalls.py --out out/stalls.json -- path/to/script.py ARGS

The command runs in this process (``srope ...`` through the CLI's ``main``, a ``.py`` file
through runpy), so the hooks see everything it compiles:

- Triton: ``knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook`` time each kernel
  compile, named with the kernel and the argument specialisation that made it new (a new
  sequence length that changes an integer's divisibility by 16 compiles again);
- Triton autotune: ``Autotuner.run`` is timed whenever its cache gains a key (the key names
  what re-tunes: e.g. a length among an fla kernel's autotune keys), from the disk cache or by
  timing candidates;
- torch.compile: dynamo's compile start and end callbacks (a recompile on a new shape is a
  new compile id of the same frame).

Output: the events in order (seconds from the start), a summary per kernel and per kind, the
longest stretches in which events follow each other with gaps under a second (the stalls a
user sees as a frozen progress bar), and GPU busy samples (NVML, 10 Hz) where a GPU is.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from common import environment, write_json


class Timeline:
    """Events as ``{"kind", "name", "start", "seconds", ...}``, times from ``self.t0``."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.events: list[dict] = []
        self._open: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def begin(self, token: tuple) -> None:
        self._open[token] = self.now()

    def end(self, token: tuple, kind: str, name: str, **details) -> None:
        start = self._open.pop(token, None)
        if start is not None:
            self.add(kind, name, start, self.now() - start, **details)

    def add(self, kind: str, name: str, start: float, seconds: float, **details) -> None:
        with self._lock:
            self.events.append({"kind": kind, "name": name, "start": round(start, 4), "seconds": round(seconds, 4), **details})


def hook_triton(timeline: Timeline) -> None:
    """Time Triton's kernel compiles and autotune rounds (no-op without Triton)."""
    try:
        from triton import knobs
        from triton.runtime import autotuner
    except ImportError:
        return
    previous_start, previous_end = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

    def token(kwargs) -> tuple:
        return ("triton", kwargs["fn"].name if hasattr(kwargs["fn"], "name") else str(kwargs["fn"]), str(kwargs["key"]))

    def on_start(*args, **kwargs):
        timeline.begin(token(kwargs))
        return previous_start(*args, **kwargs) if previous_start else False

    def on_end(*args, **kwargs):
        timeline.end(token(kwargs), "triton_compile", token(kwargs)[1], specialization=kwargs.get("repr", "").split("](", 1)[-1][:300],
                     warmup=bool(kwargs.get("is_manual_warmup", False)))
        return previous_end(*args, **kwargs) if previous_end else None

    knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = on_start, on_end
    run = autotuner.Autotuner.run

    def timed_run(self, *args, **kwargs):
        before, start = set(self.cache), timeline.now()
        try:
            return run(self, *args, **kwargs)
        finally:
            new = [key for key in self.cache if key not in before]
            if new:
                timeline.add("triton_autotune", getattr(self.base_fn, "__name__", str(self.base_fn)), start, timeline.now() - start,
                             key=str(new[0])[:300], candidates=len(self.configs), keys=list(self.keys))

    autotuner.Autotuner.run = timed_run


def hook_dynamo(timeline: Timeline) -> None:
    """Time torch.compile's compiles (dynamo traces, inductor builds), one event per compile id."""
    from torch._dynamo.callback import on_compile_end, on_compile_start

    def start(args):
        timeline.begin(("dynamo", str(args.compile_id)))

    def end(args):
        timeline.end(("dynamo", str(args.compile_id)), "torch_compile", str(args.compile_id), trigger=args.callback_trigger.name)

    on_compile_start(start)
    on_compile_end(end)


class GpuSampler(threading.Thread):
    """The GPU's utilisation (NVML, percent of the last sample period busy) every ``period`` s."""

    def __init__(self, timeline: Timeline, period: float = 0.1):
        super().__init__(daemon=True)
        self.timeline, self.period, self.samples = timeline, period, []
        self.stopped = threading.Event()
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)

    def run(self):
        while not self.stopped.wait(self.period):
            self.samples.append([round(self.timeline.now(), 2), self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu])


def stalls(events: list[dict], gap: float = 1.0) -> list[dict]:
    """Stretches where compile/autotune events follow each other with less than ``gap`` s
    between them, longest first: what holds up the command's progress."""
    spans = sorted((e["start"], e["start"] + e["seconds"], e) for e in events)
    merged: list[dict] = []
    for begin, finish, event in spans:
        if merged and begin - merged[-1]["end"] < gap:
            last = merged[-1]
            last["end"] = max(last["end"], finish)
            last["events"] += 1
            last["kinds"][event["kind"]] += 1
        else:
            merged.append({"start": begin, "end": finish, "events": 1, "kinds": defaultdict(int, {event["kind"]: 1})})
    for span in merged:
        span["seconds"] = round(span["end"] - span["start"], 3)
        span["kinds"] = dict(span["kinds"])
    return sorted(merged, key=lambda s: -s["seconds"])


def summarise(events: list[dict]) -> dict:
    """Per kind and per (kind, name): count and seconds, most expensive first."""
    by_kind, by_name = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for e in events:
        for table, key in ((by_kind, e["kind"]), (by_name, f"{e['kind']} {e['name']}")):
            table[key][0] += 1
            table[key][1] += e["seconds"]
    order = lambda table: {k: {"count": n, "seconds": round(s, 3)} for k, (n, s) in sorted(table.items(), key=lambda kv: -kv[1][1])}  # noqa: E731
    return {"by_kind": order(by_kind), "by_name": order(by_name)}


def run_command(command: list[str]) -> int:
    """``srope ARGS`` through the CLI, else a script through runpy; its exit status."""
    if command[0] == "srope":
        from srope.lab.cli import main

        return int(main(command[1:]) or 0)
    sys.argv = command
    try:
        runpy.run_path(command[0], run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s [--out FILE] -- srope ARGS | -- SCRIPT.py ARGS")
    parser.add_argument("--out", default="out/bench/stalls.json")
    parser.add_argument("--gap", type=float, default=1.0, help="events closer than this (s) form one stall")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not (command[0] == "srope" or command[0].endswith(".py")):
        parser.error("give the command after --: srope ARGS or SCRIPT.py ARGS")
    report = {"environment": environment(), "command": command}
    timeline = Timeline()
    hook_triton(timeline)
    hook_dynamo(timeline)
    sampler = None
    import torch

    if torch.cuda.is_available():
        sampler = GpuSampler(timeline)
        sampler.start()
    status = run_command(command)
    wall = timeline.now()
    if sampler is not None:
        sampler.stopped.set()
        sampler.join()
        busy = [u for _, u in sampler.samples]
        report["gpu"] = {"samples": sampler.samples, "busy_mean": round(sum(busy) / max(1, len(busy)), 1)}
    report |= {"exit_status": status, "wall_s": round(wall, 3), "events": timeline.events, "summary": summarise(timeline.events),
               "stalls": stalls(timeline.events, args.gap)[:20]}
    write_json(args.out, report)
    kinds = ", ".join(f"{k} {v['count']} ({v['seconds']:.1f} s)" for k, v in report["summary"]["by_kind"].items()) or "no compiles"
    longest = report["stalls"][0]["seconds"] if report["stalls"] else 0.0
    print(f"{' '.join(command)}: {wall:.1f} s, exit {status}; {kinds}; longest stall {longest:.1f} s -> {args.out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
