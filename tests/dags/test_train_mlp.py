"""dags/scripts/train_mlp.py data-parallel, as the local launcher runs a gang of 2 nodes: two torchrun
processes on this machine (``--nnodes=2``, one rank each, static rendezvous on 127.0.0.1), gloo on
the CPU. Stopped by SIGTERM, both ranks stop after the same step and rank 0 checkpoints it; resumed
from that checkpoint, the run ends where an uninterrupted one does."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration_support import REPO, free_port, wait_for

torch = pytest.importorskip("torch", reason="train_mlp.py trains with torch (scripts/bootstrap installs it)")

TRAIN_SCRIPT = REPO / "dags" / "scripts" / "train_mlp.py"
STEPS = 40
TRAIN_ARGS = ["--steps", str(STEPS), "--checkpoint-every", "10", "--batch-size", "64", "--hidden", "32",
              "--seed", "3", "--threads", "1"]  # fmt: skip


@dataclass
class Run:
    """One training run: its checkpoint directory, events file and log."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "ckpt"

    @property
    def events_file(self) -> Path:
        return self.root / "events.jsonl"

    def events(self, event: str) -> list[dict]:
        if not self.events_file.exists():
            return []
        records = [json.loads(line) for line in self.events_file.read_text().splitlines()]
        return sorted((r for r in records if r["event"] == event), key=lambda r: r.get("rank", 0))

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.root.glob("node-*.log")))

    def start_nodes(self, *extra: str, resume_from: str = "") -> list[subprocess.Popen]:
        """Both nodes' torchrun, as the local launcher starts a gang's: the same command, its own node rank."""
        self.root.mkdir(parents=True, exist_ok=True)
        port = free_port(18260, 18299)
        env = {**os.environ, "QUOTA_CHECKPOINT_DIR": str(self.checkpoints), "QUOTA_RESUME_FROM": resume_from}
        nodes = []
        for rank in (0, 1):
            with (self.root / f"node-{rank}.log").open("ab") as log:
                nodes.append(subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                     f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
                     str(TRAIN_SCRIPT), *TRAIN_ARGS, "--events", str(self.events_file), *extra],
                    env=env, stdout=log, stderr=subprocess.STDOUT,
                ))  # fmt: skip
        return nodes

    def wait(self, nodes: list[subprocess.Popen]) -> list[int]:
        try:
            return [node.wait(timeout=240) for node in nodes]
        except subprocess.TimeoutExpired:
            for node in nodes:
                node.kill()
                node.wait()
            raise AssertionError(f"the nodes did not finish:\n{self.log()}") from None


def final_model(run: Run) -> dict:
    return torch.load(run.checkpoints / f"ckpt-{STEPS:08d}.pt", map_location="cpu")["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Run:
    run = Run(tmp_path_factory.mktemp("uninterrupted"))
    assert run.wait(run.start_nodes()) == [0, 0], run.log()
    return run


def test_both_ranks_stop_after_the_same_step_on_sigterm_and_resume_to_an_uninterrupted_run_s_model(
    tmp_path, uninterrupted
):
    stopped = Run(tmp_path / "stopped")
    nodes = stopped.start_nodes("--step-sleep", "0.2")
    wait_for(lambda: stopped.events("checkpoint") or any(n.poll() is not None for n in nodes),
             "rank 0's first interval checkpoint", interval=0.1)  # fmt: skip
    # As a preemption's SIGTERM to each node's process group reaches its torchrun, which forwards it
    # to its rank; node 0's only once rank 1 stopped: rank 0 must have stopped after the same step.
    nodes[1].send_signal(signal.SIGTERM)
    wait_for(lambda: stopped.events("sigterm") or nodes[1].poll() is not None, "rank 1 to stop", interval=0.1)
    nodes[0].send_signal(signal.SIGTERM)
    # torchrun exits 1 itself (a SignalException, or its rank's failure): the ranks' codes are in their events.
    assert all(code != 0 for code in stopped.wait(nodes)), stopped.log()

    exits = stopped.events("exit")
    assert [(e["rank"], e["code"]) for e in exits] == [(0, 143), (1, 143)], stopped.log()
    step = exits[0]["step"]
    assert exits[1]["step"] == step and 10 <= step < STEPS, exits
    sigterm_checkpoints = [e for e in stopped.events("checkpoint") if e["reason"] == "sigterm"]
    assert [(e["rank"], e["step"]) for e in sigterm_checkpoints] == [(0, step)], "one checkpoint, rank 0's"
    assert {e["rank"] for e in stopped.events("checkpoint")} == {0}, "only rank 0 writes checkpoints"
    newest = sorted(stopped.checkpoints.glob("ckpt-*.pt"))[-1]
    assert newest.name == f"ckpt-{step:08d}.pt"

    resumed = Run(tmp_path / "resumed")
    assert resumed.wait(resumed.start_nodes(resume_from=str(newest))) == [0, 0], resumed.log()
    assert [(s["rank"], s["start_step"]) for s in resumed.events("start")] == [(0, step), (1, step)]
    ends = [(e["step"], e["loss"]) for e in resumed.events("exit")]
    expected = [(STEPS, e["loss"]) for e in uninterrupted.events("exit")]
    # Bitwise: the batches follow from (seed, step), the checkpoint holds the model and Adam's state
    # exactly, and gloo's sum of two ranks' gradients is the same whichever rank adds.
    assert ends == expected, (ends, expected)
    model, reference = final_model(resumed), final_model(uninterrupted)
    assert model.keys() == reference.keys()
    assert all(torch.equal(model[name], reference[name]) for name in model), "the same final parameters"


def test_the_data_parallel_run_trains_the_model_one_process_trains_on_the_whole_batch(tmp_path, uninterrupted):
    """Up to the order of float additions: each rank's gradient is its half's mean, DDP averages them."""
    single = Run(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), *TRAIN_ARGS, "--events", str(single.events_file)],
        env={**os.environ, "QUOTA_CHECKPOINT_DIR": str(single.checkpoints)}, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (alone,) = single.events("exit")
    assert "rank" not in alone, "one process emits what it always did"
    assert [e["loss"] for e in uninterrupted.events("exit")] == [pytest.approx(alone["loss"], rel=1e-4)] * 2
    model, reference = final_model(uninterrupted), final_model(single)
    assert all(torch.allclose(model[name], reference[name], rtol=1e-4, atol=1e-5) for name in model)


def load_train_mlp():
    spec = importlib.util.spec_from_file_location("train_mlp", TRAIN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_rank_trains_on_its_own_slice_of_the_step_s_batch(monkeypatch):
    train_mlp = load_train_mlp()
    args = train_mlp.parse_args(["--batch-size", "8", "--features", "4"])
    teacher = train_mlp.make_model(args.features, 16)
    whole = train_mlp.batch(5, args, teacher, torch.device("cpu"), train_mlp.Ranks())
    monkeypatch.setenv("WORLD_SIZE", "2")
    slices = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        slices.append(train_mlp.batch(5, args, teacher, torch.device("cpu"), train_mlp.Ranks()))
    for i in (0, 1):  # x, then y
        assert [s[i].shape[0] for s in slices] == [4, 4]
        assert torch.equal(torch.cat([s[i] for s in slices]), whole[i])


def test_a_world_without_ranks_is_refused_naming_torchrun(monkeypatch):
    """A gang's node that runs the script itself, not through torchrun: WORLD_SIZE, no RANK."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="WORLD_SIZE=2 but RANK is not set: start this script with torchrun"):
        load_train_mlp().main(["--steps", "1"])


def test_a_batch_that_the_ranks_cannot_share_evenly_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit, match="--batch-size: 6 is not a multiple of WORLD_SIZE=4"):
        load_train_mlp().main(["--batch-size", "6"])
