"""One DQN run on a MinAtar game with uniform or prioritized replay, resumable at every chunk (issue 22, measurement 2).

    python -m experiments.minatar_dqn --game breakout --arm per --seed 0 --run-dir runs/minatar/breakout_per_seed0

One run is one (game, arm, seed). The agent is the MinAtar paper's DQN network (one 3x3 convolution with 16
channels, 128 hidden units) trained with Dopamine's MinAtar settings of "Revisiting Rainbow" (Adam, an update
every 4 frames, target copied every 1,000 frames); `results/minatar/minatar_protocol.md` lists every setting and where it
differs from both papers. The replay memory is replayloader's `ReplayBuffer` with the PER strategy
(`by_name("per")`: new transitions at the largest priority so far, priorities set to |TD| + eps, FIFO eviction);
the two arms differ only in alpha (``uniform``: 0, ``per``: 0.6). The buffer samples with beta = 1, i.e. the ratio
P_min / P_i, and the loss weights it by that ratio to the power of the annealed beta (0.4 -> 1), which is PER's
(P_min / P_i)^beta without rebuilding the buffer when beta changes.

Every ``--chunk`` frames the run writes ``RUN/checkpoints/step-F/`` (networks, optimizer, the buffer through
`replayloader.save_state`, both environments with their RNGs, the agent's numpy RNG, torch's RNG, counters and
the records so far) atomically, keeping only the latest; started again, it resumes from there and continues
exactly as if never stopped (tested). When the last frame is done it writes ``RUN/records.jsonl.gz`` (one JSON
line per training episode and per evaluation) and ``RUN/summary.json``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from replayloader import LinearSchedule, ReplayBuffer, load_state, save_state  # noqa: E402
from replayloader.state.atomic import atomic_directory, atomic_write_bytes, atomic_write_text  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402

ARMS = {"uniform": 0.0, "per": 0.6}  # arm -> alpha; nothing else differs between the arms
GAMES = ("breakout", "space_invaders", "asterix", "freeway", "seaquest")


@dataclass(frozen=True)
class Config:
    """Everything a run depends on besides (game, arm, seed); recorded in its first line."""

    frames: int = 1_500_000
    chunk: int = 50_000  # frames between checkpoints
    batch: int = 32
    capacity: int = 100_000
    replay_start: int = 5_000  # frames of uniformly random play before learning starts
    update_every: int = 4  # frames per gradient update
    target_every: int = 1_000  # frames per target-network copy
    gamma: float = 0.99
    lr: float = 2.5e-4
    adam_eps: float = 3.125e-4
    eps_start: float = 1.0
    eps_end: float = 0.01
    eps_frames: int = 100_000  # linear decay of the training epsilon after replay_start
    priority_eps: float = 1e-3  # priority = |TD| + priority_eps
    beta_start: float = 0.4  # importance-weight exponent, annealed linearly to 1 over the run's updates
    sticky: float = 0.1  # MinAtar's sticky-action probability
    eval_every: int = 50_000  # frames between evaluations
    eval_episodes: int = 5
    eval_eps: float = 0.001
    eval_max_frames: int = 20_000  # cap on the frames of one evaluation (all its episodes)


# ------------------------------------------------------------------------------------------------ the agent
class QNetwork(nn.Module):
    """Young & Tian 2019's MinAtar DQN: conv 3x3 with 16 channels, 128 hidden units, one output per action."""

    def __init__(self, channels: int, actions: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 16, kernel_size=3, stride=1)
        self.hidden = nn.Linear(8 * 8 * 16, 128)
        self.out = nn.Linear(128, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        return self.out(F.relu(self.hidden(x.flatten(1))))


def make_env(game: str, seed: int, sticky: float):
    from minatar import Environment

    env = Environment(game, sticky_action_prob=sticky)
    env.seed(seed)
    env.reset()
    return env


def observe(env) -> np.ndarray:
    """The 10x10xC boolean frame as C x 10 x 10 uint8 (the network's input layout)."""
    return np.ascontiguousarray(env.state().transpose(2, 0, 1), dtype=np.uint8)


def pack(obs: np.ndarray) -> np.ndarray:
    """A frame as its bits (C*100/8 bytes): the buffer and its checkpoints are 8x smaller than uint8 frames."""
    return np.packbits(obs.reshape(-1))


def unpack(packed: np.ndarray, channels: int) -> torch.Tensor:
    """A (B, bytes) batch of packed frames as (B, C, 10, 10) floats."""
    bits = np.unpackbits(packed, axis=1, count=channels * 100)
    return torch.from_numpy(bits.reshape(-1, channels, 10, 10)).float()


def td_loss(q: nn.Module, target: nn.Module, data: dict, is_weights: torch.Tensor, gamma: float):
    """DQN's Huber loss weighted by the importance weights; returns (loss, |TD| per transition)."""
    with torch.no_grad():
        y = data["reward"] + gamma * (1 - data["done"]) * target(data["next_obs"]).max(1).values
    predicted = q(data["obs"]).gather(1, data["action"][:, None]).squeeze(1)
    loss = (is_weights * F.smooth_l1_loss(predicted, y, reduction="none")).mean()
    return loss, (y - predicted).detach().abs()


def as_tensors(data: dict, channels: int) -> dict:
    return {"obs": unpack(data["obs"], channels), "next_obs": unpack(data["next_obs"], channels),
            "action": torch.from_numpy(data["action"]), "reward": torch.from_numpy(data["reward"]),
            "done": torch.from_numpy(data["done"])}


@dataclass
class Run:
    """The whole mutable state of a run: what a checkpoint holds."""

    cfg: Config
    game: str
    arm: str
    seed: int
    env: object
    eval_env: object
    q: QNetwork
    target: QNetwork
    optimizer: torch.optim.Optimizer
    buffer: ReplayBuffer
    rng: np.random.Generator
    frame: int = 0
    updates: int = 0
    episode: int = 0
    episode_return: float = 0.0
    episode_frames: int = 0
    cpu_s: float = 0.0  # training time so far (evaluations not counted), folded in by pause()
    wall_s: float = 0.0
    records: list = field(default_factory=list)
    _marks: tuple | None = None  # (process time, wall time) when the clock last started

    def start_clock(self) -> None:
        self._marks = (time.process_time(), time.perf_counter())

    def pause_clock(self) -> None:
        self.cpu_s, self.wall_s = self.clock()
        self._marks = None

    def clock(self) -> tuple[float, float]:
        """Training CPU and wall seconds so far, the running stretch included."""
        if self._marks is None:
            return self.cpu_s, self.wall_s
        return (self.cpu_s + time.process_time() - self._marks[0], self.wall_s + time.perf_counter() - self._marks[1])

    def stamp(self) -> dict:
        cpu, wall = self.clock()
        return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}

    @property
    def beta(self) -> LinearSchedule:
        return LinearSchedule(self.cfg.beta_start, 1.0, max(1, (self.cfg.frames - self.cfg.replay_start)
                                                             // self.cfg.update_every))

    def epsilon(self) -> float:
        cfg = self.cfg
        if self.frame < cfg.replay_start:
            return 1.0
        done = min((self.frame - cfg.replay_start) / cfg.eps_frames, 1.0)
        return cfg.eps_start + (cfg.eps_end - cfg.eps_start) * done

    def act(self, obs: np.ndarray, eps: float) -> int:
        if self.rng.random() < eps:
            return int(self.rng.integers(self.q.out.out_features))
        with torch.no_grad():
            return int(self.q(torch.from_numpy(obs)[None].float()).argmax())

    def learn(self) -> float:
        """One update on a sampled batch; the new priorities |TD| + eps go back to the buffer."""
        sample = self.buffer.sample(self.cfg.batch)
        is_weights = torch.from_numpy(sample.weights ** self.beta(self.updates)).float()
        loss, td = td_loss(self.q, self.target, as_tensors(sample.data, self.q.conv.in_channels), is_weights, self.cfg.gamma)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.buffer.feedback(sample.ids, weight=td.numpy().astype(np.float64) + self.cfg.priority_eps)
        self.updates += 1
        return loss.item()

    def step(self) -> None:
        """One frame: act, store the transition, learn and copy the target on their schedules."""
        cfg = self.cfg
        obs = observe(self.env)
        action = self.act(obs, self.epsilon())
        reward, done = self.env.act(action)
        self.buffer.add({"obs": pack(obs)[None], "action": np.array([action]),
                         "reward": np.array([reward], np.float32), "next_obs": pack(observe(self.env))[None],
                         "done": np.array([float(done)], np.float32)})
        self.frame += 1
        self.episode_return += reward
        self.episode_frames += 1
        if done:
            self.records.append({"kind": "episode", "frame": self.frame, "episode": self.episode,
                                 "return": self.episode_return, "length": self.episode_frames, **self.stamp()})
            self.episode += 1
            self.episode_return, self.episode_frames = 0.0, 0
            self.env.reset()
        if self.frame >= cfg.replay_start and self.frame % cfg.update_every == 0:
            self.learn()
        if self.frame % cfg.target_every == 0:
            self.target.load_state_dict(self.q.state_dict())

    def evaluate(self) -> None:
        """A few near-greedy episodes on the evaluation environment (its own seed), at most eval_max_frames."""
        returns, frames = [], 0
        while len(returns) < self.cfg.eval_episodes and frames < self.cfg.eval_max_frames:
            self.eval_env.reset()
            total, done = 0.0, False
            while not done and frames < self.cfg.eval_max_frames:
                reward, done = self.eval_env.act(self.act(observe(self.eval_env), self.cfg.eval_eps))
                total += reward
                frames += 1
            if done:
                returns.append(total)
        self.records.append({"kind": "eval", "frame": self.frame, "returns": returns, "frames": frames,
                             **self.stamp()})


def new_run(cfg: Config, game: str, arm: str, seed: int) -> Run:
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {sorted(ARMS)}, got {arm!r}")
    if game not in GAMES:
        raise ValueError(f"game must be one of {GAMES}, got {game!r}")
    torch.manual_seed(seed)
    env = make_env(game, seed, cfg.sticky)
    q = QNetwork(env.state_shape()[2], env.num_actions())
    target = QNetwork(env.state_shape()[2], env.num_actions())
    target.load_state_dict(q.state_dict())
    buffer = ReplayBuffer(cfg.capacity, alpha=ARMS[arm], beta=1.0, strategy=by_name("per"), seed=seed)
    return Run(cfg, game, arm, seed, env, make_env(game, seed + 10_000, cfg.sticky), q, target,
               torch.optim.Adam(q.parameters(), lr=cfg.lr, eps=cfg.adam_eps), buffer, np.random.default_rng(seed))


# ------------------------------------------------------------------------------------------------ checkpoints
COUNTERS = ("frame", "updates", "episode", "episode_return", "episode_frames", "cpu_s", "wall_s")


def save_checkpoint(run: Run, run_dir: Path) -> None:
    """Write checkpoints/step-F atomically, then drop the older ones."""
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    with atomic_directory(checkpoints / f"step-{run.frame:09d}") as tmp:
        save_state(run.buffer.state_dict(), tmp / "buffer.npz")
        torch.save({"q": run.q.state_dict(), "target": run.target.state_dict(),
                    "optimizer": run.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                    "rng": run.rng.bit_generator.state, "envs": pickle.dumps((run.env, run.eval_env)),
                    "counters": {k: getattr(run, k) for k in COUNTERS}, "records": run.records,
                    "config": asdict(run.cfg), "key": [run.game, run.arm, run.seed]}, tmp / "agent.pt")
    for old in checkpoints.glob("step-*"):
        if old.name != f"step-{run.frame:09d}":
            shutil.rmtree(old)


def latest_checkpoint(run_dir: Path) -> Path | None:
    steps = sorted((run_dir / "checkpoints").glob("step-[0-9]*[0-9]"))
    return steps[-1] if steps else None


def load_checkpoint(run: Run, path: Path) -> None:
    agent = torch.load(path / "agent.pt", weights_only=False)
    if agent["config"] != asdict(run.cfg) or agent["key"] != [run.game, run.arm, run.seed]:
        raise ValueError(f"checkpoint {path} is of another run: {agent['key']} {agent['config']}")
    run.buffer.load_state_dict(load_state(path / "buffer.npz"))
    run.q.load_state_dict(agent["q"])
    run.target.load_state_dict(agent["target"])
    run.optimizer.load_state_dict(agent["optimizer"])
    torch.set_rng_state(agent["torch_rng"])
    run.rng.bit_generator.state = agent["rng"]
    run.env, run.eval_env = pickle.loads(agent["envs"])
    for key, value in agent["counters"].items():
        setattr(run, key, value)
    run.records = agent["records"]


# ------------------------------------------------------------------------------------------------ one run
def train(cfg: Config, game: str, arm: str, seed: int, run_dir: Path, max_chunks: int | None = None) -> Run:
    """Run (or resume) to cfg.frames, checkpointing every chunk; ``max_chunks`` stops early (for tests)."""
    torch.set_num_threads(1)
    run = new_run(cfg, game, arm, seed)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        load_checkpoint(run, checkpoint)
    chunks = 0
    while run.frame < cfg.frames and (max_chunks is None or chunks < max_chunks):
        end = min(run.frame + cfg.chunk, cfg.frames)
        run.start_clock()
        while run.frame < end:
            run.step()
            if run.frame % cfg.eval_every == 0 or run.frame == cfg.frames:
                run.pause_clock()  # evaluations are not training time
                run.evaluate()
                run.start_clock()
        run.pause_clock()
        save_checkpoint(run, run_dir)
        chunks += 1
    if run.frame >= cfg.frames and not (run_dir / "summary.json").exists():
        finish(run, run_dir)
    return run


def finish(run: Run, run_dir: Path) -> None:
    head = {"kind": "run", "game": run.game, "arm": run.arm, "seed": run.seed, "config": asdict(run.cfg),
            "alpha": ARMS[run.arm], "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "machine": "2-core CPU, no GPU (shared)", "frames": run.frame, "updates": run.updates,
            "episodes": run.episode, "cpu_s": round(run.cpu_s, 1), "wall_s": round(run.wall_s, 1)}
    key = {"game": run.game, "arm": run.arm, "seed": run.seed}
    lines = [json.dumps(head)] + [json.dumps({**key, **r}) for r in run.records]
    atomic_write_bytes(run_dir / "records.jsonl.gz", gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    atomic_write_text(run_dir / "summary.json", json.dumps(head, indent=1))


def run_name(game: str, arm: str, seed: int) -> str:
    return f"{game}_{arm}_seed{seed}"


def config_flags(cfg: Config) -> list[str]:
    """The command-line flags that rebuild ``cfg`` (the driver passes them to every run)."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in asdict(cfg).items()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game", choices=GAMES, required=True)
    p.add_argument("--arm", choices=sorted(ARMS), required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    for name, value in asdict(Config()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    return p


def main(argv: list[str] | None = None) -> None:
    args = vars(parser().parse_args(argv))
    game, arm, seed, run_dir = (args.pop(k) for k in ("game", "arm", "seed", "run_dir"))
    run = train(Config(**args), game, arm, seed, run_dir)
    print(f"{run_name(game, arm, seed)}: {run.frame} frames, {run.episode} episodes, {run.cpu_s:.0f} CPU s", flush=True)


if __name__ == "__main__":
    main()
