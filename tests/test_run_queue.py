"""The experiment drivers' job queue: finished jobs are skipped, checkpointed ones resumed, the limit holds."""
import json
import sys
from pathlib import Path

from experiments.run_queue import Job, run_jobs

# A job: log its start and end (wall clock) to events.jsonl, then write its done file.
SCRIPT = """
import json, sys, time
from pathlib import Path
run, mode, events = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(events, "a") as f: f.write(json.dumps({"run": run.name, "mode": mode, "at": time.time(), "edge": "start"}) + "\\n")
time.sleep(0.3)
with open(events, "a") as f: f.write(json.dumps({"run": run.name, "mode": mode, "at": time.time(), "edge": "end"}) + "\\n")
(run / "summary.json").write_text("{}")
"""


def job(root: Path, name: str, events: Path) -> Job:
    run = root / name
    command = [sys.executable, "-c", SCRIPT, str(run), "{mode}", str(events)]
    start = [part.replace("{mode}", "start") for part in command]
    return Job(name, run, start, resume=[part.replace("{mode}", "resume") for part in command])


def concurrency(log: list[dict]) -> int:
    """The most jobs running at once in an events log."""
    running, most = 0, 0
    for event in sorted(log, key=lambda e: (e["at"], e["edge"] == "start")):  # an end before a start at a tie
        running += 1 if event["edge"] == "start" else -1
        most = max(most, running)
    return most


def test_done_jobs_are_skipped_partial_ones_resumed_and_at_most_parallel_run(tmp_path):
    events = tmp_path / "events.jsonl"
    jobs = [job(tmp_path, name, events) for name in ("a", "b", "c", "d")]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")  # finished earlier
    (tmp_path / "c" / "checkpoints" / "step-00000001").mkdir(parents=True)  # stopped part-way
    assert [j.status() for j in jobs] == ["new", "done", "partial", "new"]

    done = run_jobs(jobs, tmp_path, parallel=2, poll=0.05)

    assert done == ["a", "b", "c", "d"]
    log = [json.loads(line) for line in events.read_text().splitlines()]
    assert sorted({e["run"] for e in log}) == ["a", "c", "d"]  # b was not run again
    assert {e["run"]: e["mode"] for e in log} == {"a": "start", "c": "resume", "d": "start"}
    assert concurrency(log) <= 2
    assert not list(tmp_path.rglob("running.pid"))  # every finished job's marker is removed
    assert (tmp_path / "a.log").read_text().startswith("\n$ ")  # each job's command heads its log


def test_two_drivers_on_one_folder_keep_the_limit_and_never_run_a_job_twice(tmp_path):
    """Drivers check the folder's running jobs and launch under one lock, so two never both take the last slot."""
    import threading

    events = tmp_path / "events.jsonl"
    names = [f"j{i}" for i in range(6)]
    mine = [job(tmp_path, name, events) for name in names[:4]]
    theirs = [job(tmp_path, name, events) for name in names[2:]]  # j2 and j3 are in both drivers' lists
    drivers = [threading.Thread(target=run_jobs, args=(jobs, tmp_path, 1), kwargs={"poll": 0.01})
               for jobs in (mine, theirs)]
    for driver in drivers:
        driver.start()
    for driver in drivers:
        driver.join()
    log = [json.loads(line) for line in events.read_text().splitlines()]
    assert sorted(e["run"] for e in log if e["edge"] == "start") == names  # each job ran exactly once
    assert concurrency(log) == 1


def test_a_running_pid_left_by_a_dead_machine_and_reused_by_another_process_does_not_block_the_run(tmp_path):
    """After a reboot, running.pid may name a live process that has nothing to do with the run (here: pytest);
    the job must still be resumed, not skipped as 'running'."""
    import os
    import subprocess

    events = tmp_path / "events.jsonl"
    stopped = job(tmp_path, "stopped", events)
    (stopped.run_dir / "checkpoints" / "step-00000001").mkdir(parents=True)
    (stopped.run_dir / "running.pid").write_text(str(os.getpid()))
    assert stopped.status() == "partial"

    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(stopped.run_dir)])
    try:  # a live process whose command names the folder is a run in progress
        (stopped.run_dir / "running.pid").write_text(str(mine.pid))
        assert stopped.status() == "running"
    finally:
        mine.kill()
        mine.wait()
    (stopped.run_dir / "running.pid").write_text(str(os.getpid()))

    assert run_jobs([stopped], tmp_path, parallel=1, poll=0.05) == ["stopped"]
    assert [json.loads(line)["mode"] for line in events.read_text().splitlines()] == ["resume", "resume"]
